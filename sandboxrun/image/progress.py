"""The progress display of ``sandboxrun image bootstrap|build`` (on stderr).

On a terminal: a live line (rich, imported here only when used) with the current phase, its
detail (the package, the step's last output line) and the elapsed time; each finished phase stays
above it with its duration. Elsewhere (a pipe, a file, CI logs): one plain line per phase change,
``sandboxrun: image build: step 3/7 RUN apt-get ... (12s)``. The tools' raw lines are shown only
with ``verbose``; the last ``tail_lines`` of them are kept and shown when the command fails.
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol, TextIO

from sandboxrun.image.phases import is_noise

TAIL_LINES = 20


class Progress(Protocol):
    """What ``images.bootstrap`` and ``images.build`` report to."""

    def phase(self, name: str, detail: str = "") -> None:
        """The current phase (a new ``name``) or its progress (a new ``detail``)."""

    def raw(self, line: str) -> None:
        """One raw line of the tool's output (debootstrap, the build log)."""

    def note(self, message: str) -> None:
        """Something the user should read whatever the mode (reusing, rebuilding because...)."""


def _seconds(elapsed: float) -> str:
    whole = int(elapsed)
    return f"{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"{whole}s"


def is_live_terminal(stream: TextIO) -> bool:
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        return False
    return tty and os.environ.get("TERM", "") != "dumb"


class Display:
    """A ``Progress`` that draws on ``stream`` (stderr by default); ``live`` forces the terminal
    display on or off (default: when ``stream`` is a terminal)."""

    def __init__(
        self,
        title: str,
        *,
        verbose: bool = False,
        stream: TextIO | None = None,
        live: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        tail_lines: int = TAIL_LINES,
    ) -> None:
        self.title = title
        self.verbose = verbose
        self.stream = stream if stream is not None else sys.stderr
        self.live = is_live_terminal(self.stream) if live is None else live
        self.clock = clock
        self.tail: deque[str] = deque(maxlen=tail_lines)
        self.started = clock()
        self._name: str | None = None
        self._name_started = self.started
        self._rich: Any = None  # rich.progress.Progress while live
        self._task: Any = None
        self._console: Any = None
        if self.live:
            self._start_live()

    # -- Progress -------------------------------------------------------------------------------

    def phase(self, name: str, detail: str = "") -> None:
        now = self.clock()
        changed = name != self._name
        if changed:
            if self._name is not None and self._rich is not None:
                self._above(f"  {self._name} ({_seconds(now - self._name_started)})")
            self._name, self._name_started = name, now
            if self._rich is None:
                self._line(f"sandboxrun: {self.title}: {name} ({_seconds(now - self.started)})")
        if self._rich is not None:  # a new phase is drawn at once, a detail at the next tick
            text = f"{self.title}: {name}" + (f" ({detail})" if detail else "")
            self._rich.update(self._task, description=text, refresh=changed)

    def raw(self, line: str) -> None:
        if is_noise(line) and not self.verbose:
            return
        if line.strip():
            self.tail.append(line)
        if self.verbose:
            self._say(line)

    def note(self, message: str) -> None:
        self._say(f"sandboxrun: {self.title}: {message}")

    # -- the end --------------------------------------------------------------------------------

    def elapsed(self) -> str:
        return _seconds(self.clock() - self.started)

    def done(self, message: str) -> None:
        """Stop the live line; print the last phase's duration and ``message``."""
        self._finish()
        self._line(f"sandboxrun: {self.title}: {message} in {self.elapsed()}")

    def failed(self) -> None:
        """Stop the live line; show the last raw lines (unless -v showed them all already)."""
        self._finish()
        if self.tail and not self.verbose:
            self._line(f"sandboxrun: {self.title}: the last {len(self.tail)} lines of the log:")
            for line in self.tail:
                self._line(f"  | {line}")

    def close(self) -> None:
        self._stop_live()

    def __enter__(self) -> Display:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_live()

    # -- drawing --------------------------------------------------------------------------------

    def _line(self, text: str) -> None:
        try:
            self.stream.write(text + "\n")
            self.stream.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass  # a closed stderr must not fail the build

    def _say(self, text: str) -> None:
        if self._rich is not None:
            self._above(text)
        else:
            self._line(text)

    def _above(self, text: str) -> None:
        from rich.text import Text

        self._console.print(Text(text), soft_wrap=True)

    def _finish(self) -> None:
        if self._rich is not None and self._name is not None:
            self._above(f"  {self._name} ({_seconds(self.clock() - self._name_started)})")
        self._stop_live()

    def _start_live(self) -> None:
        try:
            from rich.console import Console
            from rich.progress import Progress as RichProgress
            from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn
            from rich.table import Column
        except ImportError:  # rich comes with typer; without it, plain lines
            self.live = False
            return
        self._console = Console(file=self.stream, force_terminal=True, highlight=False)
        self._rich = RichProgress(
            SpinnerColumn(),
            TextColumn(
                "{task.description}",
                markup=False,
                table_column=Column(ratio=1, no_wrap=True, overflow="ellipsis"),
            ),
            TimeElapsedColumn(),
            console=self._console,
            transient=True,
            expand=True,
        )
        self._task = self._rich.add_task(f"{self.title}: starting", total=None)
        self._rich.start()

    def _stop_live(self) -> None:
        if self._rich is not None:
            self._rich.stop()
            self._rich = None
