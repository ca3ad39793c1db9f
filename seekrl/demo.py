"""`seekrl demo` (what `make demo` runs): teach a tiny model to search, on a CPU, and show it learned.

    seekrl demo [--out runs/demo] [--config examples/demo_search.yaml] [overrides...]

The stages, each the same code as its own command (printed as it runs, so any stage can be
rerun by hand):

1. world   a seeded synthetic multi-hop world (data/synthetic.py): corpus, train/test questions
2. index   BM25 over its corpus                                 (seekrl index build)
3. teacher the scripted teacher plays the agent loop with the real search tool on the train
           split, imperfect on purpose (it skips search or asks weak queries at times)
                                                                (seekrl generate, endpoint=teacher)
4. pretrain  a tiny model, randomly initialised, reads background text, as a base model has
           read text before it is taught to search: the paragraphs of another, larger world
           (another seed; none names an entity of the demo world) and, with
           `demo.pretrain_episodes`, the flawless teacher's episodes on that world's questions
           (4a: its own index and the real tool; every token trained). That is where it learns
           to read: to copy a name or a number from a passage (an induction circuit forms after
           some 500 steps). Its BPE tokenizer is trained on that text and the demo teacher's
           episodes (whose loss is logged before and after). Pretraining on the demo world's
           own corpus instead lets the tiny model memorise it (LM loss 0.04), and then it needs
           no search.                                           (seekrl generate, seekrl sft)
5. sft     it learns the teacher's episodes with the tool output masked   (seekrl sft)
6. eval    greedy, test split, the RL workflow with the real tool   (seekrl eval)
7. grpo    GRPO with search from the SFT checkpoint             (seekrl train)
8. eval    again, then the report: a before/after table (EM, F1, searches per question, answer
           rate; all, 1-hop, 2-hop, comparison) printed and saved as results.json / results.md,
           and report.html with plots of the GRPO run            (seekrl report)

All settings are in the config (examples/demo_search.yaml); the `demo:` keys below are the
stage-specific ones. A rerun with the same folder resumes the stages that finished.
"""

from __future__ import annotations

import json
import random
import re
import shlex
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from seekrl.config import load_config

__all__ = ["run_demo", "before_after_rows", "markdown_table", "stage_printer", "DEFAULT_CONFIG"]

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "examples" / "demo_search.yaml"
SCOPES = (("all", ""), ("1-hop", "1hop/"), ("2-hop", "2hop/"), ("comparison", "comparison/"))
COLUMNS = (("EM", "em"), ("F1", "f1"), ("searches/question", "tool_calls"), ("answer rate", "answer_rate"))


def before_after_rows(before: dict, after: dict) -> list[dict]:
    """One row per scope: the eval metrics after SFT and after RL, side by side."""
    rows = []
    for label, scope in SCOPES:
        if f"eval/{scope}em" not in before:
            continue
        row: dict = {"questions": label, "n": int(before.get(f"eval/{scope}count", 0))}
        for name, key in COLUMNS:
            b, a = before.get(f"eval/{scope}{key}"), after.get(f"eval/{scope}{key}")
            row[f"{name} SFT"] = b
            row[f"{name} RL"] = a
        rows.append(row)
    return rows


def stage_printer(console: Console, t0: float):
    """`stage(name, command)`: a rule with the stage's name and the seconds since `t0`, then the
    command it runs, printed literally (an override such as reward.functions=[qa_em] is not markup)."""

    def stage(name: str, command: str) -> None:
        console.rule(f"[bold]{escape(name)}[/bold]  [dim]{time.perf_counter() - t0:.0f}s[/dim]")
        console.print(f"[dim]$ {escape(command)}[/dim]", highlight=False)

    return stage


def markdown_table(rows: list[dict]) -> str:
    """A markdown table of `rows` (the first row's keys are the columns; floats to 3 decimals, None as -)."""
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = ["-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v) for v in r.values()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _demo_names_pattern(world_dir: Path) -> re.Pattern:
    names = [json.loads(line)["name"] for line in (world_dir / "entities.jsonl").read_text(encoding="utf-8").splitlines()]
    return re.compile("|".join(rf"\b{re.escape(n)}\b" for n in sorted(names, key=len, reverse=True)))


def _write_background(path: Path, world_dir: Path, bg_dir: Path, d, config: str, overrides: list[str], stage) -> None:
    """The pretraining rows, from another world (seed + 1) than the demo's: its paragraphs as text
    rows (4 passages each, 2 passes) and, with `demo.pretrain_episodes`, the scripted teacher's
    episodes on its questions, played flawlessly with the real search tool over its own index,
    every token trained (observations too: this is reading, not imitation). Passages and episodes
    that name an entity of the demo world (names from two seeds can coincide) are left out."""
    from seekrl.data.corpus import corpus_text_rows
    from seekrl.data.synthetic import make_world
    from seekrl.jobs import generate
    from seekrl.retrieval.commands import build_index

    demo_names = _demo_names_pattern(world_dir)
    world = make_world(seed=d.world_seed + 1, n_entities=d.pretrain_entities, n_questions=d.pretrain_episodes,
                       style=d.world_style, test_fraction=0.0)
    docs = [doc for doc in world.documents if not demo_names.search(doc.contents)]
    rows = list(corpus_text_rows(docs, per_row=4, passes=2, seed=d.world_seed + 1))
    if d.pretrain_episodes:
        world.save(bg_dir / "world")
        build_index(str(bg_dir / "world" / "corpus.jsonl"), str(bg_dir / "index"), kind="bm25")
        episodes = bg_dir / "teacher.jsonl"
        gen = [f"data.train={bg_dir / 'world' / 'train.jsonl'}", "data.eval=null", f"tools.retriever={bg_dir / 'index'}",
               f"log.dir={bg_dir}", *overrides, "generate.endpoint=teacher", f"generate.out={episodes}", "generate.n=1",
               "generate.teacher_skip_search=0", "generate.teacher_stop_early=0", "generate.teacher_weak_query=0",
               "generate.teacher_give_up=0"]
        stage("4a. background episodes", "seekrl generate " + " ".join(shlex.quote(a) for a in [config, *gen]))
        generate(load_config(config, gen))
        for line in episodes.read_text(encoding="utf-8").splitlines():
            ep = json.loads(line)
            if not demo_names.search(line):
                rows.append({"prompt": ep["prompt"], "segments": [{"text": s["text"], "masked": False} for s in ep["segments"]]})
    random.Random(f"background-{d.world_seed}").shuffle(rows)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)


def run_demo(out: str = "runs/demo", config: str | None = None, overrides: list[str] = ()) -> dict:
    """Run every stage (module docstring); returns the before/after metrics."""
    from seekrl.data.synthetic import make_world
    from seekrl.evaluate import eval_table_markdown
    from seekrl.jobs import evaluate, generate, sft, train
    from seekrl.report import markdown_table_to_html, write_report
    from seekrl.retrieval.commands import build_index

    console = Console(stderr=True)
    out_dir = Path(out)
    config = str(config or DEFAULT_CONFIG)
    world_dir, index_dir = out_dir / "world", out_dir / "index"
    paths = [f"data.train={world_dir / 'train.jsonl'}", f"data.eval={world_dir / 'test.jsonl'}",
             f"tools.retriever={index_dir}", f"log.dir={out_dir}"]
    # a bad config fails here, before anything runs (the tool checks wait for the index)
    d = load_config(config, paths + list(overrides) + ["tools.format=null"]).demo
    t0 = time.perf_counter()
    stage = stage_printer(console, t0)

    def cmd(*args: str) -> str:
        return "seekrl " + " ".join(shlex.quote(a) for a in args)

    world_args = dict(seed=d.world_seed, n_entities=d.world_entities, n_questions=d.world_questions, style=d.world_style)
    stage("1. world", "make_world(" + ", ".join(f"{k}={v!r}" for k, v in world_args.items()) + ")")
    if not (world_dir / "test.jsonl").is_file():
        make_world(**world_args).save(world_dir)
    stage("2. index", cmd("index", "build", "--corpus", str(world_dir / "corpus.jsonl"), "--out", str(index_dir)))
    if not (index_dir / "meta.json").is_file():
        build_index(str(world_dir / "corpus.jsonl"), str(index_dir), kind="bm25")
    load_config(config, paths + list(overrides))

    sft_rows = out_dir / "teacher.jsonl"
    gen = [*paths, *overrides, "generate.endpoint=teacher", f"generate.out={sft_rows}", f"generate.n={d.teacher_n}"]
    stage("3. teacher", cmd("generate", config, *gen))
    counts = generate(load_config(config, gen))
    console.print(f"teacher: {counts['written']} episodes, mean reward {counts['mean_reward']:.3f}, "
                  f"{counts['tool_calls'] / max(1, counts['written'] + counts['already_done']):.2f} searches/episode")

    sft_base = None
    if d.pretrain_steps:
        text_rows = out_dir / "background_text.jsonl"
        if not text_rows.is_file():
            _write_background(text_rows, world_dir, out_dir / "background", d, config, list(overrides), stage)
        pre_over = [*paths, *overrides, f"data.train={text_rows}", f"data.eval={sft_rows}", "log.name=pretrain",
                    f"train.steps={d.pretrain_steps}", f"train.lr={d.pretrain_lr}", f"rollout.batch_size={d.sft_batch_size}",
                    "train.warmup_steps=20", "train.schedule=cosine", "train.save_every=0", "train.resume=auto", "eval.every=0"]
        stage("4. pretrain", cmd("sft", config, *pre_over))
        sft(load_config(config, pre_over))
        sft_base = out_dir / "pretrain" / "checkpoints" / f"step_{d.pretrain_steps}" / "model"

    sft_over = [*paths, *overrides, f"data.train={sft_rows}", "data.eval=null", "log.name=sft",
                f"train.steps={d.sft_steps}", f"train.lr={d.sft_lr}", f"rollout.batch_size={d.sft_batch_size}",
                "train.warmup_steps=20", "train.schedule=cosine", "train.save_every=0", "train.resume=auto"]
    if sft_base is not None:
        sft_over.append(f"model.path={sft_base}")
    stage("5. sft", cmd("sft", config, *sft_over))
    sft(load_config(config, sft_over))
    sft_model = out_dir / "sft" / "checkpoints" / f"step_{d.sft_steps}" / "model"

    def evaluate_model(model: Path, name: str) -> dict:
        ev = [*paths, *overrides, f"model.path={model}", f"log.name={name}"]
        stage(f"eval {name}", cmd("eval", config, *ev))
        return evaluate(load_config(config, ev))

    before = evaluate_model(sft_model, "sft")
    rl_over = [*paths, *overrides, f"model.path={sft_model}", "log.name=grpo", "train.resume=auto"]
    stage("7. grpo", cmd("train", config, *rl_over))
    rl_cfg = load_config(config, rl_over)
    train(rl_cfg)
    rl_model = out_dir / "grpo" / "checkpoints" / f"step_{rl_cfg.train.steps}" / "model"
    after = evaluate_model(rl_model, "grpo")

    rows = before_after_rows(before, after)
    table = markdown_table(rows)
    results = {"before_sft": before, "after_rl": after, "table": rows, "seconds": time.perf_counter() - t0,
               "em_gain_points": 100 * (after["eval/em"] - before["eval/em"])}
    (out_dir / "results.json").write_text(json.dumps(results, indent=2))
    (out_dir / "results.md").write_text(
        "# seekrl demo: test split, greedy, after SFT vs after GRPO\n\n" + table
        + "\n## After SFT\n\n" + eval_table_markdown(before) + "\n## After GRPO\n\n" + eval_table_markdown(after)
    )
    report = write_report(
        out_dir / "grpo", out_dir / "report.html", title="seekrl demo: a tiny model learns to search",
        sections=[("Test split before and after GRPO (greedy)", markdown_table_to_html(table))],
    )
    stage("done", cmd("report", str(out_dir / "grpo")))
    print(table, end="")
    print(f"EM {before['eval/em']:.3f} after SFT -> {after['eval/em']:.3f} after GRPO "
          f"({results['em_gain_points']:+.1f} points); 2-hop EM {before.get('eval/2hop/em', 0):.3f} -> "
          f"{after.get('eval/2hop/em', 0):.3f}; {results['seconds'] / 60:.1f} min")
    print(f"wrote {out_dir / 'results.json'}, {out_dir / 'results.md'} and {report}", file=sys.stderr)
    return results
