#!/usr/bin/env bash
# sandboxrun's main job on a fresh machine with Python 3.11+: installs sandboxrun into .venv and
# runs the sample workspace's test suite in a sandbox, with the best backend available here.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e .
.venv/bin/sandboxrun doctor
exec .venv/bin/sandboxrun run -w examples/sample-workspace --timeout 60 -- \
  python3 -B -m unittest -v
