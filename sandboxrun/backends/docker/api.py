"""The one boundary to the Docker Engine API: client with deadlines, retries, error mapping.

Idempotent lifecycle calls (create, start, inspect, remove, image checks) retry transient
failures (connection reset, broken pipe, 5xx, timeouts) with tenacity; exec calls never retry.
Every call has a deadline (the client's socket timeout). Foreign exceptions become
``BackendError`` / ``SandboxUnavailableError`` here, with ``raise ... from``.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import docker
import docker.errors
import requests.exceptions
from docker import DockerClient
from tenacity import (
    retry,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from sandboxrun.errors import BackendError, SandboxUnavailableError

T = TypeVar("T")

API_TIMEOUT_S = 30.0
PROBE_TIMEOUT_S = 3.0


def connect(timeout_s: float = API_TIMEOUT_S) -> DockerClient:
    """A client for the engine named by the environment (``DOCKER_HOST`` etc.), pinged."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://") and not stat.S_ISSOCK(_mode(host.removeprefix("unix://"))):
        # checked first: docker-py leaks a socket when it cannot connect to a unix path
        raise SandboxUnavailableError("docker", f"no Docker engine socket at {host}")
    client: DockerClient | None = None
    try:
        client = docker.from_env(timeout=max(1, round(timeout_s)))
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        if client is not None:
            client.close()
        raise SandboxUnavailableError("docker", f"cannot reach the Docker engine: {exc}") from exc
    return client


def _mode(path: str) -> int:
    try:
        return Path(path).stat().st_mode
    except OSError:
        return 0


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, docker.errors.APIError):
        return exc.status_code is not None and exc.status_code >= 500
    return isinstance(
        exc,
        requests.exceptions.ConnectionError
        | requests.exceptions.Timeout
        | ConnectionResetError
        | BrokenPipeError,
    )


def retrying(call: Callable[[], T], *, what: str, budget_s: float = API_TIMEOUT_S) -> T:
    """Run an idempotent engine call, retrying transient failures within ``budget_s``."""

    @retry(
        retry=retry_if_exception(is_transient),
        stop=stop_after_attempt(5) | stop_after_delay(budget_s),
        wait=wait_exponential(multiplier=0.1, max=2.0),
        reraise=True,
    )
    def attempt() -> T:
        return call()

    try:
        return attempt()
    except docker.errors.NotFound:
        raise
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        raise BackendError(f"docker: {what} failed: {exc}") from exc


def once(call: Callable[[], T], *, what: str) -> T:
    """Run a non-idempotent engine call (exec create/start) exactly once."""
    try:
        return call()
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        raise BackendError(f"docker: {what} failed: {exc}") from exc


def remove_container(
    client: DockerClient, container_id: str, *, budget_s: float, attempt_s: float
) -> str | None:
    """Force-remove a container within ``budget_s`` in all: each request has its own deadline
    (``attempt_s``) and a request that fails transiently or gets no answer is sent again.
    None when the container is gone, else why it may not be (one phrase)."""
    api = client.api
    deadline = time.monotonic() + budget_s
    pause, attempts, why = 0.1, 0, "no attempt was made"
    while (left := deadline - time.monotonic()) > 0.05:
        attempts += 1
        timeout = min(attempt_s, left)
        api.timeout = timeout  # type: ignore[assignment]  # per request; a float works
        try:
            api.remove_container(container_id, force=True, v=True)
            return None
        except docker.errors.NotFound:
            return None  # gone (removed under us, or by an earlier attempt)
        except docker.errors.APIError as exc:
            in_progress = exc.status_code == 409 and "in progress" in str(exc)
            if not in_progress and not is_transient(exc):
                return f"the engine refused: {exc.explanation or exc}"
            why = "its removal was still in progress" if in_progress else f"the engine said: {exc}"
        except (requests.exceptions.RequestException, OSError) as exc:
            timed_out = isinstance(exc, requests.exceptions.Timeout)
            why = f"no answer within {timeout:.3g} s" if timed_out else f"engine unreachable: {exc}"
        time.sleep(max(0.0, min(pause, deadline - time.monotonic())))
        pause = min(pause * 2, 1.0)
    return f"{why}; {attempts} attempt(s) in {budget_s:g} s"


def buffered_bytes(stream: object) -> bytes:
    """Bytes of a hijacked stream (``exec_start(socket=True)``) that http.client's buffered
    reader already read past the response head: the stream's first bytes, which reading the raw
    socket would never see. The socket must be non-blocking already (this never waits)."""
    response = getattr(stream, "_response", None)  # kept on the SocketIO by docker-py
    reader = getattr(getattr(getattr(response, "raw", None), "_fp", None), "fp", None)
    read1 = getattr(reader, "read1", None)
    if read1 is None:
        return b""
    try:
        data = read1(65536)  # the buffered bytes, or one non-blocking read of the socket
    except (BlockingIOError, ValueError, OSError):
        return b""
    return data if isinstance(data, bytes) else b""
