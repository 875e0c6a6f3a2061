#!/usr/bin/env bash
# The whole test suite on a fresh machine with Python 3.11+: creates .venv, installs sandboxrun
# with its dev extras, builds the sandbox image when a Docker engine is reachable (offline, from
# the host's apt sources; reused when present), then runs ruff, mypy (strict) and pytest, and
# the systemd-scope tests inside a container booted with systemd (scripts/systemd-host.sh).
# Extra arguments go to pytest. SANDBOXRUN_REQUIRE_BACKENDS=docker,... turns a backend's
# "unavailable" into a failure instead of a skip (CI sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
  || { echo "sandboxrun needs Python 3.11 or newer ($PY is older)" >&2; exit 1; }
# The local isolation layer (process-group, systemd-scope) needs bubblewrap.
if ! command -v bwrap >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'

if docker info >/dev/null 2>&1; then
  echo "== sandbox image"
  if [ "$(id -u)" = 0 ] && ! command -v debootstrap >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  fi
  if ! { .venv/bin/sandboxrun image bootstrap && .venv/bin/sandboxrun image build; } >/dev/null; then
    case ",${SANDBOXRUN_REQUIRE_BACKENDS:-}," in
      *,docker,*) echo "cannot build the sandbox image, and docker is required" >&2; exit 1 ;;
      *) echo "warning: cannot build the sandbox image: docker tests will be skipped" >&2 ;;
    esac
  fi
fi

echo "== ruff"; .venv/bin/ruff check . && .venv/bin/ruff format --check .
echo "== mypy"; .venv/bin/mypy
# Here systemd is not PID 1 (as a rule): systemd-scope is required in its test host below.
outer=$(echo ",${SANDBOXRUN_REQUIRE_BACKENDS:-}," | sed 's/,systemd-scope,/,/; s/^,*//; s/,*$//')
echo "== pytest"; SANDBOXRUN_REQUIRE_BACKENDS=$outer .venv/bin/pytest "$@"

# The systemd-scope backend on a real systemd: a container booted with systemd as PID 1.
if docker info >/dev/null 2>&1; then
  echo "== systemd test host"
  rc=0; bash scripts/systemd-host.sh -p no:cacheprovider || rc=$?
  if [ "$rc" = 3 ] && [[ ",${SANDBOXRUN_REQUIRE_BACKENDS:-}," != *,systemd-scope,* ]]; then
    echo "warning: no systemd test host here: the systemd-scope tests are skipped" >&2
  elif [ "$rc" != 0 ]; then
    echo "the systemd-scope tests failed in the systemd test host" >&2; exit 1
  fi
else
  case ",${SANDBOXRUN_REQUIRE_BACKENDS:-}," in
    *,systemd-scope,*) echo "systemd-scope is required but no Docker engine runs its test host" >&2; exit 1 ;;
    *) echo "warning: no Docker engine: the systemd-scope tests (run in a systemd test host) are skipped" >&2 ;;
  esac
fi
