"""``sandboxrun.testing.FakeBackend``: a Sandbox over it behaves as over a real backend (the
engine builds its results), for code tested without an engine. The result contract itself runs
on it in tests/conformance/test_contract.py."""

from __future__ import annotations

import errno
from pathlib import Path

import anyio
import pytest

from sandboxrun import ConfigError, Limits, Policy, PolicyRefusedError, Sandbox
from sandboxrun.engine.launch import Launch
from sandboxrun.testing import FakeBackend, Reply

pytestmark = pytest.mark.anyio


async def test_commands_get_their_scripted_outcome_and_are_recorded(tmp_path: Path) -> None:
    def respond(launch: Launch) -> Reply:
        return Reply(stdout=f"ran {launch.argv[0]} in {launch.cwd}\n", stderr=b"e", exit_code=2)

    fake = FakeBackend(respond)
    async with Sandbox(tmp_path, backend=fake, env={"A": "1"}) as sb:
        result = await sb.exec(["tool", "x"], workdir=".")
    assert (result.status, result.exit_code, result.backend, result.via) == (
        "failed",
        2,
        "fake",
        "fake",
    )
    assert result.stdout == f"ran tool in {tmp_path}\n" and result.stderr == "e"
    assert result.warnings == []  # the login snapshot was answered by the fake itself
    assert [launch.argv for launch in fake.launches] == [["tool", "x"]]
    assert fake.launches[0].env["A"] == "1"
    assert fake.opened and fake.closed


async def test_a_deadline_ends_a_long_command_and_keeps_its_output(tmp_path: Path) -> None:
    fake = FakeBackend(lambda launch: Reply(stdout="partial\n", duration_s=30))
    async with Sandbox(tmp_path, backend=fake, limits=Limits(grace_s=0.1)) as sb:
        result = await sb.exec(["sleep", "30"], timeout=0.3)
    assert (result.status, result.signal, result.stdout) == ("timed_out", "SIGTERM", "partial\n")
    assert 0.3 <= result.duration_s < 5


async def test_a_cancelled_caller_gets_a_cancelled_result(tmp_path: Path) -> None:
    fake = FakeBackend(lambda launch: Reply(duration_s=30))
    async with Sandbox(tmp_path, backend=fake) as sb:
        with anyio.move_on_after(0.2):
            await sb.exec(["sleep", "30"])
        assert sb.last_result is not None and sb.last_result.status == "cancelled"


@pytest.mark.parametrize(("err", "code"), [(errno.ENOENT, 127), (errno.EACCES, 126)])
async def test_a_command_that_cannot_be_executed(tmp_path: Path, err: int, code: int) -> None:
    async with Sandbox(tmp_path, backend=FakeBackend(lambda launch: Reply(spawn_errno=err))) as sb:
        result = await sb.exec(["missing"])
    assert (result.status, result.exit_code) == ("spawn_error", code)
    assert result.error is not None and result.error.startswith("missing: ")


async def test_a_backend_lacking_a_guarantee_is_refused_as_a_real_one(tmp_path: Path) -> None:
    fake = FakeBackend(isolation=["read-only-root"])
    async with Sandbox(tmp_path, backend=fake) as sb:
        with pytest.raises(PolicyRefusedError, match="seccomp"):
            await sb.exec(["true"])
    degraded = Policy(allow_degraded=True)
    async with Sandbox(tmp_path, backend=FakeBackend(isolation=[]), policy=degraded) as sb:
        result = await sb.exec(["true"])
    assert result.status == "completed"
    assert "seccomp" in result.missing_guarantees and result.isolation == []


async def test_a_closed_fake_runs_nothing(tmp_path: Path) -> None:
    fake = FakeBackend()
    async with Sandbox(tmp_path, backend=fake) as sb:
        await fake.close()
        with pytest.raises(Exception, match="not open"):
            await sb.exec(["true"])
    assert fake.launches == []


@pytest.mark.parametrize("reply", [Reply(duration_s=30), Reply(spawn_errno=errno.ENOENT)])
async def test_a_stdin_job_refuses_writes_at_once(tmp_path: Path, reply: Reply) -> None:
    """A fake command reads no stdin (running, or never started): a write fails at once, as
    to a command that closed its stdin, and never waits for the job's end."""
    async with Sandbox(tmp_path, backend=FakeBackend(lambda launch: reply)) as sb:
        job = await sb.start(["cat"], stdin=True)
        with anyio.fail_after(5), pytest.raises(BrokenPipeError):
            await job.write_stdin(b"x")
        await job.kill()


async def test_a_backend_object_cannot_be_escalated(tmp_path: Path) -> None:
    """An escalation re-runs in a fresh sandbox: a backend object is this one's, never shared."""
    async with Sandbox(tmp_path, backend=FakeBackend()) as sb:
        request = sb._prepare(["true"])
        with pytest.raises(ConfigError, match="backend by name"):
            sb._escalated(request, Policy(network="on"))
        assert (await sb.exec(["true"])).status == "completed"  # still open, still its own
