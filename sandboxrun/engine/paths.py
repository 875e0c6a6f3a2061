"""The workspace, the working directory inside it, and host <-> container path mapping.

``Workspace.open`` and ``Workspace.resolve_workdir`` consult the filesystem (resolving every
symlink); ``to_container`` and ``to_host`` are purely lexical. A workdir is judged by where it
finally resolves, except that a relative workdir or a ``/workspace/...`` one may not climb out
with ``..`` even lexically. Containment is checked before existence, so a workdir that escapes
(by ``..`` or through a symlink) is reported as escaping whether or not its target exists.

``resolve_workdir`` validates at one moment: a command that can write the workspace can swap a
directory for a symlink afterwards. Callers must start the child in the *returned* canonical
path, and only before any untrusted command has run in the workspace.
"""

from __future__ import annotations

import errno
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sandboxrun.errors import WorkspaceError

CONTAINER_ROOT = PurePosixPath("/workspace")


def host_has_container_root() -> bool:
    """Whether this host has a ``/workspace`` of its own: then its paths are this host's
    (a local sandbox keeps the workspace's host path; ``--mask /workspace/x`` is not mapped)."""
    return os.path.lexists(str(CONTAINER_ROOT))


def _resolve_strict(path: Path, shown: str, what: str) -> Path:
    """``path.resolve(strict=True)`` with every failure turned into ``WorkspaceError``."""
    try:
        return path.resolve(strict=True)
    except FileNotFoundError:
        problem = "does not exist"
    except NotADirectoryError:
        problem = "does not exist (a component of it is not a directory)"
    except PermissionError:
        problem = "cannot be accessed (permission denied)"
    except RuntimeError:  # Python 3.11 reports symlink loops as RuntimeError
        problem = "is a symlink loop"
    except OSError as exc:
        problem = "is a symlink loop" if exc.errno == errno.ELOOP else f"is unusable ({exc})"
    raise WorkspaceError(f"{what} {shown!r} {problem}")


@dataclass(frozen=True)
class Workspace:
    """A host directory shared with the command. ``root`` is canonical and absolute."""

    root: Path

    def __post_init__(self) -> None:
        if not self.root.is_absolute():
            raise WorkspaceError(f"workspace root {str(self.root)!r} must be absolute")

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Workspace:
        """Canonicalize ``path``: it must exist, be a directory, and not be ``/``."""
        shown = os.fspath(path)
        if not shown:
            raise WorkspaceError("workspace path is empty")
        if "\0" in shown:
            raise WorkspaceError(f"workspace {shown!r} contains a NUL byte")
        root = _resolve_strict(Path(shown), shown, "workspace")
        if not root.is_dir():
            raise WorkspaceError(f"workspace {shown!r} is not a directory")
        if root == Path(root.anchor):
            raise WorkspaceError(f"workspace {shown!r} resolves to {str(root)!r}: refusing '/'")
        return cls(root)

    def _inside(self, path: Path) -> bool:
        return path == self.root or self.root in path.parents

    def _escapes(self, workdir: str) -> WorkspaceError:
        return WorkspaceError(f"workdir {workdir!r} escapes the workspace {str(self.root)!r}")

    def resolve_workdir(self, workdir: str | None) -> Path:
        """The canonical host directory for ``workdir``.

        ``workdir`` is relative to the workspace (``None``, ``""`` and ``"."`` mean the root).
        An absolute path is accepted when it lies inside the workspace on the host; otherwise a
        path under ``/workspace`` is taken as a container path and mapped (``to_host``).
        """
        if not workdir:
            workdir = "."
        if "\0" in workdir:
            raise WorkspaceError(f"workdir {workdir!r} contains a NUL byte")
        if workdir.startswith("/"):
            lexical = posixpath.normpath(workdir)
            if not self._inside(Path(lexical)) and PurePosixPath(lexical).is_relative_to(
                CONTAINER_ROOT
            ):
                candidate = self.to_host(workdir)
            else:
                candidate = Path(workdir)
        else:
            if posixpath.normpath(workdir).split("/")[0] == "..":
                raise self._escapes(workdir)
            candidate = self.root / workdir
        # Containment first, without strictness, so that nothing is revealed about the outside.
        if not self._inside(Path(os.path.realpath(candidate))):
            raise self._escapes(workdir)
        resolved = _resolve_strict(candidate, workdir, "workdir")
        if not self._inside(resolved):
            raise self._escapes(workdir)
        if not resolved.is_dir():
            raise WorkspaceError(f"workdir {workdir!r} is not a directory")
        return resolved

    def to_container(self, host_path: Path) -> PurePosixPath:
        """``<root>/a/b`` -> ``/workspace/a/b``, lexically; outside the root: ``WorkspaceError``."""
        text = os.fspath(host_path)
        if "\0" in text or not text.startswith("/"):
            raise WorkspaceError(f"host path {text!r} must be absolute and contain no NUL")
        normal = Path(os.path.normpath(text))
        if not self._inside(normal):
            raise WorkspaceError(f"host path {text!r} is outside the workspace {str(self.root)!r}")
        return CONTAINER_ROOT.joinpath(*normal.relative_to(self.root).parts)

    def to_host(self, container_path: str | PurePosixPath) -> Path:
        """``/workspace/a/b`` -> ``<root>/a/b``, lexically; any step out of ``/workspace`` fails."""
        text = str(container_path)
        if "\0" in text:
            raise WorkspaceError(f"container path {text!r} contains a NUL byte")
        parts = [p for p in text.split("/") if p not in ("", ".")]
        if not text.startswith("/") or parts[:1] != [CONTAINER_ROOT.name]:
            raise WorkspaceError(f"container path {text!r} is not under {str(CONTAINER_ROOT)!r}")
        stack: list[str] = []
        for part in parts[1:]:
            if part != "..":
                stack.append(part)
            elif stack:
                stack.pop()
            else:
                raise WorkspaceError(f"container path {text!r} climbs out of {CONTAINER_ROOT}")
        return self.root.joinpath(*stack)
