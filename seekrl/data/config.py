"""The `data:` config section: which tasks to train and evaluate on, and how rows become prompts.
data/sets.py reads it (`load_task_sets`).

`data.train` is one source (a string, as `data.eval`), or a mixture: a list of sources with
weights, each step's tasks drawn from them by weight (data/mixture.py):

    data:
      train: [{name: hotpotqa.jsonl, weight: 0.7}, {name: nq.jsonl, weight: 0.3}]
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from seekrl.data.tiny import KINDS
from seekrl.errors import ConfigError
from seekrl.schema import Range, did_you_mean

__all__ = ["DataConfig", "DataSource", "DATA_SLICE", "TINY_ROWS"]

DATA_SLICE = re.compile(r"^(?P<spec>.+)\[(?P<start>-?\d*):(?P<stop>-?\d*)\]$")  # 'hotpotqa[200:]'
TINY_ROWS = 512  # rows of a tiny:<kind> source when it is sliced (data/sets.py)


@dataclass
class DataSource:
    """One source of a `data.train` mixture."""

    name: str = ""
    """The source, in any form data.train takes as a string (a builtin, a file, a slice, several joined by commas)."""
    weight: float = 1.0
    """Its share of each step's tasks, relative to the other sources' weights (>= 0)."""


@dataclass
class DataConfig:
    train: str | list[DataSource] = "tiny:copy"
    """Training tasks: a builtin ('gsm8k', 'gsm8k:test', 'math500', 'hotpotqa', 'tiny:copy', ...), a .jsonl/.json/.parquet file or datasets folder; several joined by commas; a trailing [a:b] slices the rows ('hotpotqa[200:]'). A mixture: a list of sources with weights, [{name: hotpotqa.jsonl, weight: 0.7}, {name: nq.jsonl, weight: 0.3}], each step's tasks drawn by weight."""
    eval: str | None = None
    """Evaluation tasks (same forms as `train`); none disables evaluation."""
    converter: Literal["auto", "verl", "gsm8k", "math", "qa", "fields"] = "auto"
    """Row format: auto | verl | gsm8k | math | qa | fields (generic rows with prompt_field/answer_field)."""
    prompt_field: str | None = None
    """Field holding the question (generic rows)."""
    answer_field: str | None = None
    """Field holding the ground truth (generic rows)."""
    template: Literal["plain", "math_boxed", "gsm8k", "r1", "search_r1"] | None = None
    """Prompt preset: plain | math_boxed | gsm8k | r1 | search_r1; none keeps verl prompts as they are and uses 'plain' otherwise."""
    system_prompt: str | None = None
    """System message; overrides the preset's."""
    user_template: str | None = None
    """User message with {question}; overrides the preset's."""
    max_train: int | None = None
    """Use at most this many training tasks."""
    max_eval: int | None = 100
    """Evaluate on at most this many tasks."""
    shuffle: bool = True
    """Reshuffle the training tasks every epoch (seeded by train.seed)."""
    ptx: str | None = None
    """PPO-ptx's supervised examples (with algo.ptx_coef > 0): a file in `seekrl sft`'s formats (conversations, or agent episodes as `seekrl generate` writes them, tool output masked)."""
    ptx_batch: Annotated[int, Range(ge=1)] = 8
    """data.ptx examples in each optimizer step of the policy."""
    ptx_tokens: Literal["all", "last"] = "all"
    """Which of data.ptx's assistant tokens the PPO-ptx loss trains: all (as `seekrl sft` does) | last (only each example's last assistant turn: an agent episode's answer, not its searches; it holds the answer's form and nothing of the searching: in the HotpotQA recipe the policy then learned to answer without searching, RESULTS.md)."""
    curriculum: str | None = None
    """A curriculum cache (JSON) written by `seekrl curriculum CONFIG`: RL trains only on the data.train questions that model.path solved in some but not all of curriculum_k samples (0 < pass rate < 1); a missing file or one measured for another model, data, k, seed, temperature or token budget stops the run before the model loads."""
    curriculum_k: Annotated[int, Range(ge=2)] = 8
    """data.curriculum: samples per training question when the pass rate is measured (at rollout.temperature)."""
    curriculum_seed: int | None = None
    """data.curriculum: the seed of the pass-rate measurement (null: train.seed); a fixed value lets runs with different train.seed train on one measured curriculum."""

    skip_flat: Annotated[int, Range(ge=0, text=">= 0 (0: off)")] = 0
    """Online curriculum (rollout.mode=sync): a training task whose group had no reward spread (it trained nothing, by algo.filter_zero_std's rule) in its last skip_flat rollouts in a row is left out of each later epoch's order with probability data.skip_flat_prob, until a rollout of it has spread again; every epoch keeps at least one batch; the counts are in the checkpoint (data/skip.py). 0: off."""
    skip_flat_prob: Annotated[float, Range(gt=0.0, le=1.0)] = 0.8
    """data.skip_flat: the probability that an epoch leaves out a task whose count reached data.skip_flat (below 1, a left-out task comes back now and then, so the pool follows the policy and does not shrink to the few tasks that had spread once)."""
    skip_flat_keep: Annotated[float, Range(ge=0.0, lt=1.0)] = 0.0
    """data.skip_flat: the smallest fraction of the training tasks every epoch keeps; when more would be left out, the ones left out are those with the longest runs without spread (0: no floor, the pool shrinks as the policy trains)."""

    def check(self) -> None:
        """data.train / data.eval: every comma-separated source's trailing [start:stop] holds integers
        and can select rows (a slice empty whatever the source holds is refused here, others when the
        data loads); tiny:<kind> names a kind that exists."""
        if isinstance(self.train, list):
            specs = _check_mixture(self.train)
        elif not self.train.strip():
            raise ConfigError("data.train is empty; name a data set (e.g. data.train=gsm8k or data.train=tiny:copy)")
        else:
            specs = [("data.train", self.train)]
        for key, spec in (*specs, ("data.eval", self.eval or "")):
            for part in (x.strip() for x in spec.split(",")):
                _check_source(key, part)


def _check_mixture(sources: list[DataSource]) -> list[tuple[str, str]]:
    """A mixture's sources: names given once, weights finite and >= 0, not all 0; (key, name) of each."""
    example = "[{name: hotpotqa.jsonl, weight: 0.7}, {name: nq.jsonl, weight: 0.3}]"
    if not sources:
        raise ConfigError(f"data.train is an empty list; name a data set, or list sources with weights: {example}")
    seen: dict[str, int] = {}
    for i, s in enumerate(sources):
        name = s.name.strip()
        if not name:
            raise ConfigError(f"data.train[{i}].name is empty; name the source's data set or file, e.g. {example}")
        if not math.isfinite(s.weight) or s.weight < 0:
            raise ConfigError(f"data.train[{i}].weight: must be a finite number >= 0, got {s.weight} ('{name}'); weights are "
                              "relative shares of each step's tasks (e.g. 0.7 and 0.3)")
        if name in seen:
            raise ConfigError(f"data.train[{i}]: '{name}' is listed twice (also data.train[{seen[name]}]); list it once, with "
                              "the weights added")
        seen[name] = i
    if not any(s.weight > 0 for s in sources):
        raise ConfigError("data.train: every weight is 0, so no task can be drawn; give at least one source a weight > 0")
    return [(f"data.train[{i}]", s.name) for i, s in enumerate(sources)]


def _check_source(key: str, part: str) -> None:
    try:
        if not part or Path(part).exists():
            return
    except OSError as e:  # a name too long for the file system
        raise ConfigError(f"{key}: '{part[:80]}...' is not a usable file name ({e.strerror})") from None
    source = part
    if part.endswith("]") and "[" in part:
        m = DATA_SLICE.match(part)
        source = part[: part.rindex("[")]
        if m is None:
            raise ConfigError(f"{key}: '{part}' ends in a slice that is not [start:stop] with integers "
                              f"(e.g. {source}[0:200] or {source}[200:])")
        start, stop = (int(m[k]) if m[k] else None for k in ("start", "stop"))
        lo = start or 0
        tiny = source.startswith("tiny:")
        empty = (not range(TINY_ROWS)[start:stop]) if tiny else (stop is not None and (lo >= 0) == (stop >= 0) and stop <= lo)
        if empty:
            has = f"{source} has {TINY_ROWS} rows" if tiny else "empty whatever the source holds"
            hint = f"{source}[{stop}:{start}]" if start is not None and stop is not None and start > stop else f"{source}[0:200]"
            raise ConfigError(f"{key}: '{part}' selects no rows ({has}); rows start..stop-1 are taken, e.g. {hint}")
    if source.startswith("tiny:") and source[5:].partition(":")[0] not in KINDS:
        kind = source[5:].partition(":")[0]
        raise ConfigError(f"{key}: unknown tiny task '{kind}' in '{part}'; choose one of "
                          f"{', '.join('tiny:' + k for k in KINDS)}{did_you_mean(kind, KINDS, 'tiny:', list_known=False)}")
