#!/usr/bin/env bash
# The systemd-scope backend's real tests: builds the "systemd test host" image on the offline
# bootstrap, boots it with systemd as PID 1, and runs the systemd tests inside it with sandboxrun
# from this working tree: as root (system manager) and as a lingering user (user manager).
# Needs .venv (scripts/test.sh makes it) and a Docker engine. Extra arguments go to pytest;
# `--bench` runs bench/systemd.py in the host instead of the tests. Exit status 3: the host could
# not be built or booted (no test ran); any other failure is a test failure.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=sandboxrun/systemd-host:test
suite=$(.venv/bin/python -c 'from sandboxrun.image.build import host_source; print(host_source()[1])')
base=sandboxrun/bootstrap:$suite
setup_failed() { echo "systemd test host: $1" >&2; exit 3; }  # 3: could not set up, no test ran
docker image inspect "$base" >/dev/null 2>&1 || .venv/bin/sandboxrun image bootstrap >/dev/null \
  || setup_failed "cannot build the offline bootstrap $base"
# its own label, never sandboxrun.managed: `sandboxrun clean --all` must not remove the host
docker build -q -t "$IMAGE" --build-arg BASE_IMAGE="$base" \
  --label sandboxrun.test-host=true tests/systemd_host >/dev/null \
  || setup_failed "cannot build $IMAGE"

name="sandboxrun-systemd-host-$$"
cleanup() { docker rm -f "$name" >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM  # the EXIT trap runs on these too
# Like a real systemd machine, the host lets bubblewrap (the local isolation layer) build its
# namespaces: a network namespace's loopback needs NET_ADMIN, and an unprivileged user's new
# /proc needs docker's default seccomp profile and /proc masks out of the way.
docker run -d --name "$name" \
  --label sandboxrun.test-host=true --label sandboxrun.test-host.owner_pid=$$ \
  --cap-add SYS_ADMIN --cgroupns=host -v /sys/fs/cgroup:/sys/fs/cgroup:rw \
  --cap-add NET_ADMIN --security-opt seccomp=unconfined --security-opt systempaths=unconfined \
  --tmpfs /run --tmpfs /run/lock -v "$PWD":/src:ro "$IMAGE" >/dev/null \
  || setup_failed "cannot start $IMAGE"

state=""
for _ in $(seq 1 120); do
  state=$(docker exec "$name" systemctl is-system-running 2>/dev/null || true)
  case "$state" in running|degraded) break ;; esac
  sleep 0.5
done
case "$state" in
  running|degraded) ;;
  *) docker logs "$name" 2>&1 | tail -20 >&2
     setup_failed "it did not boot (state: ${state:-none})" ;;
esac

site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
site=/src/${site#"$PWD"/}
run_tests() {  # user, extra env, pytest args...
  local user=$1 env=$2; shift 2
  docker exec -u "$user" -w /tmp -e PYTHONPATH="/src:$site" -e PYTHONDONTWRITEBYTECODE=1 \
    -e SANDBOXRUN_REQUIRE_BACKENDS=systemd-scope,process-group $env "$name" \
    python3 -m pytest -p no:cacheprovider --rootdir=/src -c /src/pyproject.toml "$@"
}
if [ "${1:-}" = "--bench" ]; then  # bench/systemd.py inside the host, as root
  docker exec -w /tmp -e PYTHONPATH="/src:/src/bench:$site" -e PYTHONDONTWRITEBYTECODE=1 "$name" \
    python3 /src/bench/systemd.py
  exit
fi
echo "== systemd-scope tests as root (system manager)"
run_tests root "-e HOME=/root" /src/tests -k "systemd or fallback or Fallback or owner_uid" "$@"
echo "== systemd-scope tests as a lingering user (user manager)"
for _ in $(seq 1 60); do  # logind starts the lingering user's manager; it may lag the boot
  docker exec "$name" systemctl is-active --quiet user@1000.service && break
  sleep 0.5
done
run_tests tester "-e HOME=/home/tester -e XDG_RUNTIME_DIR=/run/user/1000" \
  /src/tests/conformance /src/tests/integration/test_systemd.py \
  /src/tests/integration/test_local_isolation.py -k "systemd" "$@"
