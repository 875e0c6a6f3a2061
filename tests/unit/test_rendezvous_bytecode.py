"""The supervisor's bytecode the docker rendezvous carries (``rendezvous.scripts``): an
unchecked-hash ``.pyc`` of exactly the source beside it, made in memory once per process, from
the package's own ``.pyc`` only where Python's rules trust it for that source."""

from __future__ import annotations

import importlib.util
import marshal
import py_compile
import sys
from pathlib import Path
from types import CodeType

import pytest

from sandboxrun import supervisor
from sandboxrun.backends.docker import rendezvous


def test_each_script_carries_an_unchecked_hash_pyc_of_its_own_source() -> None:
    carried = rendezvous.scripts()
    assert [s.name for s in carried] == list(rendezvous.SCRIPTS)
    for script in carried:
        assert script.source == Path(supervisor.HERE, script.name).read_bytes()
        assert script.pyc is not None and script.pyc_name is not None
        assert script.pyc_name == f"{Path(script.name).stem}.{sys.implementation.cache_tag}.pyc"
        assert script.pyc[:4] == importlib.util.MAGIC_NUMBER
        assert int.from_bytes(script.pyc[4:8], "little") == 0b01  # hash-based, unchecked
        assert script.pyc[8:16] == importlib.util.source_hash(script.source)
        code = marshal.loads(script.pyc[16:])  # noqa: S302 - made here from our sources
        assert isinstance(code, CodeType)
        fresh = compile(script.source, script.name, "exec", dont_inherit=True, optimize=0)
        assert code.co_code == fresh.co_code  # the same program as the source compiles to
    assert rendezvous.scripts() is carried  # once per process


def source_and_pyc(tmp_path: Path, text: str = "X = 1\n") -> tuple[Path, Path]:
    source = tmp_path / "mod.py"
    source.write_text(text)
    pyc = Path(importlib.util.cache_from_source(str(source)))
    py_compile.compile(str(source), cfile=str(pyc), doraise=True)
    return source, pyc


def test_the_packages_pyc_is_used_when_it_matches_its_source(tmp_path: Path) -> None:
    source, _ = source_and_pyc(tmp_path)
    code = rendezvous._package_code(source, source.read_bytes())
    assert isinstance(code, CodeType)
    namespace: dict[str, object] = {}
    exec(code, namespace)  # noqa: S102 - our own test module's code
    assert namespace["X"] == 1


@pytest.mark.parametrize("damage", ["changed", "truncated", "magic", "stale-hash", "missing"])
def test_a_packages_pyc_that_python_would_not_trust_is_not_used(
    tmp_path: Path, damage: str
) -> None:
    """A ``.pyc`` that does not match its source (another size, an older hash), that does not
    unmarshal (a write cut short: the container's import would fail on it rather than fall
    back), or of another Python: the source is compiled instead."""
    source, pyc = source_and_pyc(tmp_path)
    data = source.read_bytes()
    if damage == "changed":
        data = b"X = 22\n"
        source.write_bytes(data)
    elif damage == "truncated":
        pyc.write_bytes(pyc.read_bytes()[:-8])
    elif damage == "magic":
        raw = bytearray(pyc.read_bytes())
        raw[0] ^= 0xFF
        pyc.write_bytes(bytes(raw))
    elif damage == "stale-hash":
        py_compile.compile(
            str(source), cfile=str(pyc), doraise=True,
            invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
        )  # fmt: skip
        data = b"X = 3\n"  # the same size, another source: only the hash tells
        source.write_bytes(data)
    else:
        pyc.unlink()
    assert rendezvous._package_code(source, data) is None
