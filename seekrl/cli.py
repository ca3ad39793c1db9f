"""`seekrl` command line: train, launch, sft, eval, compare, average, curriculum, index, serve (retriever, mcp, policy), config, cache.

    seekrl train examples/tiny_grpo.yaml train.steps=50 algo.name=ppo
    seekrl launch examples/tiny_grpo.yaml cluster.engine_servers=2   # trainer ranks + engine servers on Ray
    seekrl sft CONFIG data.train=chats.jsonl            # chat SFT, loss on assistant tokens
    seekrl demo [--out runs/demo]                  # the embedded demo: SFT + GRPO with search on a CPU
    seekrl demo --recipe hotpotqa_smollm2          # SmolLM2-135M learns to search HotpotQA (about 2–2.7 h on a 2-core CPU with avx512_bf16)
    seekrl generate CONFIG generate.endpoint=http://127.0.0.1:8002/v1 generate.out=sft.jsonl   # or =teacher
    seekrl eval examples/gsm8k_grpo_smollm2.yaml model.path=runs/x/checkpoints/step_3/model
    seekrl compare runs/sft/eval runs/grpo/eval runs/grpo_s1/eval   # each gain over the first eval, its 95% CI, the seeds' mean
    seekrl average runs/grpo --last 2 --out runs/grpo/avg_last2   # one model: the mean weights of the last 2 checkpoints
    seekrl curriculum CONFIG data.curriculum=runs/curriculum.json   # pass rates of model.path on data.train (cached)
    seekrl index build --corpus hotpotqa --out runs/index/hotpotqa_bm25 --kind bm25
    seekrl serve retriever --index runs/index/hotpotqa_bm25 --port 8000 [--token T]
    seekrl serve mcp --index runs/index/hotpotqa_bm25 --port 8001
    seekrl serve policy --model runs/x/checkpoints/step_3/model --port 8002
    seekrl serve engine --model runs/x/checkpoints/step_3/model --port 30000   # SGLang's native RL API
    seekrl config examples/tiny_grpo.yaml          # print the resolved config
    seekrl config --reference                      # every key with its docstring
    seekrl report runs/tiny_grpo [--out PATH]      # HTML report + PNG plots + trajectories page
    seekrl cache list | prune [--dry-run]          # the dequantized-GGUF cache: what a load reads, delete the rest

Bad input (config, data) exits with status 2 and one line naming the problem and the fix.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

# Busy-waiting OpenMP threads make small torch ops 10-100x slower when the cores are shared (the
# engine's thread and the trainer, or other processes); passive waiting costs nothing measurable
# on an idle machine. Set before torch is imported; an explicit setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from seekrl.servers.flags import engine_flags, index_flags, policy_flags  # noqa: E402 (after the OpenMP setting)

__all__ = ["main", "parser"]


def parser() -> argparse.ArgumentParser:
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
    cm = sub.add_parser("compare", help="the paired bootstrap of evals: each later eval's gain over the first, its 95%% CI, "
                        "tasks up/down, and the mean of several (seeds)")
    cm.add_argument("base", help="the eval to compare against: an eval folder (runs/<name>/eval) or a trajectories.jsonl")
    cm.add_argument("after", nargs="+", help="one or more later evals of the same tasks (e.g. one per seed)")
    cm.add_argument("--metric", default="em", help="score/<metric> of each episode (em, f1, accuracy, ...) or reward (default: em)")
    cm.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples (default: 10000)")
    cm.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (default: 0)")
    cm.add_argument("--per-source", action="store_true", help="also compare each data set (the records' source) on its own")
    cm.add_argument("--match", default="task", choices=["task", "id"], help="pair a task by its data set and id "
                    "(default) or by id alone: the same questions read from files of different names")
    cm.add_argument("--by", default=None, metavar="FIELD", help="also compare each value of this field of the tasks' rows "
                    "(HotpotQA: type, level; dotted for a nested field)")
    cm.add_argument("--tasks", default=None, metavar="SPEC", help="with --by: the data the evals ran on (a file or data "
                    "name; default: data.eval of the config.yaml beside the base eval's trajectories)")
    cm.add_argument("--by-run", default=None, metavar="RUN", help="also compare the tasks by what this RL run did with them: "
                    "rewards differed in some step (trained), rewards equal, not sampled (it needs every group logged: "
                    "log.samples_every=1, log.samples_groups above a step's groups)")
    cm.add_argument("--json", default=None, help="also write the comparison as JSON to this file")
    av = sub.add_parser("average", help="checkpoint averaging: one model folder whose weights are the (weighted) mean of "
                        "several checkpoints of one model (the last K of a run with --last K)")
    av.add_argument("paths", nargs="+", metavar="PATH", help="model folders or checkpoint folders (runs/<name>/checkpoints/step_<N>); with --last, "
                    "one run folder")
    av.add_argument("--out", required=True, help="the model folder to write (must not exist, or be empty)")
    av.add_argument("--last", type=int, default=None, metavar="K", help="average the last K complete checkpoints of the run folder")
    av.add_argument("--weights", type=float, nargs="+", default=None, metavar="W", help="one weight per folder, oldest first "
                    "with --last (normalised to sum 1; default: equal)")
    cu = sub.add_parser("curriculum", help="measure model.path's pass rate on data.train (data.curriculum_k samples each); "
                        "write the data.curriculum cache that RL then filters by (0 < pass rate < 1)")
    cu.add_argument("config")
    cu.add_argument("overrides", nargs="*")
    ix = sub.add_parser("index", help="build a retrieval index (BM25 or dense) from a Search-R1 corpus")
    ixs = ix.add_subparsers(dest="index_command", metavar="ACTION", required=True)
    b = ixs.add_parser("build", help="index a corpus jsonl ({id, contents}) or a builtin corpus: hotpotqa, 2wiki")
    b.add_argument("--corpus", required=True)
    b.add_argument("--out", required=True, help="index folder to write")
    b.add_argument("--kind", choices=("bm25", "dense"), default="bm25")
    b.add_argument("--dense-kind", choices=("flat", "hnsw"), default="flat", help="faiss index for --kind dense")
    sv = sub.add_parser("serve", help="serve an engine (SGLang's RL API), a policy (OpenAI API), a retriever or MCP search")
    svs = sv.add_subparsers(dest="serve_command", metavar="WHAT", required=True)
    engine_flags(svs.add_parser("engine", help="SGLang's native RL API (/generate, /update_weights_from_disk, pause/continue, abort) over a model"))
    policy_flags(svs.add_parser("policy", help="an OpenAI-compatible /v1/chat/completions and /v1/completions server over a model"))
    index_flags(svs.add_parser("retriever", help="POST /retrieve, GET /health"), "retriever")
    index_flags(svs.add_parser("mcp", help="an MCP server with a search tool"), "mcp")
    c = sub.add_parser("config", help="print the resolved config, or the reference of every key")
    c.add_argument("config", nargs="?")
    c.add_argument("overrides", nargs="*")
    c.add_argument("--reference", action="store_true", help="print every section.key with its default and meaning")
    ca = sub.add_parser("cache", help="the cache of dequantized GGUF models ($SEEKRL_CACHE/gguf): list its folders, prune those no load reads")
    cas = ca.add_subparsers(dest="cache_command", metavar="ACTION", required=True)
    for name, what in (("list", "every folder, its size, and whether a load reads it (current)"),
                       ("prune", "delete the folders no load reads: other transformers versions, old path-keyed entries, GGUF files not kept")):
        a = cas.add_parser(name, help=what)
        a.add_argument("--keep", action="append", default=None, metavar="GGUF",
                       help="a .gguf file whose entry is current (repeatable; default: the installed SmolLM2)")
        if name == "prune":
            a.add_argument("--all", action="store_true", help="delete the current entries too (the next load re-creates them)")
            a.add_argument("--dry-run", action="store_true", help="print what would be deleted, delete nothing")
    rp = sub.add_parser("report", help="write an HTML report (PNG plots, sample trajectories) for a run folder")
    rp.add_argument("run_dir", help="run folder (runs/<log.name>)")
    rp.add_argument("--out", default=None, help="HTML file to write (default: RUN_DIR/report.html)")
    return p


def _compare_tasks(base: str, spec: str | None) -> tuple[list, str]:
    """`seekrl compare --by`'s tasks: `--tasks SPEC` (a data spec as data.eval takes it: files
    joined by commas, `[a:b]` slices), else the data.eval of the base eval's saved config, read
    as `seekrl eval` read it."""
    from seekrl.compare import trajectory_file
    from seekrl.config import load_config
    from seekrl.data.config import DataConfig
    from seekrl.data.sets import load_split
    from seekrl.errors import DataError

    if spec:
        return load_split(spec, DataConfig(), "test", None), spec
    saved = trajectory_file(base).parent / "config.yaml"
    if not saved.is_file():
        raise DataError(f"{saved}: no config.yaml beside the base eval's trajectories; give --tasks the data the evals ran on")
    d = load_config(saved).data
    if not d.eval:
        raise DataError(f"{saved}: no data.eval; give --tasks the data the evals ran on")
    return load_split(d.eval, d, "test", d.max_eval), f"data.eval of {saved}"


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command is None:
        parser().print_help()
        return 0
    from seekrl.errors import SeekrlError

    try:
        if args.command == "index":
            from seekrl.retrieval.commands import build_index

            build_index(args.corpus, args.out, kind=args.kind, dense_kind=args.dense_kind)
            return 0
        if args.command == "serve":
            if args.serve_command == "engine":
                from seekrl.servers.engine import run_from_args
            elif args.serve_command == "policy":
                from seekrl.servers.policy import run_from_args
            elif args.serve_command == "retriever":
                from seekrl.servers.retrieval import run_from_args
            else:
                from seekrl.servers.mcp import run_from_args
            run_from_args(args)
            return 0
        if args.command == "cache":
            from seekrl.gguf_cache import cache_entries, prune_cache

            keep = None
            if args.keep:
                keep = [Path(k) for k in args.keep]
                missing = [str(k) for k in keep if not k.is_file()]
                if missing:
                    print(f"seekrl: error: --keep: no such GGUF file: {', '.join(missing)}", file=sys.stderr)
                    return 2
            if args.cache_command == "list":
                entries = cache_entries(keep)
                for e in entries:
                    print(f"{e.bytes / 1e6:9.1f} MB  {'current' if e.current else 'unused '}  {e.path}")
                print(f"{sum(e.bytes for e in entries) / 1e6:.1f} MB in {len(entries)} folders, "
                      f"{sum(e.bytes for e in entries if not e.current) / 1e6:.1f} MB unused (seekrl cache prune)")
            else:
                gone = prune_cache(keep, everything=args.all, dry_run=args.dry_run)
                for e in gone:
                    print(f"{'would delete' if args.dry_run else 'deleted'} {e.bytes / 1e6:.1f} MB  {e.path}")
                print(f"{'would free' if args.dry_run else 'freed'} {sum(e.bytes for e in gone) / 1e6:.1f} MB "
                      f"({len(gone)} folders)")
            return 0
        if args.command == "config":
            from seekrl.config import load_config, reference_markdown

            if args.reference:
                print(reference_markdown())
            else:
                print(load_config(args.config, args.overrides).to_yaml(), end="")
            return 0
        if args.command == "compare":
            from seekrl.compare import compare_evals, compare_markdown

            if args.resamples < 100:
                print(f"seekrl: error: --resamples {args.resamples} is too few for a 95% interval; use at least 100", file=sys.stderr)
                return 2
            tasks, tasks_from = _compare_tasks(args.base, args.tasks) if args.by else (None, "")
            res = compare_evals(args.base, args.after, metric=args.metric, resamples=args.resamples, seed=args.seed,
                                per_source=args.per_source, by=args.by, tasks=tasks, tasks_from=tasks_from, match=args.match,
                                run=args.by_run)
            print(compare_markdown(res), end="")
            if args.json:
                Path(args.json).write_text(json.dumps(res, indent=2))
            return 0
        if args.command == "average":
            from seekrl.train.average import average_models, average_sources

            folders = average_sources(args.paths, args.last)
            record = average_models(folders, args.out, args.weights)
            print(f"averaged {record['tensors']} tensors of {len(folders)} models "
                  f"({', '.join(f'{w:.3g}' for w in record['weights'])}) into {args.out}", file=sys.stderr)
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
        from seekrl.config import load_config

        cfg = load_config(args.config, args.overrides)
        if args.command == "train":
            from seekrl.jobs import train
            from seekrl.parallel.ranks import rank_errors

            with rank_errors():  # under torchrun: one line naming the failed rank
                run_dir = train(cfg)
            print(f"run folder: {run_dir}", file=sys.stderr)
        elif args.command == "launch":
            from seekrl.cluster.ray_launch import launch

            run_dir = launch(cfg)  # a LaunchError: a rank failed (named), Ctrl-C, no room on the cluster, no Ray
            print(f"run folder: {run_dir}", file=sys.stderr)
        elif args.command == "sft":
            from seekrl.jobs import sft

            run_dir = sft(cfg)
            print(f"run folder: {run_dir}", file=sys.stderr)
        elif args.command == "generate":
            from seekrl.jobs import generate

            counts = generate(cfg)
            print(json.dumps(counts), file=sys.stderr)
            if counts["failed"] and not counts["written"] + counts["rejected"]:
                print(f"seekrl: error: every episode failed; first error: {counts.get('first_error')}", file=sys.stderr)
                return 1
        elif args.command == "eval":
            from seekrl.jobs import evaluate

            evaluate(cfg)
        elif args.command == "curriculum":
            from seekrl.jobs import curriculum

            print(curriculum(cfg))
    except SeekrlError as e:  # bad input (exit 2), a dead or misconfigured engine server (1): errors.py
        print(f"seekrl: error: {e}", file=sys.stderr)
        return e.exit_status
    except (ValueError, FileNotFoundError) as e:
        if args.command not in ("index", "serve"):  # bad input to those is reported; elsewhere a bug shows its traceback
            raise
        print(f"seekrl: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
