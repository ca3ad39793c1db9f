"""An agent's calls become training data token for token (workflows/agent_record.py).

Property tests: whatever an agent sends (a prompt that extends the previous call's context, one
that extends an earlier call, or a fresh one) and whatever the engine samples, the trajectory
trains exactly the sampled ids with their log-probs and versions, every inserted id is masked,
and each call's prompt is recoverable exactly: as the prefix before its span (one sequence) or
as the stored prompt of its step (stepwise).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seekrl.types import Completion, Task
from seekrl.workflows.agent_record import EpisodeRecord, decode_exact

TASK = Task("t0", [{"role": "user", "content": "copy: 1 2"}], "1 2")
WORDS = ["alpha", " beta", "<information>", " Doc 1: Paris", "</information>\n\n", "\n", " 7", "<|im_start|>tool\n", "<|im_end|>"]


def _completion(ids, version=3):
    return Completion(token_ids=list(ids), logprobs=[-0.1 * (i + 1) for i in range(len(ids))], finish_reason="stop", version=version)


@st.composite
def episodes(draw, vocab: int):
    n = draw(st.integers(1, 5))
    calls = []
    for k in range(n):
        how = draw(st.sampled_from(["extend", "extend", "fresh", "earlier"])) if k else "fresh"
        inserted = "".join(draw(st.lists(st.sampled_from(WORDS), min_size=0, max_size=4)))
        sampled = draw(st.lists(st.integers(0, vocab - 1), min_size=0, max_size=6))
        calls.append((how, inserted, sampled))
    return calls


def _play(tok, calls):
    """Feed the calls to a record as the endpoint does; return it and each call's text prompt."""
    record = EpisodeRecord(tok)
    contexts: list[str] = []
    for k, (how, inserted, sampled) in enumerate(calls):
        if how == "extend":
            text = contexts[-1] + inserted
        elif how == "earlier":
            text = contexts[0] + inserted
        else:
            text = f"<|im_start|>user\nquestion {k}{inserted}<|im_end|>\n<|im_start|>assistant\n"
        ids, base, rest = record.prompt_from_text(text)
        record.add(text, ids, base, rest, _completion(sampled, version=k))
        contexts.append(text + decode_exact(tok, sampled))
    return record


@pytest.fixture(scope="module")
def vocab(tiny_tokenizer):
    return len(tiny_tokenizer)


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_only_sampled_tokens_are_trained_and_every_prompt_is_exact(tiny_tokenizer, data):
    tok = tiny_tokenizer
    calls = data.draw(episodes(len(tok)))
    record = _play(tok, calls)
    recorded = record.snapshot()
    traj = record.trajectory(TASK)
    # the trained tokens are exactly the sampled ones, in order, with their log-probs and versions
    trained = [i for i, m in zip(traj.completion_ids, traj.loss_mask) if m]
    assert trained == [t for c in recorded for t in c.token_ids]
    assert [lp for lp, m in zip(traj.logprobs, traj.loss_mask) if m] == [lp for c in recorded for lp in c.logprobs]
    assert [v for v, m in zip(traj.versions, traj.loss_mask) if m] == [v for c in recorded for v in c.versions]
    assert all(lp == 0.0 and v == -1 for lp, v, m in zip(traj.logprobs, traj.versions, traj.loss_mask) if not m)
    assert [traj.completion_ids[a:b] for a, b in traj.turn_spans] == [c.token_ids for c in recorded]
    # an extending call's prompt continues from the ids the call before it sampled, never re-encoded
    for k, c in enumerate(recorded):
        if c.base is not None:
            before = recorded[c.base]
            assert c.prompt_ids[: len(before.prompt_ids) + len(before.token_ids)] == before.prompt_ids + before.token_ids
    chained = all(c.base == k - 1 for k, c in enumerate(recorded) if k)
    if chained:  # one sequence: each call's prompt is the prompt + everything before its span; inserts masked
        assert traj.turn_prompts is None
        for (a, _), c in zip(traj.turn_spans, recorded):
            assert traj.prompt_ids + traj.completion_ids[:a] == c.prompt_ids
        assert sum(traj.loss_mask) == sum(len(c.token_ids) for c in recorded)
    else:  # one sample per call: the exact prompt the engine was given, the tokens it sampled
        steps = traj.steps()
        assert [s.prompt_ids for s in steps] == [c.prompt_ids for c in recorded]
        assert [s.completion_ids for s in steps] == [c.token_ids for c in recorded]
        assert all(s.loss_mask == [1] * len(s.completion_ids) for s in steps)
    stepwise = record.trajectory(TASK, stepwise=True)
    assert [s.prompt_ids for s in stepwise.steps()] == [c.prompt_ids for c in recorded]


def test_text_extension_keeps_the_sampled_ids_and_special_tokens(tiny_tokenizer):
    tok = tiny_tokenizer
    record = EpisodeRecord(tok)
    first = "<|im_start|>user\ncopy: 1 2<|im_end|>\n<|im_start|>assistant\n"
    ids, base, rest = record.prompt_from_text(first)
    assert base is None and rest == [] and ids == tok(first, add_special_tokens=False)["input_ids"]
    end = tok.convert_tokens_to_ids("<|im_end|>")
    sampled = tok.encode("1 2", add_special_tokens=False) + [end]
    record.add(first, ids, base, rest, _completion(sampled))
    nxt = first + "1 2<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"
    ids2, base2, rest2 = record.prompt_from_text(nxt)
    assert base2 == 0 and ids2 == ids + sampled + rest2
    assert decode_exact(tok, rest2) == "\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"
    assert tok.convert_tokens_to_ids("<|im_start|>") in rest2  # the template's special tokens are tokens, not text
    # an edited history is a fresh prompt
    ids3, base3, _ = record.prompt_from_text(first + "1 2 (edited)<|im_end|>\n")
    assert base3 is None and ids3 == tok(first + "1 2 (edited)<|im_end|>\n", add_special_tokens=False)["input_ids"]
    # token-id prompts extend on ids
    record.add(nxt, ids2, base2, rest2, _completion([5, 6]))
    ids4, base4, rest4 = record.prompt_from_ids(ids2 + [5, 6, 9, 9])
    assert base4 == 1 and rest4 == [9, 9] and ids4 == ids2 + [5, 6, 9, 9]


def test_no_calls_no_trajectory(tiny_tokenizer):
    with pytest.raises(ValueError, match="no model call"):
        EpisodeRecord(tiny_tokenizer).trajectory(TASK)
