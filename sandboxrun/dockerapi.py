"""The one boundary to the Docker Engine API: client with deadlines, retries, error mapping.

Idempotent lifecycle calls (create, start, inspect, remove, image checks) retry transient
failures (connection reset, broken pipe, 5xx, timeouts) with tenacity; exec calls never retry.
Every call has a deadline (the client's socket timeout). Foreign exceptions become
``BackendError`` / ``SandboxUnavailableError`` here, with ``raise ... from``.
"""

from __future__ import annotations

import os
import stat
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
