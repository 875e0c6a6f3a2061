"""The pure parts of detached sandboxes: exec's words, the wire format, names and the runtime
directory's rule."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sandboxrun.cli.exec_args import ExecArgs, parse
from sandboxrun.detached import place, protocol
from sandboxrun.errors import ConfigError, InputError, NoSuchSandbox, SandboxrunError


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (["n", "true"], ExecArgs("n", ["true"])),
        (["n", "--", "ls", "-l"], ExecArgs("n", ["ls", "-l"])),
        (["--", "n", "ls"], ExecArgs("n", ["ls"])),
        (["-t", "5", "n", "ls"], ExecArgs("n", ["ls"], timeout="5")),
        (["--timeout=5m", "n", "ls"], ExecArgs("n", ["ls"], timeout="5m")),
        (["--timeout", "5m", "n", "ls"], ExecArgs("n", ["ls"], timeout="5m")),
        (["-C", "sub", "n", "pwd"], ExecArgs("n", ["pwd"], workdir="sub")),
        (["-e", "A=1", "--env", "B", "n", "env"], ExecArgs("n", ["env"], env=["A=1", "B"])),
        (["-i", "--json", "n", "cat"], ExecArgs("n", ["cat"], interactive=True, json=True)),
        (["--shell", "n", "echo $HOME"], ExecArgs("n", ["echo $HOME"], shell=True)),
        (["--idle-timeout", "1s", "n", "x"], ExecArgs("n", ["x"], idle_timeout="1s")),
        (["n", "-t", "5"], ExecArgs("n", ["-t", "5"])),  # after NAME: COMMAND's (then refused)
        (["n", "--", "--"], ExecArgs("n", ["--"])),
    ],
)
def test_exec_words_parsed_as_docker_exec(words: list[str], expected: ExecArgs) -> None:
    assert parse(words) == expected


@pytest.mark.parametrize(
    "words",
    [
        [],
        ["n"],  # no COMMAND
        ["n", "--"],
        ["-h"],
        ["--help", "n", "x"],
        ["-t"],  # a missing value
        ["-t=5", "n", "x"],  # click's reading of it differs: typer's
        ["-it", "n", "bash"],  # combined short options (docker's habit): typer explains
        ["--bogus", "n", "x"],
        ["-"],
    ],
)
def test_exec_words_typer_should_read(words: list[str]) -> None:
    assert parse(words) is None


def test_frames_round_trip_and_split_anywhere() -> None:
    frames: list[dict[str, object]] = [
        {"op": "exec", "argv": ["a", "ü"]},
        {"out": "stdout", "b64": "AAE="},
        {},
    ]
    wire = b"".join(protocol.encode(f) for f in frames)
    for cut in range(len(wire) + 1):
        lines = protocol.Lines()
        got = lines.feed(wire[:cut]) + lines.feed(wire[cut:])
        assert got == frames
        assert lines.pending == 0


def test_data_frames_carry_any_bytes() -> None:
    data = bytes(range(256)) * 3
    frame = protocol.decode(protocol.data_frame("out", "stderr", data))
    assert frame["out"] == "stderr" and protocol.data_of(frame) == data


@pytest.mark.parametrize("line", [b"not json", b"[1, 2]", b'"s"', b"\xff\xfe"])
def test_a_frame_that_is_not_an_object_is_refused(line: bytes) -> None:
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(line)


@pytest.mark.parametrize("frame", [{"out": "stdout"}, {"b64": 3}, {"b64": "***"}])
def test_a_data_frame_without_base64_is_refused(frame: dict[str, object]) -> None:
    with pytest.raises(protocol.ProtocolError):
        protocol.data_of(frame)


def test_an_endless_line_is_refused_not_buffered() -> None:
    lines = protocol.Lines()
    with pytest.raises(protocol.ProtocolError):
        for _ in range(20):
            lines.feed(b"x" * (protocol.MAX_LINE // 10))
    with pytest.raises(protocol.ProtocolError):
        protocol.encode({"b64": "x" * protocol.MAX_LINE})


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (NoSuchSandbox("no sandbox named x"), NoSuchSandbox),
        (ConfigError("bad"), ConfigError),
        (ValueError("odd"), SandboxrunError),  # not sandboxrun's: the base class
    ],
)
def test_errors_cross_the_wire_as_their_class(exc: Exception, kind: type[Exception]) -> None:
    frame = protocol.decode(protocol.error_frame(exc))
    with pytest.raises(kind, match=str(exc)) as raised:
        protocol.raise_error(frame)
    assert type(raised.value) is kind


def test_an_error_class_with_another_constructor_comes_as_the_base() -> None:
    frame = {"error": {"type": "SandboxUnavailableError", "message": "docker: gone"}}
    with pytest.raises(SandboxrunError, match="docker: gone"):
        protocol.raise_error(frame)
    protocol.raise_error({"result": "{}"})  # not an error: nothing raised


@pytest.mark.parametrize("name", ["a", "sbx-01ab", "A.b_c-9", "x" * 40])
def test_good_names(name: str) -> None:
    assert place.check_name(name) == name


@pytest.mark.parametrize("name", ["", "-a", ".a", "../x", "a/b", "x" * 41, "a b", "a\n", "é"])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(InputError, match="bad sandbox name"):
        place.check_name(name)


def test_new_names_are_valid_and_differ() -> None:
    names = {place.new_name() for _ in range(100)}
    assert len(names) == 100 and all(place.NAME.fullmatch(n) for n in names)


def test_the_runtime_dir_is_chosen_in_order() -> None:
    assert place.runtime_dir({"SANDBOXRUN_RUNTIME_DIR": "/a", "XDG_RUNTIME_DIR": "/b"}, 5) == Path(
        "/a"
    )
    assert place.runtime_dir({"XDG_RUNTIME_DIR": "/run/user/5"}, 5) == Path(
        "/run/user/5/sandboxrun"
    )
    assert place.runtime_dir({}, 5) == Path("/tmp/sandboxrun-5")


def _st(mode: int, uid: int) -> os.stat_result:
    return os.stat_result((mode, 0, 0, 1, uid, 0, 0, 0, 0, 0))


@pytest.mark.parametrize(
    ("mode", "uid", "why"),
    [
        (stat.S_IFDIR | 0o700, 7, None),
        (stat.S_IFDIR | 0o500, 7, None),
        (stat.S_IFDIR | 0o750, 7, "others have access"),
        (stat.S_IFDIR | 0o701, 7, "others have access"),
        (stat.S_IFDIR | 0o700, 8, "belongs to uid 8"),
        (stat.S_IFLNK | 0o777, 7, "symbolic link"),
        (stat.S_IFREG | 0o600, 7, "not a directory"),
    ],
)
def test_only_a_private_directory_of_ones_own_is_used(mode: int, uid: int, why: str | None) -> None:
    got = place.unsafe_reason(_st(mode, uid), 7)
    assert (got is None) if why is None else (got is not None and why in got)


def test_ensure_dir_makes_a_private_one_and_refuses_a_link(tmp_path: Path) -> None:
    made = place.ensure_dir(tmp_path / "rt")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    (tmp_path / "link").symlink_to(made)
    with pytest.raises(ConfigError, match="symbolic link"):
        place.ensure_dir(tmp_path / "link")
    assert place.ensure_dir(tmp_path / "absent", create=False) == tmp_path / "absent"
    assert not (tmp_path / "absent").exists()


def test_a_parent_others_could_swap_it_in_is_refused(tmp_path: Path) -> None:
    """The last component private is not enough: in a directory others may write (and that
    is not sticky, as /tmp is), another user can rename it away and put theirs there."""
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(
        ConfigError, match=r"open, which holds it, can be written by others \(mode 0777\)"
    ):
        place.ensure_dir(open_dir / "rt")
    open_dir.chmod(0o1777)  # sticky: only its owner may rename an entry
    assert place.ensure_dir(open_dir / "rt") == open_dir / "rt"
    if os.geteuid() == 0:  # a parent owned by another user
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 4242, 4242)
        with pytest.raises(ConfigError, match="theirs, which holds it, belongs to uid 4242"):
            place.ensure_dir(theirs / "rt")
    assert place.parent_reason(tmp_path / "x", os.getuid()) is None


def test_a_socket_path_too_long_is_refused_by_name(tmp_path: Path) -> None:
    deep = place.Place(tmp_path / ("d" * 100), "x")
    with pytest.raises(ConfigError, match="too deep for a unix socket"):
        deep.check_socket_path()
    place.Place(Path("/tmp/srt"), "x").check_socket_path()


def test_a_file_error_crosses_the_wire_with_its_class_path_and_errno() -> None:
    from sandboxrun.errors import SandboxFileNotFoundError, SandboxFileTooLargeError

    sent = protocol.decode(protocol.error_frame(SandboxFileNotFoundError("no such", "a/b", 2)))
    with pytest.raises(SandboxFileNotFoundError) as got:
        protocol.raise_error(sent)
    assert (str(got.value), got.value.path, got.value.errno) == ("no such", "a/b", 2)
    assert isinstance(got.value, FileNotFoundError)
    big = protocol.decode(protocol.error_frame(SandboxFileTooLargeError("f", 9, 4)))
    with pytest.raises(SandboxFileTooLargeError) as large:
        protocol.raise_error(big)
    assert (large.value.path, large.value.size, large.value.limit) == ("f", 9, 4)
