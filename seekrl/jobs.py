"""The jobs behind the commands: build their components (seekrl/build.py), run them, release them.

    from seekrl.config import load_config
    from seekrl import jobs
    jobs.train(load_config("examples/tiny_grpo.yaml", ["train.steps=5"]))   # = seekrl train ...

`train`, `sft`, `evaluate`, `generate` and `curriculum` are what `seekrl train | sft | eval |
generate | curriculum` run,
and what `seekrl demo`, the recipes and `seekrl launch`'s trainer ranks call. A job that starts
engine servers stops them however it ends (normally, on an error, on Ctrl-C and on SIGTERM,
which `terminate_as_exit` turns into SystemExit so that the `finally` blocks run). Once a job has
released its components, glibc's free pages go back to the system (seekrl/memory.py), so that a
recipe running its stages in one process does not carry one stage's pages into the next.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import sys
from pathlib import Path

from seekrl import evaluate as evaluation
from seekrl import generate as generation
from seekrl.build import build_curriculum, build_eval, build_generate, build_rl, build_sft, curriculum_cache_key
from seekrl.config import Config
from seekrl.data.curriculum import informative_counts, read_curriculum, write_curriculum
from seekrl.engines.launch import terminate_as_exit
from seekrl.errors import DataError
from seekrl.memory import release as release_memory
from seekrl.train import rl
from seekrl.train import sft as supervised

__all__ = ["train", "sft", "evaluate", "generate", "curriculum"]


def _then_release(job):
    """`job`, then its components' memory back to the system: after it returned, its frame and
    what only it held are gone (gc.collect: and what cycles held)."""
    @functools.wraps(job)
    def run_then_release(cfg: Config):
        try:
            return job(cfg)
        finally:
            gc.collect()
            release_memory()
    return run_then_release


@_then_release
def train(cfg: Config) -> Path:
    """Run (or resume) RL training; return the run folder."""
    with terminate_as_exit():
        run = build_rl(cfg)
        try:
            return asyncio.run(rl.run(run))
        finally:
            run.close()


@_then_release
def sft(cfg: Config) -> Path:
    """Run (or resume) supervised fine-tuning; return the run folder."""
    return supervised.run(build_sft(cfg))


@_then_release
def evaluate(cfg: Config) -> dict[str, float]:
    """Evaluate `model.path` on `data.eval` with the training workflow (and tools); writes
    runs/<name>/eval/ and returns the metrics."""
    with terminate_as_exit():
        run = build_eval(cfg)
        try:
            return evaluation.run(run)
        finally:
            run.close()


@_then_release
def generate(cfg: Config) -> dict:
    """Play the agent loop against `generate.endpoint` (or the scripted teacher); returns counts."""
    return generation.run(build_generate(cfg))


@_then_release
def curriculum(cfg: Config) -> Path:
    """Measure the starting model's pass rate on every data.train task (`seekrl eval`'s evaluator,
    data.curriculum_k samples each) and write the data.curriculum cache (data/curriculum.py); a
    cache already measured for this config is kept as it is. Returns its path."""
    key = curriculum_cache_key(cfg)
    path = Path(cfg.data.curriculum) if cfg.data.curriculum else None
    if path is not None and path.is_file():
        try:
            read_curriculum(path, key)
            print(f"data.curriculum: {path} is up to date (same model, data, k, seed, sampling)", file=sys.stderr)
            return path
        except DataError:
            pass  # another key, or damaged: measured again
    with terminate_as_exit():
        run = build_curriculum(cfg)  # data.curriculum unset: a ConfigError
        try:
            _, groups = asyncio.run(evaluation.evaluate(run.workflow, run.engine, run.tasks, run.n, run.params,
                                                        run.primary_reward, progress=run.progress,
                                                        max_in_flight=run.max_in_flight))
        finally:
            run.close()
    counts = evaluation.pass_counts(groups)
    write_curriculum(path, key, counts)
    kept = sum(informative_counts(n, c) for _, n, c in counts)
    print(f"data.curriculum: {kept} of {len(counts)} tasks solved in some but not all of {run.n} samples; wrote {path}",
          file=sys.stderr)
    return path
