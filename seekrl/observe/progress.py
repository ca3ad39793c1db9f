"""Show training progress: a rich progress bar on a terminal, one plain line per step elsewhere.

On a TTY (or with `force_bar=True`) a rich bar on stderr shows step/total, reward mean, the
last step's wall time, ETA and any extra fields. When stderr is not a terminal (CI, a log file,
`nohup`) the bar would only print control codes, so instead one plain line per step goes to
stderr:

    step 3/10 reward=0.41 time=1.2s kl=0.0031

`enabled=False` prints nothing at all.

    with Progress(total_steps=10, fields=("loss/policy",)) as progress:
        for step in range(1, 11):
            metrics = train_step()
            progress.update(step, metrics)
"""

from __future__ import annotations

import sys
import time
from typing import Any, Sequence, TextIO

__all__ = ["Progress", "REWARD_KEYS"]

REWARD_KEYS = ("reward/mean", "reward", "rewards/mean")


def _fmt(value: Any) -> str:
    """Short human form: 3 significant digits for floats, as-is for the rest."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


class Progress:
    """Progress display for the RL / SFT loops; see the module docstring.

    Args:
        total_steps: the last step number.
        start_step: steps already done (resuming); the bar starts there.
        enabled: False prints nothing.
        fields: metric keys shown besides reward and time (when present in `metrics`).
        force_bar: draw the rich bar even when stderr is not a terminal.
        stream: where output goes (stderr by default).
    """

    def __init__(
        self,
        total_steps: int,
        start_step: int = 0,
        enabled: bool = True,
        fields: Sequence[str] = (),
        force_bar: bool = False,
        stream: TextIO | None = None,
    ) -> None:
        self.total_steps = int(total_steps)
        self.start_step = int(start_step)
        self.enabled = enabled
        self.fields = tuple(fields)
        self.stream = stream if stream is not None else sys.stderr
        is_tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.use_bar = enabled and (is_tty or force_bar)
        self._last_time = time.perf_counter()
        self._bar = None
        self._task = None
        self._started = False
        if self.use_bar:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("[bold]step"),
                MofNCompleteColumn(),
                BarColumn(),
                TimeElapsedColumn(),
                TextColumn("<"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
                console=Console(file=self.stream, force_terminal=True if force_bar else None),
                transient=False,
            )
            self._task = self._bar.add_task("train", total=self.total_steps, completed=self.start_step, info="")

    def __enter__(self) -> "Progress":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Start drawing (the context manager calls this)."""
        self._last_time = time.perf_counter()
        if self._bar is not None and not self._started:
            self._bar.start()
            self._started = True

    def close(self) -> None:
        """Stop drawing and leave the final bar on screen."""
        if self._bar is not None and self._started:
            self._bar.stop()
            self._started = False

    def describe(self, step: int, metrics: dict[str, Any] | None = None, step_time: float | None = None, **extra: Any) -> str:
        """The plain line for one step: `step 3/10 reward=0.41 time=1.2s kl=0.0031`."""
        metrics = metrics or {}
        parts = [f"step {step}/{self.total_steps}"]
        for key in REWARD_KEYS:
            if key in metrics and metrics[key] is not None:
                parts.append(f"reward={_fmt(metrics[key])}")
                break
        if step_time is not None:
            parts.append(f"time={step_time:.1f}s")
        for key in self.fields:
            if key in metrics and metrics[key] is not None:
                parts.append(f"{key}={_fmt(metrics[key])}")
        parts.extend(f"{key}={_fmt(value)}" for key, value in extra.items())
        return " ".join(parts)

    def update(self, step: int, metrics: dict[str, Any] | None = None, step_time: float | None = None, **extra: Any) -> None:
        """Report that `step` finished with `metrics`; `extra` fields are shown as given. `step_time`:
        the step's wall time when the caller knows it (`seekrl launch` reads steps from metrics.jsonl
        after the fact); default: the time since the last update."""
        now = time.perf_counter()
        measured, self._last_time = now - self._last_time, now
        step_time = measured if step_time is None else step_time
        if not self.enabled:
            return
        line = self.describe(step, metrics, step_time, **extra)
        if self._bar is not None:
            if not self._started:
                self.start()
            info = line.split(" ", 2)[2] if line.count(" ") >= 2 else ""  # drop "step N/M"
            self._bar.update(self._task, completed=step, info=info)
        else:
            print(line, file=self.stream, flush=True)
