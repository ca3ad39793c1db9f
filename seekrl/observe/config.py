"""The `log:` config section: the run folder, metrics (JSONL, TensorBoard, W&B), sample
trajectories and the progress display. observe/ reads it; `run_dir` names the run folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from seekrl.errors import ConfigError

__all__ = ["LogConfig", "run_dir"]


@dataclass
class LogConfig:
    dir: str = "runs"
    """Parent folder of run folders."""
    name: str | None = None
    """Run folder name; default: the config file's stem."""
    tensorboard: bool = True
    """Write TensorBoard event files."""
    wandb: bool = False
    """Log to Weights & Biases (needs `pip install wandb`)."""
    wandb_project: str = "seekrl"
    """W&B project."""
    samples_every: int = 1
    """Write trajectories/step_<N>.jsonl every N steps."""
    samples_groups: int = 4
    """Groups written per samples file."""
    progress: bool = True
    """Show a progress bar."""

    def check(self) -> None:
        name = self.name
        if name and (Path(name).is_absolute() or ".." in Path(name).parts or not Path(name).parts):
            raise ConfigError(f"log.name: '{name}' would put the run folder outside log.dir ('{self.dir}') or on it; "
                              "give a name inside it, without '..' or a leading '/' (e.g. my_run or sweeps/lr_1e-3); move runs with log.dir")


def run_dir(log: LogConfig) -> Path:
    """runs/<log.name>/ (the folder of a run's config, metrics, trajectories and checkpoints)."""
    return Path(log.dir) / (log.name or "run")
