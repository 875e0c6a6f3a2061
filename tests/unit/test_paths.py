"""Unit tests of sandboxrun.engine.paths with real temporary directories and symlinks."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sandboxrun.engine.paths import CONTAINER_ROOT, Workspace
from sandboxrun.errors import InputError, WorkspaceError

# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """``tmp/ws`` (the workspace) with symlinks of every kind, next to ``tmp/outside``."""
    base = tmp_path.resolve()
    ws = base / "ws"
    (ws / "sub" / "deeper").mkdir(parents=True)
    (ws / "spaced dir ü 🎉" / "x").mkdir(parents=True)
    (ws / "a").mkdir()
    (ws / "file.txt").write_text("not a dir")
    (base / "outside" / "inner").mkdir(parents=True)
    (base / "ws-evil").mkdir()

    links = {
        "link_in": "sub/deeper",
        "abs_link_in": str(ws / "sub"),
        "a/up_and_in": "../sub",
        "chain1": "chain2",
        "chain2": "a/up_and_in",
        "link_out": "../outside",
        "abs_link_out": str(base / "outside"),
        "link_etc": "/etc",
        "link_root": "/",
        "link_dotdot": "..",
        "sub/deeper/far_out": "../../../outside/inner",
        "chain_out1": "chain_out2",
        "chain_out2": "link_out",
        "dangling_in": "sub/missing",
        "dangling_out": "../missing-outside",
        "link_file": "file.txt",
        "loop1": "loop2",
        "loop2": "loop1",
        "self_loop": "self_loop",
        "evil_sibling": "../ws-evil",
    }
    for name, target in links.items():
        (ws / name).symlink_to(target)
    return ws


@pytest.fixture
def ws(tree: Path) -> Workspace:
    return Workspace.open(tree)


# --------------------------------------------------------------------------- Workspace.open


def test_open_canonicalizes(tree: Path) -> None:
    workspace = Workspace.open(str(tree / "sub" / ".." / "." / ""))
    assert workspace.root == tree
    assert workspace.root.is_absolute()


def test_open_accepts_path_like(tree: Path) -> None:
    assert Workspace.open(tree).root == tree


def test_open_relative_path(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tree.parent)
    assert Workspace.open("ws").root == tree
    monkeypatch.chdir(tree / "sub")
    assert Workspace.open("..").root == tree


def test_open_via_symlink_is_canonicalized(tree: Path) -> None:
    alias = tree.parent / "alias to ws"
    alias.symlink_to(tree)
    assert Workspace.open(alias).root == tree
    assert Workspace.open(tree / "link_in").root == tree / "sub" / "deeper"


def test_open_unicode_and_spaces(tree: Path) -> None:
    path = tree / "spaced dir ü 🎉"
    assert Workspace.open(path).root == path


@pytest.mark.parametrize("path", ["/", "//", "/.", "/tmp/..", "/usr/../"])
def test_open_refuses_root(path: str) -> None:
    with pytest.raises(WorkspaceError, match="refusing '/'") as info:
        Workspace.open(path)
    assert repr(path) in str(info.value)


def test_open_refuses_a_symlink_to_root(tree: Path) -> None:
    with pytest.raises(WorkspaceError, match="refusing '/'"):
        Workspace.open(tree / "link_root")


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("missing", "does not exist"),
        ("dangling_in", "does not exist"),
        ("file.txt", "is not a directory"),
        ("link_file", "is not a directory"),
        ("file.txt/sub", "does not exist"),
        ("loop1", "symlink loop"),
        ("self_loop", "symlink loop"),
    ],
)
def test_open_refuses(tree: Path, name: str, problem: str) -> None:
    path = str(tree / name)
    with pytest.raises(WorkspaceError, match=problem) as info:
        Workspace.open(path)
    assert repr(path) in str(info.value)


@pytest.mark.parametrize("path", ["", "a\0b"])
def test_open_refuses_empty_and_nul(path: str) -> None:
    with pytest.raises(WorkspaceError):
        Workspace.open(path)


def test_workspace_error_is_an_input_error() -> None:
    assert issubclass(WorkspaceError, InputError)


def test_workspace_is_frozen_and_needs_an_absolute_root(tree: Path) -> None:
    workspace = Workspace.open(tree)
    with pytest.raises(dataclasses.FrozenInstanceError):
        workspace.root = Path("/")  # type: ignore[misc]
    with pytest.raises(WorkspaceError, match="absolute"):
        Workspace(Path("relative"))
    assert Workspace(tree) == workspace


# --------------------------------------------------------------------------- resolve_workdir


@pytest.mark.parametrize("workdir", [None, "", ".", "./", ".//.", "sub/..", "a/../sub/.."])
def test_workdir_root(ws: Workspace, workdir: str | None) -> None:
    assert ws.resolve_workdir(workdir) == ws.root


@pytest.mark.parametrize(
    ("workdir", "expected"),
    [
        ("sub", "sub"),
        ("sub/", "sub"),
        ("./sub", "sub"),
        ("sub//deeper/", "sub/deeper"),
        ("sub/deeper/..", "sub"),
        ("spaced dir ü 🎉/x", "spaced dir ü 🎉/x"),
        ("link_in", "sub/deeper"),
        ("abs_link_in", "sub"),
        ("a/up_and_in", "sub"),
        ("chain1", "sub"),
        ("chain1/deeper", "sub/deeper"),
        ("link_in/..", "sub"),  # the kernel's '..' follows the symlink first
        ("link_dotdot/ws/sub", "sub"),  # out through a symlink and back: judged by the result
        ("link_out/../ws/a", "a"),
    ],
)
def test_workdir_inside(ws: Workspace, workdir: str, expected: str) -> None:
    resolved = ws.resolve_workdir(workdir)
    assert resolved == ws.root / expected
    assert resolved.is_dir()
    assert resolved == resolved.resolve()


def test_absolute_workdir_inside(ws: Workspace) -> None:
    assert ws.resolve_workdir(str(ws.root)) == ws.root
    assert ws.resolve_workdir(str(ws.root / "sub" / "deeper")) == ws.root / "sub" / "deeper"
    assert ws.resolve_workdir(str(ws.root / "link_in")) == ws.root / "sub" / "deeper"
    assert ws.resolve_workdir(str(ws.root) + "/sub/../sub/") == ws.root / "sub"


@pytest.mark.parametrize(
    ("workdir", "expected"),
    [
        ("/workspace", ""),
        ("/workspace/", ""),
        ("/workspace/sub", "sub"),
        ("/workspace/./sub/deeper/", "sub/deeper"),
        ("/workspace/sub/../link_in", "sub/deeper"),
        ("/workspace/chain1", "sub"),
    ],
)
def test_container_style_workdir(ws: Workspace, workdir: str, expected: str) -> None:
    assert ws.resolve_workdir(workdir) == ws.root.joinpath(*expected.split("/") if expected else [])


ESCAPES = [
    "..",
    "../",
    "../..",
    "sub/../..",
    "sub/deeper/../../..",
    "../outside",
    "../missing-outside",
    "../ws",
    "../ws/sub",
    "../ws-evil",
    "./../outside/inner",
    "link_out",
    "link_out/inner",
    "abs_link_out",
    "link_etc",
    "link_root",
    "link_dotdot",
    "sub/deeper/far_out",
    "chain_out1",
    "dangling_out",
    "evil_sibling",
    "/",
    "/etc",
    "/nonexistent/at/all",
    "/workspace/../etc",
    "/workspace/..",
    "/workspace/link_out",
    "/workspace/sub/../../outside",
]


@pytest.mark.parametrize("workdir", ESCAPES)
def test_workdir_escapes(ws: Workspace, workdir: str) -> None:
    with pytest.raises(WorkspaceError) as info:
        ws.resolve_workdir(workdir)
    message = str(info.value)
    assert repr(workdir) in message or workdir.startswith("/workspace/..")
    assert "escapes the workspace" in message or "climbs out" in message


def test_absolute_paths_outside_escape(ws: Workspace) -> None:
    parent = ws.root.parent
    for path in [parent, parent / "outside", parent / "ws-evil", parent / "missing"]:
        with pytest.raises(WorkspaceError, match="escapes the workspace"):
            ws.resolve_workdir(str(path))
    # An absolute path is judged by where it resolves, like any path given to the kernel ...
    assert ws.resolve_workdir(str(ws.root / ".." / "ws" / "sub")) == ws.root / "sub"
    # ... while a relative one may not climb out lexically, even to come back in.
    with pytest.raises(WorkspaceError, match="escapes the workspace"):
        ws.resolve_workdir("../ws/sub")


def test_escape_errors_do_not_reveal_whether_outside_paths_exist(ws: Workspace) -> None:
    messages = []
    for workdir in ["../outside", "../missing-outside", "link_out", "dangling_out"]:
        with pytest.raises(WorkspaceError) as info:
            ws.resolve_workdir(workdir)
        messages.append(str(info.value).replace(repr(workdir), "W"))
    assert len(set(messages)) == 1


@pytest.mark.parametrize(
    ("workdir", "problem"),
    [
        ("missing", "does not exist"),
        ("sub/missing/deeper", "does not exist"),
        ("dangling_in", "does not exist"),
        ("/workspace/missing", "does not exist"),
        ("file.txt", "is not a directory"),
        ("link_file", "is not a directory"),
        ("/workspace/file.txt", "is not a directory"),
        ("file.txt/x", "does not exist"),
        ("loop1", "symlink loop"),
        ("self_loop", "symlink loop"),
        ("loop2/x", "symlink loop"),
    ],
)
def test_workdir_problems(ws: Workspace, workdir: str, problem: str) -> None:
    with pytest.raises(WorkspaceError, match=problem) as info:
        ws.resolve_workdir(workdir)
    assert repr(workdir) in str(info.value)


def test_absolute_missing_inside_does_not_exist(ws: Workspace) -> None:
    with pytest.raises(WorkspaceError, match="does not exist"):
        ws.resolve_workdir(str(ws.root / "missing"))


@pytest.mark.parametrize("workdir", ["a\0b", "\0", "/workspace/\0", "sub\0/.."])
def test_workdir_with_nul(ws: Workspace, workdir: str) -> None:
    with pytest.raises(WorkspaceError, match="NUL"):
        ws.resolve_workdir(workdir)


def test_workspace_deleted_after_open(tmp_path: Path) -> None:
    root = tmp_path / "gone"
    root.mkdir()
    workspace = Workspace.open(root)
    shutil.rmtree(root)
    with pytest.raises(WorkspaceError, match="does not exist"):
        workspace.resolve_workdir(None)


def test_workspace_opened_via_symlink_resolves_workdirs(tree: Path) -> None:
    alias = tree.parent / "alias"
    alias.symlink_to(tree)
    workspace = Workspace.open(alias)
    assert workspace.resolve_workdir("sub") == tree / "sub"
    assert workspace.resolve_workdir(str(tree / "sub")) == tree / "sub"
    # An absolute path through the alias resolves inside: accepted, returned canonical.
    assert workspace.resolve_workdir(str(alias / "sub")) == tree / "sub"
    assert workspace.to_container(tree / "sub") == CONTAINER_ROOT / "sub"


def test_resolve_workdir_does_not_change_cwd(ws: Workspace) -> None:
    before = Path.cwd()
    ws.resolve_workdir("sub")
    assert Path.cwd() == before
    assert os.getcwd() == str(before)


# --------------------------------------------------------------------------- pure mapping

ROOT = Path("/srv/my ws")
PURE = Workspace(ROOT)


@pytest.mark.parametrize(
    ("host", "container"),
    [
        ("/srv/my ws", "/workspace"),
        ("/srv/my ws/", "/workspace"),
        ("/srv/my ws/a/b", "/workspace/a/b"),
        ("/srv/my ws/./a//b/", "/workspace/a/b"),
        ("/srv/my ws/a/../b", "/workspace/b"),
        ("/srv/my ws/ü 🎉/'$x'", "/workspace/ü 🎉/'$x'"),
    ],
)
def test_to_container(host: str, container: str) -> None:
    assert PURE.to_container(Path(host)) == PurePosixPath(container)


@pytest.mark.parametrize(
    "host", ["/srv/my ws2", "/srv/my", "/srv", "/", "/srv/my ws/..", "/srv/my ws/../x", "rel", ""]
)
def test_to_container_outside(host: str) -> None:
    with pytest.raises(WorkspaceError):
        PURE.to_container(Path(host))


def test_to_container_nul() -> None:
    with pytest.raises(WorkspaceError, match="NUL"):
        PURE.to_container(Path("/srv/my ws/a\0"))


def test_to_container_does_not_touch_the_filesystem() -> None:
    assert not ROOT.exists()
    assert PURE.to_container(ROOT / "x") == CONTAINER_ROOT / "x"


@pytest.mark.parametrize(
    ("container", "host"),
    [
        ("/workspace", ""),
        ("/workspace/", ""),
        ("/workspace/.", ""),
        ("/workspace/a/./b/", "a/b"),
        ("/workspace/a/../b", "b"),
        ("/workspace/a/b/../..", ""),
        ("//workspace/a", "a"),
        ("/./workspace/a", "a"),
        ("/workspace/ü 🎉/'$x'", "ü 🎉/'$x'"),
        ("/workspace/...", "..."),
        ("/workspace/..a", "..a"),
    ],
)
def test_to_host(container: str, host: str) -> None:
    expected = ROOT.joinpath(*[p for p in host.split("/") if p])
    assert PURE.to_host(container) == expected
    assert PURE.to_host(PurePosixPath(container)) == expected


@pytest.mark.parametrize(
    ("container", "problem"),
    [
        ("/workspace/..", "climbs out"),
        ("/workspace/../etc", "climbs out"),
        ("/workspace/a/../../x", "climbs out"),
        ("/workspace/../workspace/a", "climbs out"),
        ("/workspace/a/../../workspace/a", "climbs out"),
        ("/workspacex", "not under"),
        ("/work", "not under"),
        ("/", "not under"),
        ("", "not under"),
        ("workspace/a", "not under"),
        ("a", "not under"),
        ("/etc/passwd", "not under"),
        ("/x/../workspace/a", "not under"),
        ("/workspace/a\0", "NUL"),
    ],
)
def test_to_host_refuses(container: str, problem: str) -> None:
    with pytest.raises(WorkspaceError, match=problem):
        PURE.to_host(container)


_segment = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="/\0"), min_size=1, max_size=12
).filter(lambda s: s not in (".", ".."))


@given(st.lists(_segment, max_size=8))
def test_property_round_trip(segments: list[str]) -> None:
    host = ROOT.joinpath(*segments)
    container = PURE.to_container(host)
    assert container == CONTAINER_ROOT.joinpath(*segments)
    assert PURE.to_host(container) == host
    assert PURE.to_host(str(container)) == host


@given(st.lists(st.one_of(_segment, st.sampled_from(["..", ".", "", "workspace"])), max_size=10))
def test_property_to_host_never_escapes(segments: list[str]) -> None:
    text = "/workspace/" + "/".join(segments)
    try:
        host = PURE.to_host(text)
    except WorkspaceError:
        assert ".." in segments
        return
    assert host == ROOT or ROOT in host.parents
    assert ".." not in host.parts
    assert PURE.to_container(host) == PurePosixPath(os.path.normpath(text))
