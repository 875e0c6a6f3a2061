from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "sub" / "dir").mkdir(parents=True)
    (ws / "hello.txt").write_text("hello\n")
    return ws


@pytest.fixture(autouse=True)
def spill_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "spill"
    monkeypatch.setenv("SANDBOXRUN_SPILL_DIR", str(root))
    return root


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
