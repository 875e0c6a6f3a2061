"""The raw output of the image tools, read as phases for the progress display. Pure, no I/O.

Each parser is fed one line at a time (``feed``) and answers the ``Phase`` to show when it
changed, else ``None``; a phase's ``name`` changing is a new phase (one line when stderr is not
a terminal), its ``detail`` (the package or the last output line) is shown on a terminal only.
``error`` keeps the tool's own error message for the exception.

- ``BootstrapPhases``: debootstrap's ``I:``/``W:``/``E:`` lines (the package index, resolving,
  retrieving, extracting, unpacking and configuring packages);
- ``LegacyPhases``: the legacy builder's stream (``Step 3/9 : RUN ...``);
- ``BuildKitPhases``: ``docker buildx build --progress=plain`` (``#6 [2/4] RUN ...``,
  ``#9 exporting to image``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
NAME_WIDTH = 72
"""How long a phase name may be (a RUN step's whole shell script is not a phase name)."""
_NOISE = ("DEPRECATED: The legacy builder is deprecated",)
"""Lines never shown but with -v: the docker CLI's deprecation notice for the legacy builder
(the Engine API build does not print it; a wrapper might)."""


@dataclass(frozen=True)
class Phase:
    name: str
    detail: str = ""

    def text(self) -> str:
        return f"{self.name} ({self.detail})" if self.detail else self.name


def clean(line: str) -> str:
    """A raw line as shown: no colour codes, the last of its carriage-return rewrites, no
    trailing blanks."""
    text = _ANSI.sub("", line).rstrip("\r\n")
    if "\r" in text:
        text = text.rstrip("\r").rsplit("\r", 1)[-1]
    return text.rstrip()


def is_noise(line: str) -> bool:
    return line.lstrip().startswith(_NOISE)


def shorten(text: str, width: int = NAME_WIDTH) -> str:
    """Whitespace collapsed, cut to ``width`` with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3].rstrip() + "..."


class LineSplitter:
    """Chunks of a stream (cut anywhere) -> whole lines, cleaned."""

    def __init__(self) -> None:
        self._rest = ""

    def feed(self, text: str) -> list[str]:
        *lines, self._rest = (self._rest + text).split("\n")
        return [clean(line) for line in lines]

    def flush(self) -> list[str]:
        rest, self._rest = self._rest, ""
        last = clean(rest)
        return [last] if last else []


class BootstrapPhases:
    """debootstrap's plain output. It never prints how many packages it will fetch, so the
    phases count what was done so far (``retrieving packages (#57 libc6)``)."""

    PREFIX = "debootstrap: "
    _INDEX = "fetching the package index"
    _SECTIONS: ClassVar[dict[str, str]] = {
        "Installing core packages...": "installing core packages",
        "Unpacking required packages...": "unpacking required packages",
        "Configuring required packages...": "configuring required packages",
        "Unpacking the base system...": "unpacking the base system",
        "Configuring the base system...": "configuring the base system",
        "Base system installed successfully.": "base system installed",
    }

    def __init__(self) -> None:
        self.error: str | None = None
        self.warnings: list[str] = []
        self.retrieved = 0
        self._name: str | None = None
        self._count = 0

    def _phase(self, name: str, detail: str = "") -> Phase:
        full = self.PREFIX + name
        if full != self._name:
            self._name, self._count = full, 0
        return Phase(full, detail)

    def _item(self, name: str, package: str) -> Phase:
        phase = self._phase(name)
        self._count += 1
        return Phase(phase.name, f"#{self._count} {package}")

    def feed(self, line: str) -> Phase | None:
        text = line.strip()
        kind, _, message = text.partition(": ")
        if kind == "E":
            self.error = message if self.error is None else f"{self.error}; {message}"
            return None
        if kind == "W":
            self.warnings.append(message)
            return None
        if kind != "I" or not message:
            return None
        words = message.split()
        verb = words[0]
        if message in self._SECTIONS:
            return self._phase(self._SECTIONS[message])
        if verb == "Retrieving" and len(words) == 2:  # InRelease, Release, Packages
            return self._phase(self._INDEX)
        if verb == "Retrieving":
            self.retrieved += 1
            return self._item("retrieving packages", words[1])
        if message.startswith(("Checking Release", "Valid Release", "Target architecture")):
            return self._phase(self._INDEX)
        if verb == "Validating" and len(words) == 2:
            return self._phase(self._INDEX)
        if message.startswith(("Resolving dependencies", "Checking component", "Found additional")):
            return self._phase("resolving dependencies")
        if verb == "Extracting" and message.endswith("..."):
            return self._item("extracting packages", words[1].removesuffix("..."))
        if verb in ("Unpacking", "Configuring") and message.endswith("...") and self._name:
            section = self._name.removeprefix(self.PREFIX)
            if section.startswith(verb.lower()):  # a package within its section
                return self._item(section, words[1].removesuffix("..."))
            return self._item(f"{verb.lower()} packages", words[1].removesuffix("..."))
        return None  # Validating one package, the extractor chosen, a keyring note...


_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
RECORDING = "recording the base and context in labels"


class LegacyPhases:
    """The legacy builder's stream: a phase per ``Step i/n``, the step's last output line (or
    ``cached``) as the detail."""

    def __init__(self) -> None:
        self.error: str | None = None
        self.step: str | None = None

    def feed(self, line: str) -> Phase | None:
        text = line.strip()
        step = _STEP.match(text)
        if step and step[3].startswith("LABEL sandboxrun."):
            self.step = RECORDING  # the legacy builder adds a step per label: one phase
            return Phase(self.step)
        if step:
            self.step = shorten(f"step {step[1]}/{step[2]} {step[3]}")
            return Phase(self.step)
        if self.step is None or not text or is_noise(text):
            return None
        if text == "---> Using cache":
            return Phase(self.step, "cached")
        if text.startswith(("---> ", "Removing intermediate container ", "Successfully ")):
            return None
        return Phase(self.step, shorten(text, 60))


_VERTEX = re.compile(r"^#(\d+) (.*)$")
_BK_STEP = re.compile(r"^\[\s*(?:(?P<stage>[^\]]*?)\s+)?(?P<i>\d+)/(?P<n>\d+)\]\s+(?P<what>.*)$")
_BK_OUTPUT = re.compile(r"^\d+\.\d+ (.*)$")
_EXPORT = (
    "exporting",
    "writing image",
    "naming to",
    "sending tarball",
    "importing to docker",
    "unpacking to",
)
_FAILED = re.compile(r"^(?:ERROR|error): (?:failed to build: )?(?:failed to solve: )?(.*)$")


class BuildKitPhases:
    """``docker buildx build --progress=plain``: ``#N <vertex>`` opens a vertex (a step
    ``[i/n] RUN ...``, ``[internal] load ...``, ``exporting to image``), later ``#N`` lines
    are its status (``CACHED``, ``DONE 1.2s``, ``ERROR: ...``) or its timestamped output."""

    def __init__(self) -> None:
        self.error: str | None = None
        self.step: str | None = None
        self._vertices: dict[str, str] = {}

    def _name(self, vertex: str) -> str:
        step = _BK_STEP.match(vertex)
        if step:
            stage = f"{step['stage']} " if step["stage"] else ""
            return shorten(f"step {stage}{step['i']}/{step['n']} {step['what']}")
        if vertex.startswith(_EXPORT):
            return "exporting"
        return "preparing"

    def feed(self, line: str) -> Phase | None:
        text = line.strip()
        vertex = _VERTEX.match(text)
        if vertex is None:
            failed = _FAILED.match(text)
            if failed:
                self.error = failed[1]
            return None
        number, rest = vertex[1], vertex[2].strip()
        if rest.startswith("ERROR:"):
            self.error = self.error or rest.removeprefix("ERROR:").strip()
            return None
        header = _BK_STEP.match(rest) is not None or number not in self._vertices
        if header and number != "0":
            name = self._name(rest)
            self._vertices[number] = name
            if name.startswith("step "):
                self.step = name
            if name == "preparing" and self.step is not None:
                return None  # a late metadata load is not worth leaving a step for
            return Phase(name, "" if name.startswith("step ") else shorten(rest, 60))
        known = self._vertices.get(number)
        if known is None or rest == "..." or rest.startswith("DONE"):
            return None
        if rest == "CACHED":
            return Phase(known, "cached")
        output = _BK_OUTPUT.match(rest)
        return Phase(known, shorten(output[1] if output else rest, 60))
