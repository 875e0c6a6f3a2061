"""The code that runs inside the sandbox: the supervisor (``runner``), the per-run launcher of
systemd-scope (``launcher``), the scope watchdog and the self-confinement (``confine``).

Three rules, checked by ``tests/unit/test_architecture.py``: the standard library only (it runs
with the image's ``python3``, which may be as old as 3.9, and never with sandboxrun installed);
Python 3.9 syntax; cheap imports (the launcher starts once per run). The host imports these same
files as ``sandboxrun.supervisor.*`` (one definition of each wire format for both ends).
"""

import os

HERE = os.path.dirname(os.path.abspath(__file__))
"""This directory: the files the host spawns (``runner.py``, ``launcher.py``, ``scope_watch.py``)
and docker copies into a container. Every path to them is built from here."""
PACKAGE_ROOT = os.path.dirname(HERE)
"""sandboxrun's own directory (``supervisor/`` is in it): what bubblewrap must show read-only."""
