"""The jobs behind the commands: build their components (seekrl/build.py), run them, release them.

    from seekrl.config import load_config
    from seekrl import jobs
    jobs.train(load_config("examples/tiny_grpo.yaml", ["train.steps=5"]))   # = seekrl train ...

`train`, `sft`, `evaluate` and `generate` are what `seekrl train | sft | eval | generate` run,
and what `seekrl demo`, the recipes and `seekrl launch`'s trainer ranks call. A job that starts
engine servers stops them however it ends (normally, on an error, on Ctrl-C and on SIGTERM,
which `terminate_as_exit` turns into SystemExit so that the `finally` blocks run).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from seekrl import evaluate as evaluation
from seekrl import generate as generation
from seekrl.build import build_eval, build_generate, build_rl, build_sft
from seekrl.config import Config
from seekrl.engines.launch import terminate_as_exit
from seekrl.train import rl
from seekrl.train import sft as supervised

__all__ = ["train", "sft", "evaluate", "generate"]


def train(cfg: Config) -> Path:
    """Run (or resume) RL training; return the run folder."""
    with terminate_as_exit():
        run = build_rl(cfg)
        try:
            return asyncio.run(rl.run(run))
        finally:
            run.close()


def sft(cfg: Config) -> Path:
    """Run (or resume) supervised fine-tuning; return the run folder."""
    return supervised.run(build_sft(cfg))


def evaluate(cfg: Config) -> dict[str, float]:
    """Evaluate `model.path` on `data.eval` with the training workflow (and tools); writes
    runs/<name>/eval/ and returns the metrics."""
    with terminate_as_exit():
        run = build_eval(cfg)
        try:
            return evaluation.run(run)
        finally:
            run.close()


def generate(cfg: Config) -> dict:
    """Play the agent loop against `generate.endpoint` (or the scripted teacher); returns counts."""
    return generation.run(build_generate(cfg))
