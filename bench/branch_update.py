"""What answer branches cost in the update, with and without lifting their shared history into the prefix.

    python bench/branch_update.py --threads 2                       # SmolLM2-135M, the recipe's update settings
    python bench/branch_update.py --model tiny --steps 1            # a quick look
    python bench/branch_update.py --threads 2 --zero-sets 0.5       # + answer sets of advantage 0, run or left out

A step of `rollout.answer_branches=K` trains, for each episode, K - 1 more rows that repeat the
episode's whole history (masked) and add an answer of their own (workflows/tool_agent.py). The
trainer lifts that shared history into the rows' prefix (train/batching.py `lifted_prefixes`), so
it runs once per episode instead of once per branch. Three arms on one synthetic batch shaped
like the HotpotQA recipe's episodes (`--prompt` tokens of instruction and question; `--turns`
searches of `--query` sampled tokens, each followed by `--obs` inserted tokens of passages; an
answer of about `--answer` tokens):

- `episodes`: `--questions` × `--group` episodes, no branches (groups of 8, the recipe's default);
- `branches, history repeated`: `--questions` × `--branch-group` episodes + K - 1 branches of each
  (4 × 4 answers a question: the measured `rollout.answer_branches=4` run of RESULTS.md), with
  the lifting turned off (the code before it);
- `branches, history lifted`: the same batch, as the trainer runs it now.

With `--minibatches M` (> 1) two more arms run the lifted batch in M optimizer steps
(`train.minibatches=M`, old log-probs from the no-gradient pass): `M minibatches of rows`
(every row its own group, so the split cuts across tasks and episodes: the layout before
minibatches were made of whole groups) and `M minibatches of whole groups` (train/optim.py
`minibatch_indices`, as the trainer runs it now). Their decoder tokens count every minibatch's
micro-batches, so an episode whose branches land in two minibatches counts its history twice.

Each arm: `PolicyTrainer.update` (train.micro_batch_tokens, packing and shared prefixes as the
recipe sets them; `--freeze` lower layers frozen, fp32), median of `--steps` after a warm-up,
and the tokens the decoder ran (prefixes once per micro-batch, plus the rest of each completion).
The two branch arms' log-probs of the trained tokens are compared (they must agree to float
rounding: the lifting changes where tokens run, not what they compute).

With `--zero-sets F` (> 0) two more arms give advantage 0 to every row of a fraction F of the
episodes (an episode and its branches: an answer set without reward spread, which
`algo.branch_credit=local` gives 0 on every token) and run the lifted batch with
`train.skip_zero_advantage` off (every row runs) and on (those rows left out; they still count
in the loss's normaliser, so the step is the same). Their gradients are compared.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def episodes(args, rng: random.Random, vocab: int, n_per_question: int, branches: int):
    """Trajectories of `--questions` tasks: `n_per_question` episodes each, and `branches` - 1
    branches of every episode (its history masked, then an answer of its own)."""
    from seekrl.types import Task, Trajectory

    def ids(n):
        return [rng.randrange(10, vocab) for _ in range(n)]

    def jitter(n):
        return max(1, n + rng.randint(-n // 4, n // 4))

    out = []
    for q in range(args.questions):
        task = Task(id=str(q), prompt=[{"role": "user", "content": "x"}], answer="y")
        prompt = ids(jitter(args.prompt))
        for _ in range(n_per_question):
            ep = Trajectory(task, prompt, [], [], [], [])
            for _ in range(args.turns):
                n = jitter(args.query)
                ep.append(ids(n), sampled=True, logprobs=[-1.0] * n, version=0)
                ep.append(ids(jitter(args.obs)), sampled=False)
            history = list(ep.completion_ids)
            n = jitter(args.answer)
            ep.append(ids(n), sampled=True, logprobs=[-1.0] * n, version=0)
            out.append(ep)
            for _ in range(branches - 1):
                br = Trajectory(task, prompt, [], [], [], [])
                br.append(history, sampled=False)
                n = jitter(args.answer)
                br.append(ids(n), sampled=True, logprobs=[-1.0] * n, version=0)
                out.append(br)
    return out


def decoder_tokens(plan, batch, index: list[int] | None = None) -> int:
    """Tokens the decoder runs for rows `index` (all) of `batch` under `plan` (prefix and rest, or
    packed, or padded)."""
    total = 0
    for mb in plan.micro_batches(batch, list(range(len(batch))) if index is None else index):
        if mb.packed is not None:
            parts = [mb.packed.prompts, mb.packed.completions] if hasattr(mb.packed, "completions") else [mb.packed.seqs]
            total += sum(p.ids_RL.numel() for p in parts)
        elif mb.prompt_ids_UP is not None:
            rest = mb.suffix_ids_BS if mb.suffix_ids_BS is not None else mb.target_ids_BC
            total += mb.prompt_ids_UP.numel() + rest.numel()
        else:
            total += mb.input_ids_BL.numel()
    return total


def measure(args, name: str, trajs, model, tok, lift: bool, minibatches: int = 1, whole_groups: bool = True,
            zero_sets: float = 0.0, skip: bool = True) -> dict:
    import torch

    import seekrl.train.batching as batching
    import seekrl.train.plan as plan_mod
    from seekrl.build import policy_trainer
    from seekrl.config import Config
    from seekrl.observe.stats import StatsTracker
    from seekrl.train.batch import TokenBatch, pad_completion

    real = batching.lifted_prefixes
    if not lift:  # the code before the lifting: every row's prefix is its prompt
        batching.lifted_prefixes = plan_mod.lifted_prefixes = lambda batch, index: [0] * len(index)
    try:
        cfg = Config()
        cfg.train.lr, cfg.train.micro_batch_tokens = 1e-6, args.micro_batch_tokens
        cfg.train.minibatches = minibatches
        cfg.train.skip_zero_advantage = skip
        rng = random.Random(1)
        trainer = policy_trainer(cfg, model, tok.pad_token_id, total_steps=args.steps + 1)
        trainer.optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # every arm scores the same weights
        batch = TokenBatch.from_trajectories(trajs, [int(t.task.id) for t in trajs])  # a group a question, as the rollout numbers them
        if not whole_groups:  # every row its own group: the split cuts across tasks
            batch.group_ids_B = torch.arange(len(batch))
        adv = [rng.uniform(-1, 1) for _ in trajs]
        if zero_sets > 0:  # every row of a fraction of the episodes (an episode and its K - 1 branches): advantage 0
            sets = list(range(len(trajs) // args.branches))
            random.Random(2).shuffle(sets)
            dead = set(sets[: round(zero_sets * len(sets))])
            adv = [0.0 if i // args.branches in dead else a for i, a in enumerate(adv)]
        batch.adv_BC = pad_completion([[a] * len(t.completion_ids) for a, t in zip(adv, trajs)], batch.width)
        batch.old_logp_BC = None  # one optimizer step: the old log-probs come from the update's own pass (the recipe)
        t0 = time.perf_counter()
        logp = trainer.logprobs(batch)
        logprob_s = time.perf_counter() - t0
        if minibatches > 1:  # several optimizer steps: the old log-probs are the no-gradient pass's
            batch.old_logp_BC = logp
        split = type(trainer.plan).micro_batches
        ran: list[list[int]] = []

        def record(plan, b, index):
            ran.append(list(index))
            return split(plan, b, index)

        type(trainer.plan).micro_batches = record
        times = []
        try:
            for i in range(args.steps + 1):
                ran.clear()
                model.zero_grad(set_to_none=True)
                t0 = time.perf_counter()
                trainer.update(batch, StatsTracker())
                if i:  # the first is a warm-up
                    times.append(time.perf_counter() - t0)
        finally:
            type(trainer.plan).micro_batches = split
        grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])  # the last update's (SGD at lr 0)
        tokens = sum(decoder_tokens(trainer.plan, batch, index) for index in ran)  # the last update's minibatches
    finally:
        batching.lifted_prefixes = plan_mod.lifted_prefixes = real
    trained = batch.loss_mask_BC > 0
    return {"arm": name, "rows": len(trajs), "rows_run": len({i for index in ran for i in index}),
            "update_s": statistics.median(times), "logprob_s": logprob_s,
            "decoder_tokens": tokens, "trained_tokens": int(trained.sum()), "_logp": logp[trained], "_grad": grad}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--questions", type=int, default=4)
    p.add_argument("--group", type=int, default=8, help="episodes a question in the arm without branches")
    p.add_argument("--branch-group", type=int, default=4, help="episodes a question in the branch arms (rollout.group_size)")
    p.add_argument("--branches", type=int, default=4, help="rollout.answer_branches (K)")
    p.add_argument("--prompt", type=int, default=150)
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--query", type=int, default=16)
    p.add_argument("--obs", type=int, default=200)
    p.add_argument("--answer", type=int, default=12)
    p.add_argument("--freeze", type=int, default=15, help="model.freeze_layers (the recipe: 15)")
    p.add_argument("--micro-batch-tokens", type=int, default=2048, help="train.micro_batch_tokens (the recipe: 2048)")
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--minibatches", type=int, default=1, help="M > 1: two more arms in M optimizer steps (rows / whole groups)")
    p.add_argument("--zero-sets", type=float, default=0.0,
                   help="F > 0: two more arms with advantage 0 on a fraction F of the episodes, train.skip_zero_advantage off / on")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    import torch

    from seekrl.models import load_model

    torch.set_num_threads(args.threads)
    model, tok = load_model(args.model, tiny_texts=["the quick brown fox jumps over the lazy dog " * 4], tiny_hidden=256,
                            tiny_layers=2, tiny_vocab=512, freeze_layers=args.freeze if args.model != "tiny" else 0)
    vocab = min(model.config.vocab_size, 30000)
    K = args.branches
    branched = episodes(args, random.Random(0), vocab, args.branch_group, K)
    arms = [dict(name="episodes", trajs=episodes(args, random.Random(0), vocab, args.group, 1), lift=True),
            dict(name="branches, history repeated", trajs=branched, lift=False),
            dict(name="branches, history lifted", trajs=branched, lift=True)]
    M = args.minibatches
    if M > 1:
        arms += [dict(name=f"branches, lifted, {M} minibatches of rows", trajs=branched, lift=True, minibatches=M, whole_groups=False),
                 dict(name=f"branches, lifted, {M} minibatches of whole groups", trajs=branched, lift=True, minibatches=M)]
    Z = args.zero_sets
    if Z > 0:
        arms += [dict(name=f"branches, lifted, {Z:.0%} of episodes advantage 0, every row run", trajs=branched, lift=True,
                      zero_sets=Z, skip=False),
                 dict(name=f"branches, lifted, {Z:.0%} of episodes advantage 0, left out (train.skip_zero_advantage)",
                      trajs=branched, lift=True, zero_sets=Z)]
    rows = []
    for arm in arms:
        rows.append(measure(args, model=model, tok=tok, **arm))
        r = rows[-1]
        name = arm["name"]
        print(f"{name}: {r['rows']} rows ({r['rows_run']} run), update {r['update_s']:.2f} s, "
              f"old log-prob pass {r['logprob_s']:.2f} s", flush=True)
    gap = float((rows[1]["_logp"] - rows[2]["_logp"]).abs().max())
    grad_gap = None
    if Z > 0:
        a, b = rows[-2]["_grad"], rows[-1]["_grad"]
        grad_gap = float((a - b).norm() / a.norm().clamp(min=1e-30))
    for r in rows:
        r.pop("_logp"), r.pop("_grad")
    frozen = args.freeze if args.model != "tiny" else 0
    print(f"{args.model}, CPU, {args.threads} threads, fp32, {frozen} layers frozen, micro-batches of {args.micro_batch_tokens} "
          f"tokens; {args.questions} questions: {args.group} episodes, or {args.branch_group} episodes × {K} answers, each")
    print("| arm | rows (run) | trained tokens | decoder tokens | update s | old log-prob pass s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['arm']} | {r['rows']} ({r['rows_run']}) | {r['trained_tokens']:,} | {r['decoder_tokens']:,} | "
              f"{r['update_s']:.2f} | {r['logprob_s']:.2f} |")
    print(f"max |Δ log p| of the trained tokens, history repeated vs lifted: {gap:.2e}")
    if grad_gap is not None:
        print(f"|Δ gradient| / |gradient|, zero-advantage rows run vs left out: {grad_gap:.2e}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows, "logp_gap_max": gap,
                                              "grad_rel_gap": grad_gap}, indent=2))


if __name__ == "__main__":
    main()
