"""sandboxrun's own lines are safe (issue 17, findings 4 and 5): the value of a secret-shaped
``-e`` variable never appears in any byte the CLI writes (stdout, stderr, ``--json``, spill
files), error and warning text included, nor in a result or a log record of the Python API;
and no control byte of the command's (C0 but tab/newline, DEL, C1) reaches a terminal through
a line sandboxrun writes itself (errors, warnings, denial evidence, summaries, ``--dry-run``,
``--json``), on every backend."""

from __future__ import annotations

import json
import logging
import os
import re
import select
import subprocess
import sys
import tty
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxrun import Policy, Sandbox

CLI = [sys.executable, "-m", "sandboxrun"]
VALUE = "tok-SeCrEt-9876"
MARK = "[masked:API_TOKEN]"
SECRET = ["-e", f"API_TOKEN={VALUE}"]

ESC_TITLE = "\x1b]0;pwned\x07"
ESC_CLIP = "\x1b]52;c;aGk=\x07"
HOSTILE = f"{ESC_TITLE}{ESC_CLIP}\x7f\u009b31m\x08\x01"
"""A window title, a clipboard write, DEL, a C1 CSI, a backspace, ^A (none of them ends a line
for ``str.splitlines``, which picks the evidence)."""
FAKE_CURL = f"curl: (6) Could not resolve host: {HOSTILE}example.com"

FORBIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""What must not reach a terminal (checked on the text decoded as UTF-8)."""


def forbidden_in(data: bytes) -> list[str]:
    """The control characters in ``data``: C0 but tab and newline, DEL, C1 (as UTF-8), and a
    lone byte 0x80..0x9f (a C1 control to an 8-bit terminal)."""
    text = data.decode("utf-8", "surrogateescape")
    found = [repr(m.group()) for m in FORBIDDEN.finditer(text)]
    return found + [repr(c) for c in text if 0xDC80 <= ord(c) <= 0xDC9F]


def base_args(workspace: Path, backend: str) -> list[str]:
    return ["run", "-w", str(workspace), "-b", backend, "--allow-degraded", "--keep-spill"]


def run_cli(args: list[str]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*CLI, *args], capture_output=True, timeout=120, check=False)


def spilled(root: Path) -> Iterator[tuple[Path, bytes]]:
    for path in root.rglob("*"):
        if path.is_file():
            yield path, path.read_bytes()


# -- finding 4: a secret in sandboxrun's own text --------------------------------------------

LEAKS = {
    "spawn-error": ["--", f"./{VALUE}"],
    "login-warning": ["--login-shell", f"/no/such/{VALUE}", "--", "true"],
    "denial": [
        "--",
        "sh",
        "-c",
        'echo "curl: (6) Could not resolve host: $API_TOKEN.example.com" >&2; exit 6',
    ],
    "flood": ["--max-output", "64", "--", "sh", "-c", 'yes "$API_TOKEN" | head -n 2000'],
    "workdir-error": ["-C", VALUE, "--", "true"],
    "timeout-error": ["-t", VALUE, "--", "true"],
    "choice-error": ["--network", VALUE, "--", "true"],
    "dry-run": ["--dry-run", "--", "echo", VALUE],
}


@pytest.mark.parametrize("mode", ["text", "json"])
@pytest.mark.parametrize("case", sorted(LEAKS))
def test_no_byte_sandboxrun_writes_holds_the_secret(
    workspace: Path, backend: str, spill_root: Path, case: str, mode: str
) -> None:
    json_opt = ["--json"] if mode == "json" else []
    proc = run_cli([*base_args(workspace, backend), *json_opt, *SECRET, *LEAKS[case]])
    said = proc.stdout + proc.stderr
    assert VALUE.encode() not in said, said.decode(errors="replace")
    for path, data in spilled(spill_root):
        assert VALUE.encode() not in data, path
    if mode == "json" and case != "dry-run":
        json.loads(proc.stdout)  # still one valid JSON object
    if case in ("spawn-error", "denial", "dry-run"):
        assert MARK.encode() in said  # masked, not dropped


@pytest.mark.parametrize(
    ("value", "argv0"),
    [
        ("tok\\SeCrEt-9876", "./tok\\SeCrEt-9876"),  # a backslash (a repr() would double it)
        (VALUE, "./" + "a" * 188 + VALUE),  # cut by the supervisor inside the value
    ],
    ids=["backslash", "cut"],
)
def test_a_quoted_or_cut_name_holds_no_secret(
    workspace: Path, backend: str, value: str, argv0: str
) -> None:
    for opt in ([], ["--json"]):
        args = [*base_args(workspace, backend), *opt, "-e", f"API_TOKEN={value}", "--", argv0]
        proc = run_cli(args)
        said = (proc.stdout + proc.stderr).decode(errors="replace")
        assert value not in said and value.replace("\\", "\\\\") not in said, said
        assert value[:8] not in said, said  # not even the start of it
        assert MARK in said.replace("\\", ""), said


@pytest.mark.anyio
async def test_a_job_that_never_ran_is_masked(workspace: Path, backend: str) -> None:
    """A job whose task never ran its command (the sandbox closed first) still has a result:
    masked like every other."""
    policy = Policy(allow_degraded=True)
    async with Sandbox(workspace, backend=backend, policy=policy, env={"API_TOKEN": VALUE}) as sb:
        job = await sb.start(["echo", VALUE])
    ended = await job.wait()
    shown = ended.to_json()
    assert VALUE not in shown, shown
    assert MARK in " ".join(ended.argv), ended.argv


def test_no_mask_still_shows_the_value(workspace: Path, backend: str) -> None:
    proc = run_cli([*base_args(workspace, backend), "--no-mask", *SECRET, "--", f"./{VALUE}"])
    assert VALUE.encode() in proc.stderr


@pytest.mark.anyio
async def test_python_api_results_and_logs_are_masked(
    workspace: Path, backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    policy = Policy(allow_degraded=True)
    secret = {"API_TOKEN": VALUE}
    with caplog.at_level(logging.DEBUG, logger="sandboxrun"):
        async with Sandbox(workspace, backend=backend, policy=policy, env=secret) as sb:
            spawn = await sb.exec([f"./{VALUE}"])
            job = await sb.start([f"./{VALUE}-job"])
            ended = await job.wait()
            per_exec = await sb.exec(["./hunter2-password"], env={"DB_PASSWORD": "hunter2"})
            logging.getLogger("sandboxrun").warning("a message quoting %s", VALUE)
        login = f"/no/such/{VALUE}"
        async with Sandbox(
            workspace, backend=backend, policy=policy, env=secret, login_shell=login
        ) as sb:
            warned = await sb.exec(["true"])
    for result in (spawn, ended, per_exec, warned):
        shown = result.to_json()
        assert VALUE not in shown, shown
        assert "hunter2" not in shown
    assert spawn.status == "spawn_error" and MARK in (spawn.error or "")
    assert ended.status == "spawn_error" and MARK in (ended.error or "")
    assert "[masked:DB_PASSWORD]" in (per_exec.error or "")
    assert any("login-shell environment snapshot failed" in w for w in warned.warnings)
    logged = "\n".join(caplog.text.splitlines() + [r.getMessage() for r in caplog.records])
    assert VALUE not in logged, logged
    assert f"a message quoting {MARK}" in logged


# -- finding 5: control bytes in sandboxrun's own lines -----------------------------------------


def on_pty(args: list[str], *, stdout_too: bool) -> tuple[int, bytes, bytes]:
    """The CLI with stderr (and with ``stdout_too`` stdout) on a terminal in raw mode (no
    ``\\n`` -> ``\\r\\n``): what reached the terminal, and what reached a stdout pipe."""
    master, slave = os.openpty()
    tty.setraw(slave)
    proc = subprocess.Popen(
        [*CLI, *args],
        stdin=subprocess.DEVNULL,
        stdout=slave if stdout_too else subprocess.PIPE,
        stderr=slave,
    )
    os.close(slave)
    terminal = bytearray()
    piped = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 120)
            if not ready:
                raise TimeoutError("the CLI wrote nothing for 120 s")
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not chunk:
                break
            terminal += chunk
        if proc.stdout is not None:
            piped = proc.stdout.read()
        code = proc.wait(timeout=60)
    finally:
        proc.kill()
        os.close(master)
        if proc.stdout is not None:
            proc.stdout.close()
    return code, bytes(terminal), piped


def shows(text: bytes, part: str) -> bool:
    return part.encode() in text


HOSTILE_SH = "printf '%s\\n' \"$1\""


def test_denial_evidence_on_a_terminal_carries_no_escape(workspace: Path, backend: str) -> None:
    # the evidence comes from stdout (a pipe here): on the terminal only sandboxrun's lines
    args = [*base_args(workspace, backend), "--", "sh", "-c", f"{HOSTILE_SH}; exit 6", "sh",
            FAKE_CURL]  # fmt: skip
    code, terminal, piped = on_pty(args, stdout_too=False)
    assert code == 6
    assert shows(terminal, "sandboxrun: denied:"), terminal
    assert forbidden_in(terminal) == [], terminal
    assert shows(terminal, "^[]0;pwned^G^[]52;c;aGk=^G^?<U+9B>31m^H^A"), terminal
    assert FAKE_CURL.encode() in piped  # the command's own output to a pipe is its bytes


def test_everything_on_a_terminal_carries_no_escape(workspace: Path, backend: str) -> None:
    """stdout and stderr both on the terminal: the live output and every line of sandboxrun."""
    script = f"{HOSTILE_SH}; {HOSTILE_SH} >&2; exit 6"
    args = [*base_args(workspace, backend), "--", "sh", "-c", script, "sh", FAKE_CURL]
    code, terminal, _ = on_pty(args, stdout_too=True)
    assert code == 6
    assert shows(terminal, "sandboxrun: denied:"), terminal
    assert forbidden_in(terminal) == [], terminal


@pytest.mark.parametrize(
    "case",
    [
        "login-warning",
        "spawn-error",
        "dry-run",
        "json",
        "workdir-error",
        "choice-error",
        "odd-byte",
    ],
)
def test_other_lines_on_a_terminal_carry_no_escape(
    workspace: Path, backend: str, case: str
) -> None:
    args = {
        "login-warning": ["--login-shell", f"/no/such{HOSTILE}", "--", "true"],
        "spawn-error": ["--", f"./x{HOSTILE}"],
        "dry-run": ["--dry-run", "--", "echo", HOSTILE],
        "json": ["--json", "--", "sh", "-c", f"{HOSTILE_SH} >&2; exit 6", "sh", FAKE_CURL],
        "workdir-error": ["-C", f"x{HOSTILE}", "--", "true"],
        "choice-error": ["--network", f"x{HOSTILE}", "--", "true"],
        "odd-byte": ["-C", os.fsdecode(b"x\x9b\x85"), "--", "true"],  # bytes, not UTF-8
    }[case]
    code, terminal, _ = on_pty([*base_args(workspace, backend), *args], stdout_too=True)
    assert terminal, code
    assert forbidden_in(terminal) == [], terminal
    if case == "login-warning":
        assert shows(terminal, "sandboxrun: warning: the login-shell environment snapshot")
    if case == "json":  # still one valid object, which holds the command's bytes exactly
        data = json.loads(terminal.decode().splitlines()[0])
        assert data["denial"]["evidence"] == FAKE_CURL
        assert data["stderr"] == FAKE_CURL + "\n"


def test_own_lines_to_a_pipe_are_sanitized_too(workspace: Path, backend: str) -> None:
    """Not a terminal (a log file, a CI console read later with ``less -R``): sandboxrun's own
    lines are still neutralized; the command's own output passes as its bytes; ``--json``
    stays valid and exact."""
    command = ["--", "sh", "-c", f"{HOSTILE_SH} >&2; exit 6", "sh", FAKE_CURL]
    proc = run_cli([*base_args(workspace, backend), *command])
    assert proc.returncode == 6
    own = [line for line in proc.stderr.split(b"\n") if line.startswith(b"sandboxrun:")]
    assert own and all(forbidden_in(line) == [] for line in own), proc.stderr
    assert proc.stderr.startswith(FAKE_CURL.encode() + b"\n")  # the live line, as it came
    js = run_cli([*base_args(workspace, backend), "--json", *command])
    data = json.loads(js.stdout)
    assert data["denial"]["evidence"] == FAKE_CURL
    assert forbidden_in(js.stdout.rstrip(b"\n")) == []  # escaped, not raw
