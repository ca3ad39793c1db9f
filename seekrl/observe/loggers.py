"""Write a run's scalar metrics: JSONL always, TensorBoard by default, Weights & Biases on request.

`run_dir/metrics.jsonl` holds one JSON object per logged step, `{"step": N, ...metrics}`, with
"step" first and each line flushed as it is written, so a crashed run keeps every finished
step. NaN and ±inf are written as `null` (strict JSON, readable by any tool). TensorBoard
event files go to `run_dir/tensorboard/` (view with `tensorboard --logdir run_dir`).

Resuming: `RunLogger(run_dir, resume_step=N)` drops the lines of metrics.jsonl whose step is
greater than N (steps logged after the checkpoint that the run resumes from, which the resumed
run logs again) and purges TensorBoard events after N, so no step appears twice. A fresh start
(`resume_step=None`) in a folder an earlier attempt logged to (a rerun whose checkpoints were
deleted) starts over: that attempt's step rows and events are dropped, not mixed with the new ones.
The step samples `trajectories/step_<N>.jsonl` (observe/samples.py, written by the RL loop) after
the kept step go with them, so the folder never shows an earlier attempt's episodes as this run's.

    logger = RunLogger("runs/demo", config=cfg_dict)
    logger.log({"reward/mean": 0.4, "loss/policy": 0.1}, step=1)
    logger.close()
    rows = read_metrics("runs/demo")
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from seekrl.observe.config import LogConfig

__all__ = ["RunLogger", "NullLogger", "read_metrics", "METRICS_FILE", "SAMPLES_DIR"]

METRICS_FILE = "metrics.jsonl"
SAMPLES_DIR = "trajectories"  # run_dir/trajectories/step_<N>.jsonl: the RL loop's sample episodes of step N


def _scalar(value: Any) -> Any:
    """Tensors / numpy scalars → python numbers; non-finite floats → None; strings kept."""
    if hasattr(value, "detach"):
        value = value.detach()
        value = value.item() if value.numel() == 1 else value.tolist()
    elif hasattr(value, "item") and not isinstance(value, (int, float, str)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
    """All rows of `run_dir/metrics.jsonl` in file order ([] if there is none).

    A final line left half-written by a killed process is skipped.
    """
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _drop_samples_after(folder: Path, step: int) -> None:
    """Delete `folder/step_<N>.jsonl` for N > `step` (the step samples of steps that are logged again)."""
    for f in folder.glob("step_*.jsonl"):
        n = f.stem.removeprefix("step_")
        if n.isdigit() and int(n) > step:
            f.unlink(missing_ok=True)


def _truncate_after(path: Path, step: int) -> None:
    """Rewrite `path` keeping only rows with step <= `step` (atomically, via a temp file)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a half-written line from the crash
        if not isinstance(row, dict) or row.get("step") is None or row["step"] <= step:
            kept.append(line)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(f"{line}\n" for line in kept))
    os.replace(tmp, path)


class RunLogger:
    """Log scalar metrics per step to JSONL, TensorBoard and (optionally) W&B.

    Args:
        run_dir: the run's folder (created if needed).
        tensorboard: also write TensorBoard event files to run_dir/tensorboard/.
        wandb: also log to Weights & Biases (needs `pip install wandb`; checked here).
        wandb_project: W&B project name.
        config: the resolved run config, attached to W&B and to TensorBoard as text.
        resume_step: the step the run resumes from; later rows are dropped (module docstring).
            None: a fresh start, which drops every step row an earlier attempt left in run_dir.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        tensorboard: bool = True,
        wandb: bool = False,
        wandb_project: str | None = None,
        config: dict | None = None,
        resume_step: int | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        self._wandb = None
        if wandb:  # fail at construction, before any training time is spent
            try:
                import wandb as wandb_module
            except ImportError:
                raise ImportError("log.wandb=true needs the wandb package: pip install wandb") from None
            self._wandb = wandb_module.init(
                project=wandb_project,
                name=self.run_dir.name,
                dir=str(self.run_dir),
                config=config,
                resume="allow" if resume_step is not None else None,
            )
        kept_through = resume_step if resume_step is not None else -1  # a fresh start keeps no step, not even step 0's eval
        _truncate_after(self.path, kept_through)
        _drop_samples_after(self.run_dir / SAMPLES_DIR, kept_through)
        self._file = open(self.path, "a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = kept_through + 1
            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"), purge_step=purge)
            if config is not None and resume_step is None:
                text = json.dumps(config, indent=2, default=str)
                self._tb.add_text("config", f"```\n{text}\n```", global_step=0)

    @classmethod
    def for_run(cls, log: LogConfig, run_dir: str | os.PathLike, config: dict | None = None,
                resume_step: int | None = None) -> RunLogger:
        """The logger the `log:` section asks for (log.tensorboard, log.wandb, log.wandb_project)."""
        return cls(run_dir, tensorboard=log.tensorboard, wandb=log.wandb, wandb_project=log.wandb_project, config=config,
                   resume_step=resume_step)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Append one row {"step": step, **metrics}; numbers go to TensorBoard / W&B too."""
        row: dict[str, Any] = {"step": int(step)}
        for key, value in metrics.items():
            if key != "step":
                row[key] = _scalar(value)
        self._file.write(json.dumps(row, allow_nan=False, default=str) + "\n")
        self._file.flush()
        numeric = {
            k: float(v) for k, v in row.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        if self._tb is not None:
            for key, value in numeric.items():
                self._tb.add_scalar(key, value, global_step=int(step))
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numeric, step=int(step))

    def close(self) -> None:
        """Flush and close every sink (safe to call twice)."""
        if not self._file.closed:
            self._file.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> "RunLogger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NullLogger:
    """What trainer ranks other than 0 log to: nothing (rank 0 writes the run's metrics)."""

    def log(self, metrics: dict[str, Any], step: int) -> None:
        pass

    def close(self) -> None:
        pass
