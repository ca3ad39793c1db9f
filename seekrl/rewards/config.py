"""The `reward:` config section: the reward functions of the rubric, their weights and parameters.
rewards/rubric.py reads it (`build_rubric`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from seekrl.errors import ConfigError
from seekrl.schema import Range

__all__ = ["RewardConfig"]


@dataclass
class RewardConfig:
    functions: list[str] = field(default_factory=lambda: ["math"])
    """Reward functions by name (math, gsm8k, boxed, format, tag_count, reasoning_steps, cosine, repetition, overlong, qa_em, qa_f1, subem, search_r1) or 'module:function'."""
    weights: list[float] | None = None
    """One weight per function; default 1.0 each."""
    overlong_buffer: int = 0
    """Soft overlong penalty buffer in tokens (function 'overlong'); 0 uses max_new_tokens/4."""
    repetition_ngram: int = 3
    """n-gram size of the repetition penalty."""
    repetition_max_penalty: Annotated[float, Range(le=0, hint="e.g. -1.0")] = -1.0
    """Most negative repetition penalty."""
    cosine_max_len: int = 0
    """Length at which the cosine reward reaches its end value; 0 uses max_new_tokens."""

    def check(self) -> None:
        if self.weights is not None and len(self.weights) != len(self.functions):
            raise ConfigError(
                f"reward.weights has {len(self.weights)} values for {len(self.functions)} reward.functions; give one weight per function"
            )
        if not self.functions:
            raise ConfigError("reward.functions is empty; name at least one (e.g. reward.functions=[math])")
