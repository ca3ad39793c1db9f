"""`seekrl` command line: train, launch, sft, eval, index, serve (retriever, mcp, policy), config.

    seekrl train examples/tiny_grpo.yaml train.steps=50 algo.name=ppo
    seekrl launch examples/tiny_grpo.yaml cluster.engine_servers=2   # trainer ranks + engine servers on Ray
    seekrl sft CONFIG data.train=chats.jsonl            # chat SFT, loss on assistant tokens
    seekrl demo [--out runs/demo]                  # the embedded demo: SFT + GRPO with search on a CPU
    seekrl demo --recipe hotpotqa_smollm2          # SmolLM2-135M learns to search HotpotQA (about 1.3 h on a CPU)
    seekrl generate CONFIG generate.endpoint=http://127.0.0.1:8002/v1 generate.out=sft.jsonl   # or =teacher
    seekrl eval examples/gsm8k_grpo_smollm2.yaml model.path=runs/x/checkpoints/step_3/model
    seekrl index build --corpus hotpotqa --out runs/index/hotpotqa_bm25 --kind bm25
    seekrl serve retriever --index runs/index/hotpotqa_bm25 --port 8000 [--token T]
    seekrl serve mcp --index runs/index/hotpotqa_bm25 --port 8001
    seekrl serve policy --model runs/x/checkpoints/step_3/model --port 8002
    seekrl serve engine --model runs/x/checkpoints/step_3/model --port 30000   # SGLang's native RL API
    seekrl config examples/tiny_grpo.yaml          # print the resolved config
    seekrl config --reference                      # every key with its docstring
    seekrl report runs/tiny_grpo [--out PATH]      # HTML report + PNG plots + trajectories page

Bad input (config, data) exits with status 2 and one line naming the problem and the fix.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

# Busy-waiting OpenMP threads make small torch ops 10-100x slower when the cores are shared (the
# engine's thread and the trainer, or other processes); passive waiting costs nothing measurable
# on an idle machine. Set before torch is imported; an explicit setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _limit_malloc_arenas() -> None:
    """glibc gives each thread that allocates its own malloc arena; the engine's thread and the
    trainer's freeing tensors of ever-changing sizes fragment them, and the process keeps the
    pages. SmolLM2 GRPO on a CPU grew from 7 to 24 GiB in 9 steps (killed by the OOM killer) and
    stayed at 7-8 GiB with 2 arenas (RESULTS.md, the HotpotQA recipe). An explicit
    MALLOC_ARENA_MAX wins; other C libraries are left alone."""
    if sys.platform != "linux" or "MALLOC_ARENA_MAX" in os.environ:
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-8, 2)  # M_ARENA_MAX = -8
    except (OSError, AttributeError):
        pass


_limit_malloc_arenas()

from seekrl.config import SECTIONS, Config, ConfigError, field_docs, load_config


def engine_server_flags(p: argparse.ArgumentParser) -> None:
    """The flags of `seekrl serve engine` (also `python -m seekrl.servers.engine`)."""
    p.add_argument("--model", required=True, help="model folder (safetensors + config.json), 'tiny', 'smollm2' or a .gguf file")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="seekrl", description="Train language models to reason and use tools with RL.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    t = sub.add_parser("train", help="run (or resume) RL training: GRPO, Dr. GRPO, RLOO, REINFORCE++, PPO")
    t.add_argument("config", help="YAML config (see examples/)")
    t.add_argument("overrides", nargs="*", help="section.key=value overrides")
    la = sub.add_parser("launch", help="run training on Ray: trainer ranks and engine servers placed per cluster.* (pip install seekrl[ray])")
    la.add_argument("config", help="YAML config (see examples/)")
    la.add_argument("overrides", nargs="*", help="section.key=value overrides")
    sf = sub.add_parser("sft", help="supervised fine-tuning on chat rows (loss on assistant tokens only); same run folder")
    sf.add_argument("config")
    sf.add_argument("overrides", nargs="*")
    from seekrl.recipes import RECIPES

    recipes = "; ".join(f"{name}: {desc}" for name, (_, desc) in RECIPES.items())
    dm = sub.add_parser("demo", help="the embedded demo: world -> index -> teacher SFT -> eval -> GRPO with search -> eval -> report",
                        description="Without --recipe: the embedded demo (a tiny model, a synthetic world). "
                                    f"Recipes (--recipe NAME): {recipes}.")
    dm.add_argument("overrides", nargs="*", help="section.key=value overrides of the demo (or recipe) config")
    dm.add_argument("--recipe", default=None, choices=sorted(RECIPES), help=f"run a recipe instead of the embedded demo: {recipes}")
    dm.add_argument("--out", default=None, help="folder of the runs and report (default: runs/demo, or runs/<recipe>)")
    dm.add_argument("--config", default=None, help="config (default: examples/demo_search.yaml, or the recipe's)")
    g = sub.add_parser("generate", help="play the tool agent loop against an OpenAI-compatible endpoint (or the scripted teacher); write SFT rows")
    g.add_argument("config")
    g.add_argument("overrides", nargs="*")
    e = sub.add_parser("eval", help="evaluate model.path on data.eval with the training workflow; writes runs/<name>/eval/ (eval.json, eval.md, trajectories.jsonl)")
    e.add_argument("config")
    e.add_argument("overrides", nargs="*")
    ix = sub.add_parser("index", help="build a retrieval index (BM25 or dense) from a Search-R1 corpus")
    ixs = ix.add_subparsers(dest="index_command", metavar="ACTION", required=True)
    b = ixs.add_parser("build", help="index a corpus jsonl ({id, contents}) or a builtin corpus: hotpotqa, 2wiki")
    b.add_argument("--corpus", required=True)
    b.add_argument("--out", required=True, help="index folder to write")
    b.add_argument("--kind", choices=("bm25", "dense"), default="bm25")
    b.add_argument("--dense-kind", choices=("flat", "hnsw"), default="flat", help="faiss index for --kind dense")
    sv = sub.add_parser("serve", help="serve an engine (SGLang's RL API), a policy (OpenAI API), a retriever or MCP search")
    svs = sv.add_subparsers(dest="serve_command", metavar="WHAT", required=True)
    engine_server_flags(svs.add_parser("engine", help="SGLang's native RL API (/generate, /update_weights_from_disk, pause/continue, abort) over a model"))
    pol = svs.add_parser("policy", help="an OpenAI-compatible /v1/chat/completions and /v1/completions server over a model")
    pol.add_argument("--model", required=True, help="model folder (e.g. a checkpoint's model/), .gguf file, or smollm2")
    pol.add_argument("--host", default="127.0.0.1")
    pol.add_argument("--port", type=int, default=8002)
    pol.add_argument("--token", default=None, help="require this bearer token (default: $SEEKRL_POLICY_TOKEN)")
    pol.add_argument("--max-prompts-per-request", type=int, default=64, help="more prompts in one request is a 413")
    pol.add_argument("--max-completions-per-request", type=int, default=256, help="more prompts x n in one request is a 400")
    for name, port, text in (("retriever", 8000, "POST /retrieve, GET /health"), ("mcp", 8001, "an MCP server with a search tool")):
        q = svs.add_parser(name, help=text)
        q.add_argument("--index", required=True, help="index folder (seekrl index build)")
        q.add_argument("--host", default="127.0.0.1")
        q.add_argument("--port", type=int, default=port)
        q.add_argument("--token", default=None, help="require this bearer token")
        if name == "mcp":
            q.add_argument("--stdio", action="store_true", help="speak MCP over stdin/stdout instead of HTTP")
    c = sub.add_parser("config", help="print the resolved config, or the reference of every key")
    c.add_argument("config", nargs="?")
    c.add_argument("overrides", nargs="*")
    c.add_argument("--reference", action="store_true", help="print every section.key with its default and meaning")
    rp = sub.add_parser("report", help="write an HTML report (PNG plots, sample trajectories) for a run folder")
    rp.add_argument("run_dir", help="run folder (runs/<log.name>)")
    rp.add_argument("--out", default=None, help="HTML file to write (default: RUN_DIR/report.html)")
    return p


def reference_markdown() -> str:
    """The config reference table (README.md embeds it)."""
    default = Config()
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for name, cls in SECTIONS.items():
        docs = field_docs(cls)
        for key, doc in docs.items():
            value = getattr(getattr(default, name), key)
            doc = doc.replace("|", "\\|")
            lines.append(f"| `{name}.{key}` | `{json.dumps(value)}` | {doc} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command is None:
        _parser().print_help()
        return 0
    from seekrl.data.converters import DataError
    from seekrl.engines.errors import EngineRequestError, EngineUnavailable

    try:
        if args.command == "index":
            from seekrl.retrieval.commands import build_index

            build_index(args.corpus, args.out, kind=args.kind, dense_kind=args.dense_kind)
            return 0
        if args.command == "serve":
            if args.serve_command == "engine":
                from seekrl.servers.engine import run_from_args

                run_from_args(args)
            elif args.serve_command == "policy":
                from seekrl.servers.policy import serve_policy

                serve_policy(args.model, host=args.host, port=args.port, token=args.token,
                             max_prompts_per_request=args.max_prompts_per_request,
                             max_completions_per_request=args.max_completions_per_request)
            elif args.serve_command == "retriever":
                from seekrl.retrieval.commands import serve_retriever

                serve_retriever(args.index, host=args.host, port=args.port, token=args.token)
            else:
                from seekrl.servers.mcp import serve_mcp

                serve_mcp(args.index, host=args.host, port=args.port, token=args.token, transport="stdio" if args.stdio else "http")
            return 0
        if args.command == "config":
            if args.reference:
                print(reference_markdown())
            else:
                print(load_config(args.config, args.overrides).to_yaml(), end="")
            return 0
        if args.command == "report":
            from seekrl.report import NotARunFolder, write_report

            try:
                print(write_report(args.run_dir, args.out))
            except NotARunFolder as e:
                print(f"seekrl: error: {e}", file=sys.stderr)
                return 2
            return 0
        if args.command == "demo":
            if args.recipe:
                from seekrl.recipes import run_recipe

                run_recipe(args.recipe, args.out, args.config, args.overrides)
                return 0
            from seekrl.demo import run_demo

            run_demo(args.out or "runs/demo", args.config, args.overrides)
            return 0
        cfg = load_config(args.config, args.overrides)
        if args.command == "train":
            from seekrl.parallel.ranks import rank_errors
            from seekrl.train.rl import train

            with rank_errors():  # under torchrun: one line naming the failed rank
                run_dir = train(cfg)
            print(f"run folder: {run_dir}", file=sys.stderr)
        elif args.command == "launch":
            from seekrl.cluster.ray_launch import LaunchError, launch

            try:
                run_dir = launch(cfg)
            except LaunchError as e:  # a rank failed (named), Ctrl-C, no room on the cluster, no Ray
                print(f"seekrl: error: {e}", file=sys.stderr)
                return e.status
            print(f"run folder: {run_dir}", file=sys.stderr)
        elif args.command == "sft":
            from seekrl.train.sft import sft

            run_dir = sft(cfg)
            print(f"run folder: {run_dir}", file=sys.stderr)
        elif args.command == "generate":
            from seekrl.generate import generate

            counts = generate(cfg)
            print(json.dumps(counts), file=sys.stderr)
            if counts["failed"] and not counts["written"] + counts["rejected"]:
                print(f"seekrl: error: every episode failed; first error: {counts.get('first_error')}", file=sys.stderr)
                return 1
        elif args.command == "eval":
            from seekrl.evaluate import eval_config

            eval_config(cfg)
    except (ConfigError, DataError) as e:
        print(f"seekrl: error: {e}", file=sys.stderr)
        return 2
    except (EngineUnavailable, EngineRequestError) as e:  # a dead or misconfigured engine server
        print(f"seekrl: error: {e}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError) as e:
        if args.command not in ("index", "serve"):  # bad input to those is reported; elsewhere a bug shows its traceback
            raise
        print(f"seekrl: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
