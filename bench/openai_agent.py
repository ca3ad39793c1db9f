"""An OpenAI-client agent (examples/openai_agent/agent.py) next to seekrl's built-in workflow, same task, same settings.

    python bench/openai_agent.py --world tiny                   # tiny:copy: examples/tiny_grpo.yaml vs examples/openai_agent/tiny.yaml
    python bench/openai_agent.py --world demo --seeds 0 1 2     # the demo world's search task from the demo's SFT checkpoint (make demo first)

demo: the built-in arm is `seekrl train examples/demo_search.yaml` (tools.format=search_r1, the
in-process BM25 tool); the agent arm drops tools.format and sets rollout.agent=
examples.openai_agent.agent:search_agent, which writes the same Search-R1 loop with the stock
`openai` client against its episode's endpoint and asks a `seekrl serve retriever` (started here
on a free loopback port over the same index, stopped at the end) for passages. Same model, data,
group size, per-turn tokens, turns, top-k, steps and seeds. Reported per arm: reward first → last
quarter, greedy eval EM at step 0 → end, s/step (bench/objectives.py's summary).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from objectives import ROOT, interval, train_run  # noqa: E402

DEMO = ["data.train=runs/demo/world/train.jsonl", "data.eval=runs/demo/world/test.jsonl",
        "model.path=runs/demo/sft/checkpoints/step_600/model", "train.save_every=0"]
AGENT = ["tools.format=null", "rollout.agent=examples.openai_agent.agent:search_agent", "rollout.agent_max_calls=4",
         "rollout.agent_max_tokens=256"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the retriever exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(0.5)
    sys.exit(f"the retriever did not answer at {url} within {timeout:g} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", choices=["tiny", "demo"], default="tiny")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--arms", nargs="+", default=["workflow", "agent"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    server = None
    rows = []
    try:
        if args.world == "demo":
            port = free_port()
            server = subprocess.Popen([sys.executable, "-m", "seekrl", "serve", "retriever", "--index", "runs/demo/index", "--port", str(port)],
                                      cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            wait_http(f"http://127.0.0.1:{port}/health", server)
            configs = {"workflow": ("examples/demo_search.yaml", DEMO + ["tools.retriever=runs/demo/index"]),
                       "agent": ("examples/demo_search.yaml", DEMO + AGENT + [
                           f"rollout.agent_kwargs={{retriever_url: 'http://127.0.0.1:{port}/retrieve', topk: 1, max_turns: 3}}"])}
        else:
            configs = {"workflow": ("examples/tiny_grpo.yaml", []), "agent": ("examples/openai_agent/tiny.yaml", [])}
        with tempfile.TemporaryDirectory(prefix="seekrl-agent-bench-") as tmp:
            for arm in args.arms:
                config, overrides = configs[arm]
                for seed in args.seeds:
                    name = f"{arm}_s{seed}"
                    cmd = [sys.executable, "-m", "seekrl", "train", config, f"train.seed={seed}", f"log.dir={tmp}", f"log.name={name}",
                           "log.progress=false", *overrides, *([f"train.steps={args.steps}"] if args.steps else [])]
                    row = {"arm": arm, "seed": seed, **train_run(cmd, Path(tmp) / name, name)}
                    rows.append(row)
                    print(f"{name}: reward {row['first']:.3f} -> {row['last']:.3f} ({row['gain']:+.3f}), eval EM {row['eval_em_first']} -> "
                          f"{row['eval_em']}, {row['s_per_step']:.2f} s/step, {row['wall_s']:.0f} s", flush=True)
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=15)
    print(f"\n{datetime.date.today()} · {platform.node()} · world {args.world}\n")
    print("| arm | seeds | mean reward, first → last quarter (per seed) | gain: mean [95% CI] | greedy eval EM, step 0 → end (per seed) | s/step |")
    print("|---|---|---|---|---|---|")
    for arm in args.arms:
        rs = [r for r in rows if r["arm"] == arm]
        m, lo, hi = interval([r["gain"] for r in rs])
        per = ", ".join(f"{r['first']:.3f} → {r['last']:.3f}" for r in rs)
        em = ", ".join(f"{r['eval_em_first']:.3f} → {r['eval_em']:.3f}" for r in rs if r["eval_em"] is not None) or "—"
        print(f"| {arm} | {len(rs)} | {per} | {m:+.3f} [{lo:+.3f}, {hi:+.3f}] | {em} | {statistics.fmean(r['s_per_step'] for r in rs):.2f} |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
