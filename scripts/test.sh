#!/usr/bin/env bash
# The whole test suite on a fresh machine with Python 3.11+: creates .venv, installs sandboxrun
# with its dev extras, builds the sandbox image when a Docker engine is reachable (offline, from
# the host's apt sources; reused when present), then runs ruff, mypy (strict) and pytest, and,
# alongside pytest, the systemd-scope tests inside a container booted with systemd
# (scripts/systemd-host.sh).
# Extra arguments go to pytest. SANDBOXRUN_REQUIRE_BACKENDS=docker,... turns a backend's
# "unavailable" into a failure instead of a skip (CI sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
  || { echo "sandboxrun needs Python 3.11 or newer ($PY is older)" >&2; exit 1; }
# The local isolation layer (process-group, systemd-scope) needs bubblewrap; the terminal tests
# drive `sandboxrun shell` through tmux.
if { ! command -v bwrap || ! command -v tmux; } >/dev/null && [ "$(id -u)" = 0 ] \
  && command -v apt-get >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap tmux >/dev/null
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

# The systemd-scope backend on a real systemd: a container booted with systemd as PID 1. It runs
# alongside pytest (two suites, two cores); its log is printed when it ends.
host_pid=""; host_log=$(mktemp)
stop_host() {  # on an early exit: the host container (labelled with its script's pid) and the script
  if [ -n "$host_pid" ]; then
    docker ps -aq --filter "label=sandboxrun.test-host.owner_pid=$host_pid" | xargs -r docker rm -f >/dev/null 2>&1 || true
    kill -TERM "$host_pid" 2>/dev/null || true
    echo "== systemd test host (stopped early; its log so far)"; cat "$host_log" 2>/dev/null || true
  fi
  rm -f "$host_log"
}
trap stop_host EXIT
# A background job starts with SIGINT ignored (non-interactive bash): Ctrl-C reaches pytest
# only, so this script must end on it itself (the EXIT trap then stops the host). TERM keeps
# its default: it ends the script at once (a trap would wait for pytest), the EXIT trap runs.
trap 'exit 130' INT
if docker info >/dev/null 2>&1; then
  echo "== systemd test host (in the background, alongside pytest)"
  bash scripts/systemd-host.sh -p no:cacheprovider >"$host_log" 2>&1 &
  host_pid=$!
fi

echo "== pytest"; rc_pytest=0; SANDBOXRUN_REQUIRE_BACKENDS=$outer .venv/bin/pytest "$@" || rc_pytest=$?

if [ -n "$host_pid" ]; then
  rc=0; wait "$host_pid" || rc=$?; host_pid=""
  echo "== systemd test host"; cat "$host_log"
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
exit "$rc_pytest"
