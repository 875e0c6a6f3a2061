"""A 1 GiB stdout flood through every backend: bounded memory, exact accounting.

Measured in a fresh interpreter so the RSS high-water mark belongs to this run alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

GIB = 1 << 30
MAX_OUTPUT = 64 * 1024
SPILL_MAX = 64 << 20

CHILD = textwrap.dedent(
    """
    import json, os, resource, sys
    import anyio
    from sandboxrun import Limits, Sandbox

    async def main():
        async with Sandbox(sys.argv[1], backend=sys.argv[4],
                           limits=Limits(max_output=int(sys.argv[2])), keep_spill=True) as sb:
            await sb.exec(["head", "-c", "1000000", "/dev/zero"])  # warm-up
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            r = await sb.exec(["head", "-c", sys.argv[3], "/dev/zero"], timeout=120)
            after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        spill = r.stdout_spill
        print(json.dumps({
            "growth": after - before, "status": r.status, "total": r.stdout_total_bytes,
            "dropped": r.stdout_dropped_bytes, "truncated": r.stdout_truncated,
            "spill_size": os.path.getsize(spill) if spill else None,
            "spill_zeros": open(spill, "rb").read(4096) == bytes(4096) if spill else None,
            "spill_complete": r.stdout_spill_complete, "text_len": len(r.stdout),
            "marker": f"[... {r.stdout_dropped_bytes} bytes omitted ...]" in r.stdout,
        }))

    anyio.run(main)
    """
)


def test_one_gib_flood_is_bounded_and_exact(workspace: Path, backend: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(workspace), str(MAX_OUTPUT), str(GIB), backend],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    facts = json.loads(proc.stdout)
    assert facts["status"] == "completed"
    assert facts["total"] == GIB
    assert facts["dropped"] == GIB - MAX_OUTPUT
    assert facts["truncated"] is True
    assert facts["marker"] is True
    assert facts["spill_size"] == SPILL_MAX
    assert facts["spill_zeros"] is True
    assert facts["spill_complete"] is False
    budget = 32 << 20 if backend == "process-group" else 48 << 20  # the SDK's buffers
    assert facts["growth"] <= 2 * MAX_OUTPUT + budget, facts
