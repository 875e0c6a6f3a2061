#!/usr/bin/env bash
# sandboxrun's main job on a fresh machine with Python 3.11+: installs sandboxrun into .venv,
# builds the sandbox image offline when a Docker engine is reachable (reused when present), and
# runs the sample workspace's test suite in a sandbox with the best backend available here.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# Without Docker the local backends isolate with bubblewrap (namespaces); install it here.
if ! command -v bwrap >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e .
if docker info >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && ! command -v debootstrap >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  fi
  { .venv/bin/sandboxrun image bootstrap && .venv/bin/sandboxrun image build; } >/dev/null \
    || echo "warning: cannot build the sandbox image; falling back to a local backend" >&2
fi
.venv/bin/sandboxrun doctor
exec .venv/bin/sandboxrun run -w examples/sample-workspace --timeout 60 -- \
  python3 -B -m unittest -v
