"""What an agent's episode sampled: every model call, token for token, and the trajectory they make.

An agent written against the OpenAI API (workflows/agent.py) sends messages or text; the chat
template, the tokenizer and the engine are seekrl's. `EpisodeRecord` decides which token ids
each call samples from and records what was sampled:

    ids, base = record.prompt_from_text(text)     # a chat prompt rendered by the template, or a text prompt
    ids, base = record.prompt_from_ids(ids)       # a /v1/completions prompt given as token ids
    record.add(ids, base, completion)              # once the engine answered

The prefix rule. The previous call's context is its prompt plus what it sampled: as text,
`prompt text + decode(sampled ids)` (special tokens kept), as ids `prompt ids + sampled ids`.
A new prompt that starts with that context *extends* it: its ids are the previous ids, the
sampled ids exactly as sampled (never decoded and re-encoded), then the encoded rest (what the
agent inserted: a tool result, the chat template's next turn header). Any other prompt is encoded
as it is. So the model always continues from the tokens it produced, as in seekrl's own tool loop.

`trajectory()` turns the calls into one Trajectory:
- every call extends the one before it: one sequence (the prefix layout), each call's sampled
  tokens trained (loss_mask 1, the engine's log-probs and versions), the inserted ids between
  them masked (loss_mask 0);
- otherwise (the agent edited its history, the template re-rendered it, calls ran in parallel or
  started a new conversation) the stepwise layout: one sample per call, its prompt the exact ids
  the engine was given (`Trajectory.turn_prompts`), its completion the call's sampled tokens.
Only sampled tokens are ever trained; whatever the agent wrote is a prompt or a masked insert.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from seekrl.types import Completion, Task, Trajectory

__all__ = ["AgentCall", "EpisodeRecord", "decode_exact"]


def decode_exact(tokenizer, ids: list[int]) -> str:
    """The text of `ids` as the prompt text holds it: special tokens kept, no clean-up of spaces."""
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


@dataclass
class AgentCall:
    """One model call of an episode."""

    prompt_ids: list[int]  # the ids the engine was given
    token_ids: list[int]  # what it sampled
    logprobs: list[float]
    versions: list[int]
    finish_reason: str
    base: int | None  # the call this one extends (index into the record's calls), or None
    inserted: list[int]  # when it extends: the ids between the base call's sampled ids and this call's
    text: str  # the sampled text (special tokens kept): this call's context is prompt text + text


class EpisodeRecord:
    """The calls of one episode, in the order the engine answered them (thread-safe: the endpoint
    records on its own thread, the workflow reads on the rollout's)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.calls: list[AgentCall] = []
        self._contexts: list[tuple[str | None, list[int]]] = []  # per call: (prompt text + sampled text or None, prompt + sampled ids)
        self._lock = threading.Lock()

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_from_text(self, text: str, *, special_tokens: bool = False) -> tuple[list[int], int | None, list[int]]:
        """(ids, base, inserted) for a prompt given as text. `special_tokens`: a fresh (not extending)
        prompt gets the tokenizer's default special tokens (a BOS where the model has one), as a
        /v1/completions text prompt does; a chat template writes its own."""
        with self._lock:
            for k in range(len(self._contexts) - 1, -1, -1):  # the latest call whose context the text extends
                context_text, context_ids = self._contexts[k]
                if context_text is not None and text.startswith(context_text):
                    rest = self._encode(text[len(context_text):])
                    return context_ids + rest, k, rest
        ids = list(self.tokenizer(text, add_special_tokens=special_tokens)["input_ids"])
        return ids, None, []

    def prompt_from_ids(self, ids: list[int]) -> tuple[list[int], int | None, list[int]]:
        """(ids, base, inserted) for a prompt given as token ids (taken as they are)."""
        with self._lock:
            for k in range(len(self._contexts) - 1, -1, -1):
                _, context_ids = self._contexts[k]
                if len(ids) >= len(context_ids) and ids[: len(context_ids)] == context_ids:
                    return list(ids), k, list(ids[len(context_ids):])
        return list(ids), None, []

    def add(self, prompt_text: str | None, prompt_ids: list[int], base: int | None, inserted: list[int], c: Completion) -> AgentCall:
        """Record one answered call (`prompt_text`: the text its ids encode, None for id prompts)."""
        text = decode_exact(self.tokenizer, list(c.token_ids))
        call = AgentCall(list(prompt_ids), list(c.token_ids), list(c.logprobs), c.token_versions(), c.finish_reason, base,
                         list(inserted), text)
        with self._lock:
            self.calls.append(call)
            self._contexts.append((None if prompt_text is None else prompt_text + text, list(prompt_ids) + list(c.token_ids)))
        return call

    def snapshot(self) -> list[AgentCall]:
        with self._lock:
            return list(self.calls)

    def trajectory(self, task: Task, *, stepwise: bool = False) -> Trajectory:
        """The episode as one Trajectory (module docstring). `stepwise`: keep one sample per call even
        where every call extends the one before (rollout.trajectory=stepwise). Needs at least one call."""
        calls = self.snapshot()
        if not calls:
            raise ValueError("an episode with no model call has no trajectory")
        traj = Trajectory(task=task, prompt_ids=list(calls[0].prompt_ids), completion_ids=[], loss_mask=[], logprobs=[], versions=[],
                          turn_prompts=[])
        for k, call in enumerate(calls):
            if k > 0 and call.base == k - 1:  # it extends the call before: what the agent inserted is masked
                traj.append(call.inserted, sampled=False)
            traj.append_turn(call.token_ids, logprobs=call.logprobs, version=call.versions, prompt_ids=call.prompt_ids)
        if not stepwise and all(p is None for p in traj.turn_prompts):
            traj.turn_prompts = None  # one sequence
        return traj
