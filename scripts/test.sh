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

# ruff and mypy run while the image builds (it waits on apt and the engine more than on CPU);
# their output is shown, and their failure fails the run, once the image is done.
lint_log=$(mktemp)
{ echo "== ruff"; .venv/bin/ruff check . && .venv/bin/ruff format --check . \
    && { echo "== mypy"; .venv/bin/mypy; }; } >"$lint_log" 2>&1 &
lint_pid=$!
trap 'kill "$lint_pid" 2>/dev/null || true; rm -f "$lint_log"' EXIT  # (replaced below)

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

lint_rc=0; wait "$lint_pid" || lint_rc=$?
cat "$lint_log"; rm -f "$lint_log"
[ "$lint_rc" = 0 ] || { echo "ruff or mypy failed" >&2; exit 1; }
# Here systemd is not PID 1 (as a rule): systemd-scope is required in its test host below.
outer=$(echo ",${SANDBOXRUN_REQUIRE_BACKENDS:-}," | sed 's/,systemd-scope,/,/; s/^,*//; s/,*$//')

# The systemd-scope backend on a real systemd: a container booted with systemd as PID 1. It runs
# alongside pytest (two suites, two cores); its log is printed when it ends.
# Once the host's suites end (about half-way through pytest's), the same lane runs the late
# share of pytest's (SANDBOXRUN_TEST_LANE, tests/conftest.py: the image builds, the unit tests,
# the tests of the local backends), the outer pytest the early share (the engine's): the
# critical path is the outer pytest, this takes minutes off it. Only when no test path is given.
host_pid=""; host_log=$(mktemp); late_log=$(mktemp); late_rc=$(mktemp)
split=1
for arg in "$@"; do [ -e "$arg" ] && split=0; done
stop_host() {  # on an early exit: the host container (labelled with its script's pid) and the script
  if [ -n "$host_pid" ]; then
    docker ps -aq --filter "label=sandboxrun.test-host.owner_pid=$host_pid" | xargs -r docker rm -f >/dev/null 2>&1 || true
    pkill -TERM -P "$host_pid" 2>/dev/null || true
    kill -TERM "$host_pid" 2>/dev/null || true
    echo "== systemd test host (stopped early; its log so far)"; cat "$host_log" 2>/dev/null || true
  fi
  rm -f "$host_log" "$late_log" "$late_rc"
}
trap stop_host EXIT
# A background job starts with SIGINT ignored (non-interactive bash): Ctrl-C reaches pytest
# only, so this script must end on it itself (the EXIT trap then stops the host). TERM keeps
# its default: it ends the script at once (a trap would wait for pytest), the EXIT trap runs.
trap 'exit 130' INT
lane=()
if docker info >/dev/null 2>&1; then
  echo "== systemd test host (in the background, alongside pytest)"
  [ "$split" = 1 ] && lane=(SANDBOXRUN_TEST_LANE=early)
  (
    rc=0; bash scripts/systemd-host.sh -p no:cacheprovider >"$host_log" 2>&1 || rc=$?
    if [ "$split" = 1 ]; then
      late=0; SANDBOXRUN_TEST_LANE=late SANDBOXRUN_REQUIRE_BACKENDS=$outer .venv/bin/pytest "$@" \
        >"$late_log" 2>&1 || late=$?
      echo "$late" >"$late_rc"
    fi
    exit "$rc"
  ) &
  host_pid=$!
fi

echo "== pytest"; rc_pytest=0
env "${lane[@]}" SANDBOXRUN_REQUIRE_BACKENDS="$outer" .venv/bin/pytest "$@" || rc_pytest=$?

if [ -n "$host_pid" ]; then
  rc=0; wait "$host_pid" || rc=$?; host_pid=""
  if [ "$split" = 1 ]; then
    echo "== pytest, the late share (after the systemd test host)"; cat "$late_log"
    [ "$(cat "$late_rc")" = 0 ] || rc_pytest=1
  fi
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
