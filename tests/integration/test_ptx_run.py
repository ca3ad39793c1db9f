"""PPO-ptx (train/ptx.py): a supervised loss on data.ptx's examples joins every policy update.

- the anchor draws each pass's examples in a seeded permutation (every example once a pass), and a
  restored draw count continues the same sequence;
- its gradient is algo.ptx_coef × the SFT token-mean gradient of the same examples (train/sft.py);
- in PolicyTrainer.update it joins the policy gradient: a batch with zero advantages leaves the
  weights as they were without ptx, and moves them with it;
- an RL run with ptx learns the supervised examples (loss/ptx falls), logs documented metrics, and
  a run cut at step 7 and resumed ends with the uninterrupted run's metrics (the draw resumes);
- data.ptx_tokens=last trains only each example's last assistant turn (an episode's answer, not its
  searches or the tool output between them);
- config errors: algo.ptx_coef without data.ptx, data.ptx without a weight; a malformed row names
  its file and line.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from seekrl.config import ConfigError, load_config
from seekrl.errors import DataError
from seekrl.jobs import train
from seekrl.observe.loggers import read_metrics
from seekrl.observe.metrics import reproducible, undocumented
from seekrl.observe.stats import StatsTracker
from seekrl.train.batch import TokenBatch
from seekrl.train.ptx import PtxAnchor, last_turn
from seekrl.train.sft import step_loss, tokenize_chat, tokenize_segments


def _examples(tokenizer, n):
    convs = [[{"role": "user", "content": f"copy: {i} {i + 1}"}, {"role": "assistant", "content": f"{i} {i + 1}"}] for i in range(n)]
    return [tokenize_chat(tokenizer, c) for c in convs]


def _anchor(tokenizer, examples, coef=0.5, batch=3, seed=7, budget=64):
    return PtxAnchor(examples, coef=coef, batch=batch, seed=seed, budget=budget, pad_id=tokenizer.pad_token_id,
                     device=torch.device("cpu"))


def test_draws_every_example_once_a_pass_and_resumes_the_sequence(tiny_tokenizer):
    examples = _examples(tiny_tokenizer, 5)
    index = {tuple(ids): i for i, (ids, _) in enumerate(examples)}
    a = _anchor(tiny_tokenizer, examples, batch=3)
    drawn = [index[tuple(ids)] for _ in range(5) for ids, _ in a.next_examples()]  # 15 draws: 3 passes
    assert [sorted(drawn[k:k + 5]) for k in (0, 5, 10)] == [list(range(5))] * 3
    assert drawn[:5] != drawn[5:10] or drawn[5:10] != drawn[10:15]  # a fresh permutation each pass
    b = _anchor(tiny_tokenizer, examples, batch=3)
    b.load_state_dict(json.loads(json.dumps(_anchor_after(tiny_tokenizer, examples, 2).state_dict())))
    assert [index[tuple(ids)] for _ in range(3) for ids, _ in b.next_examples()] == drawn[6:15]
    other_seed = _anchor(tiny_tokenizer, examples, batch=3, seed=8)
    assert [index[tuple(ids)] for _ in range(5) for ids, _ in other_seed.next_examples()] != drawn


def _anchor_after(tokenizer, examples, draws):
    a = _anchor(tokenizer, examples, batch=3)
    for _ in range(draws):
        a.next_examples()
    return a


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_gradient_is_coef_times_the_sft_gradient(tiny_tokenizer, fresh_tiny_model):
    examples = _examples(tiny_tokenizer, 6)
    a = _anchor(tiny_tokenizer, examples, coef=0.3, batch=4, budget=40)  # several micro-batches
    twin = _anchor(tiny_tokenizer, examples, coef=0.3, batch=4)
    chosen = twin.next_examples()
    model = fresh_tiny_model.train()
    stats = StatsTracker()
    mean = a.backward(model, stats)
    got = _grads(model)
    model.zero_grad(set_to_none=True)
    ref_loss, n_label, _ = step_loss(model, chosen, 10_000, tiny_tokenizer.pad_token_id, "cpu", backward=True)
    want = _grads(model)
    assert mean == pytest.approx(ref_loss, rel=1e-5)
    assert stats.export()["ptx/tokens"] == n_label
    assert got.keys() == want.keys() and got
    for name in want:
        torch.testing.assert_close(got[name], 0.3 * want[name], rtol=1e-4, atol=1e-6)


def _zero_advantage_batch(tokenizer):
    batch = TokenBatch.from_sequences(_examples(tokenizer, 2))
    batch.adv_BC = torch.zeros(len(batch), batch.width)
    batch.old_logp_BC = None  # one optimizer step: the update's own log-probs
    return batch


def test_ptx_joins_the_policy_update(tiny_tokenizer, tiny_model):
    from seekrl.build import policy_trainer

    cfg = load_config(None, ["model.path=tiny", "train.lr=1e-2"])
    moved = {}
    for with_ptx in (False, True):
        model = copy.deepcopy(tiny_model).train()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        ptx = _anchor(tiny_tokenizer, _examples(tiny_tokenizer, 4), coef=1.0) if with_ptx else None
        trainer = policy_trainer(cfg, model, tiny_tokenizer.pad_token_id, ptx=ptx)
        stats = StatsTracker()
        batch = _zero_advantage_batch(tiny_tokenizer)
        trainer.update(batch, stats)
        moved[with_ptx] = max(float((p.detach() - before[n]).abs().max()) for n, p in model.named_parameters())
        assert ("loss/ptx" in stats.export()) == with_ptx
    assert moved[False] == 0.0  # zero advantages: the policy loss has no gradient
    assert moved[True] > 1e-4  # the supervised loss moved the weights in the same optimizer step


def _ptx_file(tmp_path, n=40):
    path = tmp_path / "ptx.jsonl"
    rows = [{"prompt": f"copy: {i % 10} {(i * 3) % 10} {(i * 7) % 10}", "completion": f"{i % 10} {(i * 3) % 10} {(i * 7) % 10}"}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def cfg(tmp_path, name, *overrides):
    base = [
        "model.path=tiny", "model.tiny_hidden=32", "model.max_context=64", "data.train=tiny:copy", "data.max_train=40",
        "rollout.group_size=4", "rollout.batch_size=16", "rollout.max_new_tokens=6", "rollout.max_prompt_tokens=32",
        "reward.functions=[qa_f1]", "train.lr=1e-2", "train.steps=16", "train.save_every=1", f"log.dir={tmp_path}",
        f"log.name={name}", "log.progress=false", "log.tensorboard=false",
        f"data.ptx={_ptx_file(tmp_path)}", "algo.ptx_coef=1.0", "data.ptx_batch=8",
    ]
    return load_config(None, base + list(overrides))


def _comparable(rows):
    return [reproducible(r) for r in rows]


def test_rl_run_learns_the_examples_and_resumes_the_draw(tmp_path):
    full = train(cfg(tmp_path, "full"))
    rows = [r for r in read_metrics(full) if r["step"] > 0]
    assert undocumented({k for r in rows for k in r}) == []
    losses = [r["loss/ptx"] for r in rows]
    assert len(losses) == 16 and sum(losses[-3:]) / 3 < 0.6 * losses[0], losses
    assert all(r["ptx/tokens"] > 0 for r in rows)
    assert all(0 < r["time/ptx_s"] < r["time/update_s"] for r in rows)  # the anchor's share of the update
    state = json.loads((full / "checkpoints" / "step_16" / "state.json").read_text())
    assert state["ptx"] == {"drawn": 16 * 8}  # one optimizer step a step, 8 examples each

    train(cfg(tmp_path, "cut", "train.max_steps_this_run=7"))
    resumed = train(cfg(tmp_path, "cut"))
    assert _comparable(read_metrics(resumed)) == _comparable(read_metrics(full))


def test_config_errors_name_the_missing_half(tmp_path):
    with pytest.raises(ConfigError, match=r"algo.ptx_coef=0.2 weighs a supervised loss on data.ptx, which is not set"):
        load_config(None, ["algo.ptx_coef=0.2"])
    with pytest.raises(ConfigError, match=r"data.ptx=x.jsonl is set but algo.ptx_coef=0"):
        load_config(None, ["data.ptx=x.jsonl"])


def test_malformed_ptx_row_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(_ptx_file(tmp_path, 3).read_text() + json.dumps({"prompt": "copy: 1"}) + "\n")
    with pytest.raises(DataError, match=rf"{path}:4: row has no 'completion' field"):
        train(cfg(tmp_path, "bad", f"data.ptx={path}"))


def test_last_turn_keeps_the_last_run_of_trained_tokens():
    assert last_turn([0, 1, 1, 0, 0, 1, 1, 1, 0]) == [0, 0, 0, 0, 0, 1, 1, 1, 0]
    assert last_turn([0, 0, 1, 1]) == [0, 0, 1, 1]
    assert last_turn([1, 1, 1]) == [1, 1, 1]
    assert last_turn([0, 0]) == [0, 0]


def test_ptx_tokens_last_trains_only_the_episodes_answer(tmp_path, tiny_tokenizer, tiny_model):
    from seekrl.build import ptx_anchor

    prompt = [{"role": "user", "content": "copy: 3 4"}]
    segments = [{"text": "<search> 3 </search>", "masked": False}, {"text": "<information> 3 4 </information>", "masked": True},
                {"text": "<search> 4 </search>", "masked": False}, {"text": "<information> 4 </information>", "masked": True},
                {"text": "<answer> 3 4 </answer>", "masked": False}]
    row = {"prompt": prompt, "segments": segments}
    ids, full = tokenize_segments(tiny_tokenizer, prompt, segments)
    answer = len(tiny_tokenizer.encode(segments[-1]["text"], add_special_tokens=False))
    got = {}
    for tokens in ("all", "last"):
        c = load_config(None, ["model.path=tiny", "model.max_context=512", "rollout.max_prompt_tokens=32",
                               "rollout.max_new_tokens=8", "data.ptx=x.jsonl", "algo.ptx_coef=0.5",
                               f"data.ptx_tokens={tokens}"])
        (got_ids, got[tokens]), = ptx_anchor(c, [row], tiny_model, tiny_tokenizer).examples
        assert got_ids == ids
    assert got["all"] == full and sum(full) > answer  # the searches train too
    assert got["last"] == [0] * (len(ids) - answer) + [1] * answer  # only the answer's tokens
