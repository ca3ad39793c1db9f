"""The `data:` config section: which tasks to train and evaluate on, and how rows become prompts.
data/sets.py reads it (`load_task_sets`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from seekrl.data.tiny import KINDS
from seekrl.errors import ConfigError
from seekrl.schema import did_you_mean

__all__ = ["DataConfig", "DATA_SLICE", "TINY_ROWS"]

DATA_SLICE = re.compile(r"^(?P<spec>.+)\[(?P<start>-?\d*):(?P<stop>-?\d*)\]$")  # 'hotpotqa[200:]'
TINY_ROWS = 512  # rows of a tiny:<kind> source when it is sliced (data/sets.py)


@dataclass
class DataConfig:
    train: str = "tiny:copy"
    """Training tasks: a builtin ('gsm8k', 'gsm8k:test', 'math500', 'hotpotqa', 'tiny:copy', ...), a .jsonl/.json/.parquet file or datasets folder; several joined by commas; a trailing [a:b] slices the rows ('hotpotqa[200:]')."""
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

    def check(self) -> None:
        """data.train / data.eval: every comma-separated source's trailing [start:stop] holds integers
        and can select rows (a slice empty whatever the source holds is refused here, others when the
        data loads); tiny:<kind> names a kind that exists."""
        if not self.train.strip():
            raise ConfigError("data.train is empty; name a data set (e.g. data.train=gsm8k or data.train=tiny:copy)")
        for key, spec in (("data.train", self.train), ("data.eval", self.eval or "")):
            for part in (x.strip() for x in spec.split(",")):
                _check_source(key, part)


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
