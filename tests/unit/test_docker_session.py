"""``ContainerSession``: what the docker backend shares with its engine-path runs."""

from __future__ import annotations

import os
import subprocess

import pytest

from sandboxrun.backends.docker.session import ContainerSession
from sandboxrun.errors import BackendError


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_dying_reads_the_containers_own_processes() -> None:
    session = ContainerSession("1000:1000")
    assert not session.dying()  # no container seen yet (or a remote engine): nothing to read
    session.init_pid = os.getpid()
    assert not session.dying()
    session.keep = frozenset({os.getpid(), dead_pid()})
    assert session.dying()  # its main process is gone
    session.keep = frozenset()
    session.supervisor_pid = dead_pid()
    assert session.dying()  # its supervisor is gone
    session.reset()
    assert not session.dying()  # a container being replaced: nothing of it is known
    assert not session.keep


def test_a_closed_session_says_so() -> None:
    session = ContainerSession("0:0")
    with pytest.raises(BackendError, match="closed"):
        session.api()
    with pytest.raises(BackendError, match="closed"):
        session.state()
    with pytest.raises(BackendError, match="closed"):
        session.require()  # a run ending after the close (its sweep) is told, not crashed
    session.container_id = "c0ffee"
    with pytest.raises(BackendError, match="closed"):
        session.require()  # an id without a client is no container either


class RemovingEngine:
    """The engine's answers to a force-remove (docker-py's low-level API), one per call."""

    def __init__(self, *answers: Exception | None) -> None:
        self.answers = list(answers)
        self.calls = 0

    def remove_container(self, container_id: str, force: bool, v: bool) -> None:
        self.calls += 1
        answer = self.answers.pop(0)
        if answer is not None:
            raise answer


class FakeClient:
    def __init__(self, api: RemovingEngine) -> None:
        self.api = api


def conflict(explanation: str) -> Exception:
    import docker.errors
    import requests

    response = requests.Response()
    response.status_code, response.reason, response.url = 409, "Conflict", "http://engine/x"
    return docker.errors.APIError("409 Client Error", response, explanation=explanation)


def test_a_container_being_removed_already_is_not_found() -> None:
    from sandboxrun.backends.docker import api as dockerapi

    busy = conflict("removal of container abc is already in progress")
    engine = RemovingEngine(busy)
    with pytest.raises(dockerapi.NotFoundError, match="being removed"):
        dockerapi.remove_now(FakeClient(engine), "abc")  # type: ignore[arg-type]
    assert engine.calls == 1  # not retried: nothing to wait for
    other = conflict("conflict: the container is in use")
    with pytest.raises(BackendError) as refused:
        dockerapi.remove_now(FakeClient(RemovingEngine(other)), "abc")  # type: ignore[arg-type]
    assert not isinstance(refused.value, dockerapi.NotFoundError)
    dockerapi.remove_now(FakeClient(RemovingEngine(None)), "abc")  # type: ignore[arg-type]
