"""The scope watchdog of the systemd-scope backend (stdlib only; run as a script).

A scope is not tied to the process that made it: if sandboxrun is SIGKILLed, its scopes run on.
So each systemd-scope ``Sandbox`` starts this watchdog in its own session. The host writes
``+<unit>`` before it launches a scope and ``-<unit>`` once the run is over, on the watchdog's
stdin; when stdin reaches EOF (the host closed it, or died), the watchdog stops every unit still
registered (``systemctl stop --no-block``: systemd does TERM, the unit's ``TimeoutStopSec``,
KILL) and exits.

argv: ``_scope_watch.py SYSTEMCTL MODE`` (MODE: system or user).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

TYPE_CHECKING = False
if TYPE_CHECKING or __package__:  # imported as sandboxrun.supervisor.scope_watch
    from .launchwire import read_watch_line
else:  # run as a script: its wire module is next to it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from launchwire import read_watch_line


def main() -> None:
    systemctl, mode = sys.argv[1], sys.argv[2]
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(number, signal.SIG_IGN)  # only EOF ends the watch
    units: set[str] = set()
    for raw in sys.stdin.buffer:
        read = read_watch_line(raw)
        if read is None:
            continue
        sign, unit = read
        if sign == "+":
            units.add(unit)
        else:
            units.discard(unit)
    ours = sorted(u for u in units if u.startswith("sandboxrun-") and u.endswith(".scope"))
    if not ours:
        return
    prefix = [systemctl, *(["--user"] if mode == "user" else []), "--no-ask-password"]
    # --no-block: systemd itself does TERM, TimeoutStopSec (the grace), KILL for every unit
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            [*prefix, "stop", "--no-block", *ours],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
            check=False,
        )


if __name__ == "__main__":
    main()
