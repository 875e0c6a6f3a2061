"""An eval-like workload: ``BENCH_SAMPLES`` (default 40) samples of 5 commands each, at
concurrency ``BENCH_CONCURRENCY`` (default 4), every sample on a fresh copy of a small
workspace (a template of ~30 files), three ways in the same run on the same backend (docker
when it is available, else process-group):

- ``open_per_sample``: the baseline: copy the template, open a ``Sandbox`` on it, run the
  commands, close it, remove the copy;
- ``pool_discard``: a ``SandboxPool`` (size = concurrency) that closes a released sandbox and
  opens a fresh one in the background;
- ``pool_reset``: the same pool with ``reset=True``: a released sandbox is reset in place
  (``sandboxrun.api.pool_reset``).

Reported: samples per minute of each, the ratios to the baseline, and the pools' counts (how
many were reset, discarded). Target (issue 21): ``pool_reset`` >= 3x ``open_per_sample``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import anyio
from _common import emit, env_int, machine, rounded

from sandboxrun import ExecResult, Sandbox, SandboxPool, backends

TARGET = 3.0
COMMANDS = (
    "ls -R . | wc -l",
    "cat src/*.py | wc -c",
    "grep -rn 'def ' src | wc -l",
    "python3 -c 'import sys; print(sys.version_info[0])' 2>/dev/null || echo 3",
    "echo answer > out.txt && cat out.txt && echo x > /tmp/scratch",
)


def make_template(root: Path) -> None:
    (root / "src").mkdir(parents=True)
    (root / "tests").mkdir()
    for i in range(20):
        (root / "src" / f"mod{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * 10)
    for i in range(8):
        (root / "tests" / f"test_{i}.py").write_text(f"def test_{i}():\n    assert True\n")
    (root / "README.md").write_text("a small project\n" * 20)


async def sample(sb: Sandbox) -> None:
    for command in COMMANDS:
        result: ExecResult = await sb.exec(shell=command)
        if not result.ok or result.stdout_truncated:
            raise RuntimeError(f"{command!r} ended {result.status}: {result.stderr}")


async def open_per_sample(template: Path, scratch: Path, backend: str, n: int, c: int) -> float:
    limit = anyio.Semaphore(c)

    async def one(i: int) -> None:
        async with limit:
            copy = scratch / f"sample-{i}"
            await anyio.to_thread.run_sync(shutil.copytree, template, copy)
            try:
                async with Sandbox(copy, backend=backend) as sb:
                    await sample(sb)
            finally:
                await anyio.to_thread.run_sync(shutil.rmtree, copy)

    began = time.perf_counter()
    async with anyio.create_task_group() as group:
        for i in range(n):
            group.start_soon(one, i)
    return time.perf_counter() - began


async def pooled(
    template: Path, scratch: Path, backend: str, n: int, c: int, *, reset: bool
) -> tuple[float, dict[str, int]]:
    async with SandboxPool(
        c, workspace=template, root=scratch, backend=backend, reset=reset, acquire_timeout_s=300
    ) as pool:
        while pool.stats().ready < c:  # warm: a pool is made before the samples come
            await anyio.sleep(0.05)
        limit = anyio.Semaphore(c)

        async def one() -> None:
            async with limit, pool.acquire() as sb:
                await sample(sb)

        began = time.perf_counter()
        async with anyio.create_task_group() as group:
            for _ in range(n):
                group.start_soon(one)
        took = time.perf_counter() - began
        stats = pool.stats()
    return took, {"reset": stats.reset, "discarded": stats.discarded, "opened": stats.opened}


async def main() -> None:
    n = env_int("BENCH_SAMPLES", 40)
    c = env_int("BENCH_CONCURRENCY", 4)
    backend = "docker" if backends.probe("docker").available else "process-group"
    with tempfile.TemporaryDirectory(prefix="bench-workload-") as tmp:
        template = Path(tmp) / "template"
        make_template(template)
        await open_per_sample(template, Path(tmp), backend, c, c)  # warm-up (image, caches)
        seconds = {"open_per_sample": await open_per_sample(template, Path(tmp), backend, n, c)}
        seconds["pool_discard"], discard = await pooled(
            template, Path(tmp) / "discard", backend, n, c, reset=False
        )
        seconds["pool_reset"], reset = await pooled(
            template, Path(tmp) / "reset", backend, n, c, reset=True
        )
    per_min = {name: n * 60 / s for name, s in seconds.items()}
    ratio = per_min["pool_reset"] / per_min["open_per_sample"]
    emit(
        {
            "bench": "pool_workload",
            "samples": n,
            "commands_per_sample": len(COMMANDS),
            "concurrency": c,
            "backend": backend,
            "samples_per_min": {name: rounded(v, 1) for name, v in per_min.items()},
            "discard_ratio": rounded(per_min["pool_discard"] / per_min["open_per_sample"], 2),
            "reset_ratio": rounded(ratio, 2),
            "target_ratio": TARGET,
            "met": ratio >= TARGET,
            "pool_discard": discard,
            "pool_reset": reset,
            "machine": machine(),
        }
    )


if __name__ == "__main__":
    sys.exit(anyio.run(main))
