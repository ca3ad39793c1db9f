"""The `reward:` config section: the reward functions of the rubric, their weights and parameters.
rewards/rubric.py reads it (`build_rubric`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from seekrl.errors import ConfigError
from seekrl.schema import Range

__all__ = ["RewardConfig"]


@dataclass
class RewardConfig:
    functions: list[str] = field(default_factory=lambda: ["math"])
    """Reward functions by name (math, gsm8k, boxed, format, tag_count, reasoning_steps, cosine, repetition, overlong, qa_em, qa_f1, subem, search_r1, retrieved_gold_turn, retrieved_support_turn, judge) or 'module:function'."""
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
    search_r1_partial: Literal["none", "f1", "subem"] = "none"
    """Partial credit of the search_r1 reward for a well-formed episode whose answer is not exact: none | f1 (the answer's token F1) | subem (1 when it contains a gold answer), times search_r1_partial_weight."""
    search_r1_partial_weight: Annotated[float, Range(ge=0, lt=0.7, hint="below 1 - 0.2 - 0.1, so the exact answer scores most")] = 0.5
    """Weight of that partial credit (the exact answer scores 1.0; a well-formed miss 0.2, +0.1 when retrieved)."""
    judge_url: str | None = None
    """The judge's OpenAI-compatible base URL (reward 'judge'; rewards/judge.py), e.g. http://127.0.0.1:8002/v1 (seekrl serve policy, vLLM, a hosted API); POST <url>/chat/completions."""
    judge_model: str = "default"
    """Model name sent to the judge; it also names the judge in the cache key (give two judges two names)."""
    judge_token_env: str | None = None
    """Environment variable holding the judge's bearer token (never the token itself); none sends no token."""
    judge_template: str | None = None
    """Prompt of the judge for a task without rubric items: a file, or the text itself when it holds a {placeholder} ({question}, {gold}, {response}, {completion}, {prompt}, any row field); none: is the response correct given the gold answer, 0-10."""
    judge_rubric_template: str | None = None
    """Prompt of the judge for one rubric item of a task's `rubrics` ({rubric}: the item's text, plus the judge_template fields); a file or the text; none: how well the response meets the criterion, 0-10."""
    judge_parser: str = "last_number"
    """How the score is read from the reply: last_number | first_number | json ({"score": x}) | yes_no | match:REGEX (1 if it matches, else 0) | re:REGEX (group 1 is the number)."""
    judge_score_range: list[float] = field(default_factory=lambda: [0.0, 10.0])
    """[lo, hi] of the judge's scores, normalised to [0, 1]; a number outside is an unreadable reply (retried)."""
    judge_max_tokens: Annotated[int, Range(ge=0, hint="0: the server's default")] = 512
    """max_tokens of a judge request (room for its reasoning); 0 sends none."""
    judge_temperature: Annotated[float, Range(ge=0, hint="0: greedy")] = 0.0
    """Sampling temperature of the judge."""
    judge_concurrency: Annotated[int, Range(ge=1)] = 16
    """Most judge requests in flight at once."""
    judge_retries: Annotated[int, Range(ge=0)] = 3
    """Retries of a judge request that failed (refused, timeout, 429, 5xx, unreadable reply), with exponential backoff; then the trajectory is left out (status reward_unavailable)."""
    judge_backoff_s: Annotated[float, Range(ge=0, text="a finite number >= 0 (seconds)")] = 1.0
    """First wait before a retry, in seconds; doubles each time (at most 60 s, at least a 429's Retry-After)."""
    judge_timeout_s: Annotated[float, Range(gt=0, text="a finite number > 0 (seconds)")] = 60.0
    """Longest wait for one judge reply, in seconds."""
    judge_cache: str | bool | None = None
    """Folder of the judge's cache (judge_cache.sqlite, keyed by model, prompt and sampling settings), so reruns do not ask again; none (or true): $XDG_CACHE_HOME/seekrl/judge (~/.cache/seekrl/judge); false (or off): no cache."""

    def check(self) -> None:
        if self.weights is not None and len(self.weights) != len(self.functions):
            raise ConfigError(
                f"reward.weights has {len(self.weights)} values for {len(self.functions)} reward.functions; give one weight per function"
            )
        if not self.functions:
            raise ConfigError("reward.functions is empty; name at least one (e.g. reward.functions=[math])")
        if "judge" in self.functions:
            self._check_judge()

    def _check_judge(self) -> None:
        """The judge's keys (what can be checked without the environment; the token variable is read when the rubric is built)."""
        if not self.judge_url:
            raise ConfigError("reward.functions has judge but reward.judge_url is not set; give the judge's OpenAI-compatible base URL "
                              "(e.g. reward.judge_url=http://127.0.0.1:8002/v1)")
        if not self.judge_url.startswith(("http://", "https://")):
            raise ConfigError(f"reward.judge_url: '{self.judge_url}' is not an http(s) URL (e.g. http://127.0.0.1:8002/v1)")
        if len(self.judge_score_range) != 2 or not self.judge_score_range[0] < self.judge_score_range[1]:
            raise ConfigError(f"reward.judge_score_range: give [lo, hi] with lo < hi (e.g. [0, 10]), got {self.judge_score_range}")
        from seekrl.rewards.judge import DEFAULT_RUBRIC_TEMPLATE, DEFAULT_TEMPLATE, make_parser, read_template, template_fields

        try:
            make_parser(self.judge_parser, self.judge_score_range)
        except ValueError as e:
            raise ConfigError(f"reward.judge_parser: {e}") from None
        if "rubric" in template_fields(read_template(self.judge_template, "reward.judge_template", DEFAULT_TEMPLATE)):
            raise ConfigError("reward.judge_template uses {rubric}, which only reward.judge_rubric_template has (one rubric item per question)")
        if "rubric" not in template_fields(read_template(self.judge_rubric_template, "reward.judge_rubric_template", DEFAULT_RUBRIC_TEMPLATE)):
            raise ConfigError("reward.judge_rubric_template must show the rubric item: put {rubric} in it")
