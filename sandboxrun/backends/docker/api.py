"""The one boundary to the Docker Engine API: client with deadlines, retries, error mapping.
No other module of sandboxrun imports the docker SDK (tests/unit/test_architecture.py): they
call the functions here, with the ``Client`` this module connects.

Idempotent lifecycle calls (create, start, inspect, remove, image checks) retry transient
failures (connection reset, broken pipe, 5xx, timeouts) with tenacity; exec calls never retry.
Every call has a deadline (the client's socket timeout). Foreign exceptions become
``BackendError`` / ``SandboxUnavailableError`` here, with ``raise ... from``.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors
import docker.utils
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
Client = DockerClient
"""A connected engine client (``connect``): passed back to the functions of this module."""

API_TIMEOUT_S = 30.0
PROBE_TIMEOUT_S = 3.0


_API_VERSIONS: dict[tuple[str, ...], tuple[str, str]] = {}
"""The engine each environment named (``_engine_key``) for this process: its address and
the API version it negotiated. A later ``connect`` to the same address asks no
``/version`` again (one round trip of every open)."""


def _engine_key() -> tuple[str, ...]:
    """What names the engine: the variables docker-py reads (a context too)."""
    names = (
        "DOCKER_HOST",
        "DOCKER_TLS_VERIFY",
        "DOCKER_CERT_PATH",
        "DOCKER_CONTEXT",
        "DOCKER_CONFIG",
    )
    return tuple(os.environ.get(name, "") for name in names)


def connect(timeout_s: float = API_TIMEOUT_S) -> DockerClient:
    """A client for the engine named by the environment (``DOCKER_HOST`` etc.), pinged."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    key = _engine_key()
    if host.startswith("unix://") and not stat.S_ISSOCK(_mode(host.removeprefix("unix://"))):
        # checked first: docker-py leaks a socket when it cannot connect to a unix path
        _API_VERSIONS.pop(key, None)
        raise SandboxUnavailableError("docker", f"no Docker engine socket at {host}")
    timeout = max(1, round(timeout_s))
    known = _API_VERSIONS.get(key)
    client: DockerClient | None = None
    try:
        if known is not None:  # the version this address negotiated
            client = docker.from_env(timeout=timeout, version=known[1])
            try:
                if client.api.base_url != known[0]:  # (a context switched): negotiated again
                    raise docker.errors.APIError("another engine")
                client.ping()
            except docker.errors.APIError:  # it answered, refusing that version: again
                client.close()
                client = None
                _API_VERSIONS.pop(key, None)
        if client is None:
            client = docker.from_env(timeout=timeout)  # (the version negotiated)
            client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        if client is not None:
            client.close()
        _API_VERSIONS.pop(key, None)  # (it may come back as another engine: asked again)
        raise SandboxUnavailableError("docker", f"cannot reach the Docker engine: {exc}") from exc
    _API_VERSIONS[key] = (str(client.api.base_url), str(client.api.api_version))
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


class NotFoundError(BackendError):
    """The engine has no such object (container, image, exec): removed, or never made."""


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
    except docker.errors.NotFound as exc:
        raise NotFoundError(f"docker: {what}: {exc.explanation or exc}") from exc
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        raise BackendError(f"docker: {what} failed: {exc}") from exc


def once(call: Callable[[], T], *, what: str) -> T:
    """Run a non-idempotent engine call (exec create/start) exactly once."""
    try:
        return call()
    except docker.errors.NotFound as exc:
        raise NotFoundError(f"docker: {what}: {exc.explanation or exc}") from exc
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


# -- containers --------------------------------------------------------------------------------
def list_labelled(
    client: DockerClient, label: str, *, budget_s: float = API_TIMEOUT_S
) -> list[dict[str, Any]]:
    """Every container (running or not) with the label ``label`` (``key=value``)."""
    found = retrying(
        lambda: client.api.containers(all=True, filters={"label": label}),
        what="list managed containers",
        budget_s=budget_s,
    )
    return [dict(item) for item in found]


def remove_now(client: DockerClient, container_id: str) -> None:
    """Force-remove a container with its anonymous volumes. ``NotFoundError``: it is gone
    already, or the engine is removing it already (an ``auto_remove`` container that
    stopped: the engine answers 409)."""

    def remove() -> None:
        try:
            client.api.remove_container(container_id, force=True, v=True)
        except docker.errors.APIError as exc:
            if exc.status_code == 409 and "in progress" in str(exc):
                why = f"docker: container {container_id[:12]} is being removed"
                raise NotFoundError(why) from exc
            raise

    retrying(remove, what=f"remove container {container_id[:12]}")


def create_container(client: DockerClient, config: dict[str, Any]) -> str:
    """Create a container from ``config`` (``create_container``'s keyword arguments, with the
    host config's under ``host_config``): its id. Never retried: a retry could make two."""
    config = dict(config)
    api = client.api
    host = api.create_host_config(**config.pop("host_config"))
    created = once(
        lambda: api.create_container(host_config=host, **config),
        what="create the sandbox container",
    )
    return str(created["Id"])


def start_container(
    client: DockerClient, container_id: str, refused: Callable[[str], bool]
) -> bool:
    """Start a container (retrying transient failures): False, at once, when the engine's
    refusal is one ``refused`` recognises from its text (e.g. no seccomp in the daemon)."""

    def start() -> bool:
        try:
            client.api.start(container_id)
        except docker.errors.APIError as exc:
            if refused(str(exc)):
                return False
            raise
        return True

    return retrying(start, what="start the sandbox container")


def inspect_container(client: DockerClient, container_id: str) -> dict[str, Any]:
    return dict(
        retrying(
            lambda: client.api.inspect_container(container_id),
            what="inspect the sandbox container",
        )
    )


# -- exec --------------------------------------------------------------------------------------
def exec_create(client: DockerClient, container_id: str, argv: list[str], **kwargs: Any) -> str:
    """An exec of ``argv`` in the container (``exec_create``'s options): its id. Never retried."""
    created = once(lambda: client.api.exec_create(container_id, argv, **kwargs), what="exec create")
    return str(created["Id"])


def exec_attach(client: DockerClient, exec_id: str, *, tty: bool = False) -> Any:
    """Start the exec with its streams hijacked: docker-py's socket wrapper (keep it: it owns
    the socket; ``buffered_bytes`` has what it read ahead). ``tty``: an exec made with a
    terminal (its stream is raw, not multiplexed). Never retried."""
    return once(lambda: client.api.exec_start(exec_id, socket=True, tty=tty), what="exec start")


def exec_output(client: DockerClient, exec_id: str) -> bytes:
    """Start the exec and wait for its whole output (a short helper's). Never retried."""
    return bytes(once(lambda: client.api.exec_start(exec_id), what="exec start"))


def exec_inspect(client: DockerClient, exec_id: str) -> dict[str, Any]:
    return dict(once(lambda: client.api.exec_inspect(exec_id), what="exec inspect"))


# -- images ------------------------------------------------------------------------------------
def inspect_image(
    client: DockerClient, ref: str, *, budget_s: float = API_TIMEOUT_S
) -> dict[str, Any] | None:
    """The engine's record of image ``ref``; None when it has no such image."""
    try:
        found = retrying(
            lambda: client.api.inspect_image(ref),  # type: ignore[no-untyped-call]
            what=f"inspect image {ref}",
            budget_s=budget_s,
        )
    except NotFoundError:
        return None
    return dict(found)


def image_tags(client: DockerClient, repository: str) -> list[str]:
    """The tags of the images of ``repository`` on the engine (``repo:tag`` each)."""
    images = retrying(lambda: client.images.list(name=repository), what=f"list {repository}")
    return [str(tag) for image in images for tag in image.tags]


def import_image(
    client: DockerClient, tarball: str, *, repository: str, tag: str, changes: list[str]
) -> None:
    """Import a root filesystem tarball as ``repository:tag``. Never retried (it is long)."""
    once(
        lambda: client.api.import_image_from_file(
            tarball, repository=repository, tag=tag, changes=changes
        ),
        what="import the bootstrap image",
    )


def tag_image(client: DockerClient, image: str, alias: str) -> None:
    """Give ``image`` the name ``alias`` (``repo:tag``) too."""
    repo, name = docker.utils.parse_repository_tag(alias)
    retrying(lambda: client.api.tag(image, repo, name), what=f"tag {image} as {alias}")


def pull(client: DockerClient, ref: str) -> Iterator[dict[str, Any]]:
    """Pull ``ref``: the engine's progress messages as they come (``BackendError``, with the
    engine's words, when it fails)."""
    return _streamed(lambda: client.api.pull(ref, stream=True, decode=True))


def sent_paths(root: str, patterns: list[str], dockerfile: str) -> set[str]:
    """The paths of the build context ``root`` the SDK sends the engine under
    ``.dockerignore``'s ``patterns`` (its own matcher: what ``build`` sends), with ``/``."""
    from docker.utils.build import exclude_paths

    return {p.replace(os.sep, "/") for p in exclude_paths(root, list(patterns), dockerfile)}


def build(client: DockerClient, **options: Any) -> Iterator[dict[str, Any]]:
    """A legacy-builder build (``APIClient.build``'s options): its messages as they come."""
    return _streamed(lambda: client.api.build(decode=True, **options))


def _streamed(call: Callable[[], Any]) -> Iterator[dict[str, Any]]:
    try:
        for chunk in call():
            yield dict(chunk)
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        raise BackendError(str(getattr(exc, "explanation", None) or exc)) from exc


def registry_has(client: DockerClient, image: str) -> tuple[int | None, str] | None:
    """Ask the engine's registry for ``image`` without pulling it (the client's deadline bounds
    the wait): None when it has it, else the engine's refusal ``(HTTP status, its words)``;
    ``BackendError`` when there was no answer to tell."""
    try:
        client.api.inspect_distribution(image)  # type: ignore[no-untyped-call]
    except docker.errors.APIError as exc:
        return exc.status_code, str(exc.explanation or exc)
    except requests.exceptions.Timeout:
        raise BackendError("no answer in time") from None
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        raise BackendError(str(exc)) from None
    return None


# -- files: the archive API (an engine that is not on this host) --------------------------------
class Archive:
    """A container's files through the engine's archive API. A missing path is None (``stat``,
    ``get``); errors are ``BackendError`` with the engine's own words."""

    def __init__(self, client: DockerClient, container_id: str) -> None:
        self._api: Any = client.api  # (its private _url, _raise_for_status: no HEAD call else)
        self._cid = container_id

    def stat(self, path: str) -> dict[str, Any] | None:
        """The engine's stat of ``path`` (a last symlink not followed: ``linkTarget``); None
        when it is missing."""
        api = self._api
        try:
            res = api.head(api._url("/containers/{0}/archive", self._cid), params={"path": path})
            if res.status_code == 404:
                return None
            api._raise_for_status(res)
        except docker.errors.APIError as exc:
            raise BackendError(str(exc.explanation or exc)) from None
        except (requests.exceptions.RequestException, OSError) as exc:
            raise BackendError(f"the engine is unreachable: {exc}") from None
        header = res.headers.get("x-docker-container-path-stat")
        return dict(docker.utils.decode_json_header(header)) if header else {"mode": 0}

    def get(self, path: str) -> Any | None:
        """A tar stream of ``path`` (close it when done); None when it is missing."""
        try:
            stream, _ = self._api.get_archive(self._cid, path)
        except docker.errors.NotFound:
            return None
        except docker.errors.APIError as exc:
            raise BackendError(str(exc.explanation or exc)) from None
        except (requests.exceptions.RequestException, OSError) as exc:
            raise BackendError(f"the engine is unreachable: {exc}") from None
        return stream

    def put(self, directory: str, tar: bytes) -> None:
        """Unpack ``tar`` into ``directory``."""
        try:
            self._api.put_archive(self._cid, directory, tar)
        except docker.errors.APIError as exc:
            raise BackendError(str(exc.explanation or exc)) from None
        except (requests.exceptions.RequestException, OSError) as exc:
            raise BackendError(f"the engine is unreachable: {exc}") from None
