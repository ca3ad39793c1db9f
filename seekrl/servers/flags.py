"""The command-line flags of each server, defined once: `seekrl serve <what>` and `python -m
seekrl.servers.<what>` take the same ones. Plain argparse, so building the CLI parser imports no
web framework and no torch."""

from __future__ import annotations

import argparse

__all__ = ["engine_flags", "policy_flags", "index_flags"]


def _common(p: argparse.ArgumentParser, port: int) -> None:
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=port)


def engine_flags(p: argparse.ArgumentParser) -> None:
    """`seekrl serve engine`: SGLang's native RL API over a LocalEngine (servers/engine.py)."""
    p.add_argument("--model", required=True, help="model folder (safetensors + config.json), 'tiny', 'smollm2' or a .gguf file")
    _common(p, 30000)
    p.add_argument("--token", default=None, help="require this bearer token (default: the variable named by --token-env)")
    p.add_argument("--token-env", default="SEEKRL_ENGINE_TOKEN", help="environment variable holding the token (default: SEEKRL_ENGINE_TOKEN)")
    p.add_argument("--max-batch-size", type=int, default=64, help="most sequences sampled in one batch")
    p.add_argument("--seed", type=int, default=0, help="seed of the engine's sampler (requests with sampling_seed use their own)")
    p.add_argument("--max-body-mb", type=float, default=16.0, help="largest request body, in MB")
    p.add_argument("--max-prompts-per-request", type=int, default=256, help="more prompts in one /generate is a 413")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    p.add_argument("--compile", default="auto", choices=("auto", "true", "false"),
                   help="decode over a static KV cache (auto: compiled on CUDA only), compiled (true), or a growing cache (false)")


def policy_flags(p: argparse.ArgumentParser) -> None:
    """`seekrl serve policy`: an OpenAI-compatible /v1 over a model (servers/policy.py)."""
    p.add_argument("--model", required=True, help="model folder (e.g. a checkpoint's model/), .gguf file, or smollm2")
    _common(p, 8002)
    p.add_argument("--token", default=None, help="require this bearer token on /v1 (default: $SEEKRL_POLICY_TOKEN)")
    p.add_argument("--model-name", default=None, help="name in responses and /v1/models (default: --model)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--max-tokens-cap", type=int, default=4096, help="largest max_tokens a request may ask for")
    p.add_argument("--max-prompts-per-request", type=int, default=64, help="more prompts in one request is a 413")
    p.add_argument("--max-completions-per-request", type=int, default=256, help="more prompts x n in one request is a 400")


def index_flags(p: argparse.ArgumentParser, what: str) -> None:
    """`seekrl serve retriever` (Search-R1's POST /retrieve) and `seekrl serve mcp` (an MCP search tool)
    over an index folder (servers/retrieval.py, servers/mcp.py)."""
    p.add_argument("--index", required=True, help="index folder (seekrl index build)")
    _common(p, 8000 if what == "retriever" else 8001)
    p.add_argument("--token", default=None, help="require this bearer token (default: its environment variable)")
    if what == "mcp":
        p.add_argument("--stdio", action="store_true", help="speak MCP over stdin/stdout instead of HTTP")
        p.add_argument("--topk", type=int, default=3, help="passages per search unless the call asks otherwise")
        p.add_argument("--max-body-mb", type=float, default=1.0, help="largest request body, in MB (HTTP; more is a 413)")
