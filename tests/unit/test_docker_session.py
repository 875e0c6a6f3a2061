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
