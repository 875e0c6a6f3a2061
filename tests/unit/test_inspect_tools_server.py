"""``integrations.inspect.tools_server``: which exec is inspect's ``start-server``, and how its
status line is read back (a forged or partial line is not the status)."""

from __future__ import annotations

import pytest

from sandboxrun.integrations.inspect.tools_server import (
    MARK,
    is_start_server,
    server_argv,
    status_of,
)

CLI = "/var/tmp/.da7be258e003d428/inspect-sandbox-tools"


@pytest.mark.parametrize(
    ("cmd", "expected"),
    [
        ([CLI, "start-server"], True),
        (["inspect-sandbox-tools", "start-server"], True),
        ([CLI, "exec"], False),
        ([CLI, "start-server", "--x"], False),
        (["/bin/inspect-sandbox-tools-evil", "start-server"], False),
        (["sh", "-c", f"{CLI} start-server"], False),
        ([], False),
    ],
)
def test_only_the_tools_start_server_is_recognised(cmd: list[str], expected: bool) -> None:
    assert is_start_server(cmd) is expected


def test_the_status_line_is_found_with_its_nonce_only() -> None:
    argv, nonce = server_argv(CLI)
    assert argv[:2] == ["/bin/sh", "-c"] and argv[3:] == [CLI, MARK, nonce]
    assert status_of(b"", nonce) is None
    assert status_of(f"oops\n{MARK} {nonce} 0".encode(), nonce) is None  # line not ended
    assert status_of(f"x\n{MARK} deadbeef 0\n".encode(), nonce) is None  # another nonce
    assert status_of(f"x\n{MARK} {nonce} abc\n".encode(), nonce) is None
    said = f"warn\n\n{MARK} {nonce} 0\n{MARK} {nonce} 3\n".encode()
    assert status_of(said, nonce) == (3, f"warn\n\n{MARK} {nonce} 0".encode())
    assert status_of(f"\n{MARK} {nonce} 0\n".encode(), nonce) == (0, b"")
    assert server_argv(CLI)[1] != nonce
