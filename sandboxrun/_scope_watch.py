"""The scope watchdog of the systemd-scope backend (stdlib only; run as a script).

A scope is not tied to the process that made it: if sandboxrun is SIGKILLed, its scopes run on.
So each systemd-scope ``Sandbox`` starts this watchdog in its own session. The host writes
``+<unit>`` before it launches a scope and ``-<unit>`` once the run is over, on the watchdog's
stdin; when stdin reaches EOF (the host closed it, or died), the watchdog stops every unit still
registered (``systemctl stop``: TERM, the unit's ``TimeoutStopSec``, KILL) and exits.

argv: ``_scope_watch.py SYSTEMCTL MODE`` (MODE: system or user).
"""

from __future__ import annotations

import signal
import subprocess
import sys


def main() -> None:
    systemctl, mode = sys.argv[1], sys.argv[2]
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(number, signal.SIG_IGN)  # only EOF ends the watch
    units: set[str] = set()
    for raw in sys.stdin.buffer:
        line = raw.decode(errors="replace").strip()
        if line.startswith("+"):
            units.add(line[1:])
        elif line.startswith("-"):
            units.discard(line[1:])
    prefix = [systemctl, *(["--user"] if mode == "user" else []), "--no-ask-password"]
    for unit in sorted(units):
        if not (unit.startswith("sandboxrun-") and unit.endswith(".scope")):
            continue
        try:
            subprocess.run(
                [*prefix, "stop", unit],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=120,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            continue


if __name__ == "__main__":
    main()
