"""The CLI's progress bar: a session's progress reports drawn on stderr while a query runs.

rich's progress display loads only when a bar may be drawn (``ProgressDisplay``).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import ProgressColumn, TaskID

__all__ = ["PROGRESS_DELAY_SECONDS", "ProgressDisplay", "progress_display", "progress_option"]

progress_option = click.option(
    "--progress/--no-progress",
    "show_progress",
    default=None,
    help="Show a progress bar on stderr while a long job runs [default: when stderr is a "
    "terminal].",
)


@contextlib.contextmanager
def progress_display(show_progress: bool | None) -> Iterator[ProgressDisplay | None]:
    """A ``ProgressDisplay`` for the ``--progress`` choice (by default: when stderr is a
    terminal), or ``None`` when no bar is wanted; pass it as the ``progress`` callback."""
    if not (sys.stderr.isatty() if show_progress is None else show_progress):
        yield None
        return
    with ProgressDisplay() as display:
        yield display


PROGRESS_DELAY_SECONDS = 0.5
"""A query that finishes sooner shows no progress bar at all."""


def _elapsed(start: float) -> ProgressColumn:
    """A column of the time since ``start``, when the display began (stages are separate
    tasks, each with its own clock)."""
    from rich.progress import ProgressColumn, Task
    from rich.text import Text

    class Elapsed(ProgressColumn):
        def render(self, task: Task) -> Text:
            return Text(str(timedelta(seconds=int(time.monotonic() - start))))

    return Elapsed()


class ProgressDisplay:
    """A transient progress bar on stderr fed by a session's progress reports.

    Used as the session's ``progress`` callback inside ``with``: it appears only once
    ``delay`` seconds have passed (so fast queries print nothing) and is erased on exit. Each
    stage is a bar with its description, percentage and the elapsed time; a stage that cannot
    say how far it is (fraction ``None``) pulses. ``console`` defaults to one on stderr.
    """

    def __init__(self, delay: float = PROGRESS_DELAY_SECONDS, console: Console | None = None):
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            _elapsed(time.monotonic()),
            console=console or Console(stderr=True, highlight=False, markup=False),
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._stage: str | None = None
        self._task: TaskID | None = None
        self._lock = threading.Lock()
        self._shown = self._closed = False
        self._timer = threading.Timer(delay, self._show)
        self._timer.daemon = True

    def __call__(self, stage: str, fraction: float | None) -> None:
        if stage != self._stage or self._task is None:
            if self._task is not None:
                self._bar.remove_task(self._task)
            self._task = self._bar.add_task(stage, total=None)
            self._stage = stage
        if fraction is not None:
            self._bar.update(self._task, total=1.0, completed=fraction)

    def _show(self) -> None:
        with self._lock:
            # A bar is drawn only on a terminal: in a pipe or a file it would be noise.
            if not self._closed and self._bar.console.is_terminal:
                self._bar.start()
                self._shown = True

    def __enter__(self) -> ProgressDisplay:
        self._timer.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._timer.cancel()
        with self._lock:
            self._closed = True
            if self._shown:
                self._bar.stop()
