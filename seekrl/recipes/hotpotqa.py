"""The HotpotQA recipe: SmolLM2-135M-Instruct learns to search, on a CPU.

    seekrl demo --recipe hotpotqa_smollm2 --out runs/hotpotqa      # make demo-hotpotqa

The stages, each the same code as its own command (printed as it runs, so any stage can be rerun
by hand); a rerun with the same folder skips every stage whose output is complete:

1. index   BM25 over HotpotQA's 14,903 paragraphs (both files)  (seekrl index build --corpus hotpotqa)
2. split   dev_distractor.jsonl, split by a fixed hash of each row's `_id` (`hotpotqa_split`):
           `demo.eval_questions` held-out questions (DIR/data/heldout.jsonl; its first
           `demo.base_questions` are DIR/data/base.jsonl), `demo.check_questions` check questions
           (DIR/data/check.jsonl; its open questions, `answer_options`, also in
           DIR/data/check_open.jsonl), the rest to train on (DIR/data/train.jsonl). SFT and GRPO
           see only the train file.
2b. share  (with `demo.sft_share` < 1) the first share of the train file (`sft_share_split`) to
           DIR/data/train_sft.jsonl, which the teacher plays and SFT trains on, the rest to
           DIR/data/train_rl.jsonl, which GRPO draws from: GRPO's questions are ones whose answers
           SFT never saw (with `demo.grpo_share=all` GRPO draws from every training question,
           SFT's share too)
3. teacher the scripted teacher (data/teacher.py, `first_query: question`) plays each train
           question with the real search tool: the question as its first query, the title of each
           gold paragraph still missing (the bridge entity) next, then the answer. Episodes whose
           answer is not the gold answer are dropped (`generate.min_reward`), and so are those
           whose answer no retrieved passage contains (yes/no answers excepted): the student could
           only learn to guess from them. Both are judged by the search_r1 reward's parts (em,
           retrieved_gold), whatever `reward.functions` and `reward.weights` GRPO is given. (seekrl generate, endpoint=teacher)
4. base    the untrained model on the first held-out questions   (seekrl eval)
5. sft     the warm start on the teacher's episodes, tool output masked  (seekrl sft)
6. eval    the SFT model on the held-out questions               (seekrl eval)
6a. open    (with `demo.grpo_questions=open`) the training questions whose answer has to be read
           (`answer_options`: not yes/no, not "X or Y?") to DIR/data/train_open.jsonl: GRPO and
           the curriculum draw only from them; a policy that cannot read answers the others by chance
           (with `demo.grpo_questions=retrievable`) then only those whose question, searched as it is,
           brings back every needed paragraph in its top `tools.topk` results
           (`retrievable_rows`), to DIR/data/train_retrievable.jsonl: the episodes of a group
           then read the same paragraphs, and their rewards differ by how they read them
6b. curriculum (with `demo.curriculum_questions` N > 0) the SFT model's pass rate on the first N
           training questions, `data.curriculum_k` samples each at the GRPO temperature, seed 0
           (DIR/curriculum.json); every GRPO seed trains only on the questions solved in some but
           not all samples, where a group's rewards are likely to differ (seekrl curriculum)
6c. ptx     (with `demo.ptx_coef` > 0) the teacher's kept episodes of the training questions GRPO
           does not draw (the two-answer ones with `demo.grpo_questions=open`), of the question
           kinds `demo.ptx_kinds` (e.g. [yes/no]), to
           DIR/data/ptx.jsonl: every GRPO update adds their SFT loss (PPO-ptx, train/ptx.py), so
           GRPO on the open questions keeps SFT's behaviour on the others
7. grpo    GRPO with search from the SFT checkpoint, one run per `demo.grpo_seeds` (seekrl train);
           with `demo.grpo_engine=vllm` each run samples on a vLLM server it starts and stops
           (`grpo_engine_overrides`), while every eval samples in-process; `demo.grpo_dtype` is
           the GRPO stages' engine.dtype only (e.g. a bf16 vLLM server, fp32 evals) and
           `demo.grpo_micro_batch_tokens` their train.micro_batch_tokens (`grpo_overrides`)
8. eval    the GRPO model on the held-out questions, then on the check questions (seekrl eval);
           with `demo.grpo_parallel` N > 1, N seeds train at once, each a child `seekrl train`
           with its share of the cores (recipes/children.py), then their evals run at once
9. report  DIR/results.json, DIR/results.md (EM, F1, searches per question, well-formed episodes,
           answer rate; wall time per stage; the GRPO gain over SFT with a paired-bootstrap 95%
           interval; EM by question type; the questions with two possible answers, yes/no and
           "X or Y?", against chance, the EM on the open rest and each seed's gain there
           (`answer_options`, `two_way_guesses`); which search retrieved the paragraphs each
           question needs (`search_support`); these scores are in recipes/hotpotqa_scores.py) and
           DIR/report.html (plots of the GRPO run first)  (seekrl report)

A longer budget is the same command with more steps (`train.steps=30`, `demo.sft_steps=210`): the
trained stage resumes from its last checkpoint, and the evals after it run again on the new one.

Every run folder (DIR/sft, DIR/grpo) holds its resolved config.yaml, and
`seekrl eval DIR/grpo/config.yaml model.path=DIR/grpo/checkpoints/step_N/model data.eval=FILE`
evaluates any HotpotQA-schema file with the stage's tools and format (with demo.grpo_engine=vllm
DIR/grpo's config samples on a vLLM server: DIR/sft/config.yaml evaluates in-process, as the recipe).
"""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
import time
from pathlib import Path

from rich.console import Console

from seekrl.compare import compare_scores
from seekrl.config import Config, ConfigError, load_config
from seekrl.recipes.children import Child, available_memory_gib, core_share, run_at_once, steps_done
from seekrl.recipes.hotpotqa_results import results_markdown, support_rows, two_way_rows, type_rows
from seekrl.recipes.hotpotqa_scores import (answer_options, em_by_type, eval_answers, paired_bootstrap,
                                            question_types, search_support, two_way_guesses)

__all__ = ["run", "check_config", "grpo_engine_overrides", "grpo_overrides", "hotpotqa_split", "sft_share_split", "retrievable_rows", "curriculum_counts", "paired_bootstrap", "supported_episode", "question_types", "em_by_type", "answer_options", "two_way_guesses", "search_support", "learning_curve",
           "check_from_curve", "DEFAULT_CONFIG", "SPLIT_KEY"]

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "examples" / "hotpotqa_smollm2_recipe.yaml"
SPLIT_KEY = "seekrl-hotpotqa-split-v1"  # part of the hash: changing it would change the split
COLUMNS = (("EM", "eval/em"), ("F1", "eval/f1"), ("searches/question", "eval/tool_calls"),
           ("well-formed", "eval/well_formed"), ("answer rate", "eval/answer_rate"))


def hotpotqa_split(rows: list[dict], n_eval: int, n_check: int) -> dict[str, list[dict]]:
    """{"heldout", "check", "train"}: the rows ordered by sha256(SPLIT_KEY|_id); the first `n_eval`
    are held out, the next `n_check` are the check set, the rest are for training. The same rows
    give the same split on any machine and in any order."""
    if n_eval < 1 or n_check < 0 or n_eval + n_check >= len(rows):
        raise ValueError(f"cannot hold out {n_eval} + {n_check} of {len(rows)} questions and keep some to train on")
    ids = [str(r.get("_id") or r.get("id") or "") for r in rows]
    if "" in ids or len(set(ids)) != len(ids):
        raise ValueError("every HotpotQA row needs a unique _id to be split")
    order = sorted(range(len(rows)), key=lambda i: hashlib.sha256(f"{SPLIT_KEY}|{ids[i]}".encode()).hexdigest())
    chosen = [rows[i] for i in order]
    return {"heldout": chosen[:n_eval], "check": chosen[n_eval:n_eval + n_check], "train": chosen[n_eval + n_check:]}


def sft_share_split(train: list[dict], share: float) -> tuple[list[dict], list[dict]]:
    """(the teacher's and SFT's questions, GRPO's): the first round(share * n) training rows and the
    rest. The train file is in the split's fixed hash order, so the shares are fixed too."""
    k = round(share * len(train))
    if not 0 < k < len(train):
        raise ConfigError(f"demo.sft_share={share:g} of {len(train)} training questions leaves "
                          f"{'SFT' if k == 0 else 'GRPO'} none: set it between {1 / len(train):.3g} and {1 - 1 / len(train):.3g}, or 1")
    return train[:k], train[k:]


def retrievable_rows(rows: list[dict], index_dir: Path, topk: int) -> list[dict]:
    """The HotpotQA rows (in order) whose every needed paragraph (`hotpotqa_gold_titles`) is named
    in the top `topk` results of the question itself searched in the index at `index_dir`: the
    first search of a policy that asks the question as it is (the teacher's, and so SFT's) finds
    them all, and what decides its reward is how it reads them."""
    from seekrl.data.corpus import hotpotqa_gold_titles
    from seekrl.data.teacher import names_title
    from seekrl.retrieval.retriever import load_index
    from seekrl.tools.search import format_passages

    results = load_index(index_dir).search([r["question"] for r in rows], topk) if rows else []
    keep = []
    for row, hits in zip(rows, results):
        shown, titles = format_passages(hits), hotpotqa_gold_titles(row)
        if titles and all(names_title(shown, t) for t in titles):
            keep.append(row)
    return keep


def supported_episode(row: dict) -> bool:
    """A teacher episode whose answer a retrieved passage contains (or a yes/no answer)."""
    from seekrl.rewards.qa import gold_list, normalize_answer

    parts = row.get("reward_parts") or {}
    if any(v for k, v in parts.items() if k.split("/")[-1] == "retrieved_gold"):
        return True
    return any(normalize_answer(g) in ("yes", "no") for g in gold_list(row.get("answer")))


def curriculum_counts(path: Path) -> dict:
    """A data.curriculum cache's counts: questions measured, k, those kept (0 < correct < n), those
    some sample solved and those every sample solved."""
    from seekrl.data.curriculum import informative_counts

    doc = json.loads(path.read_text(encoding="utf-8"))
    tasks = doc["tasks"]
    kept = sum(informative_counts(t["n"], t["correct"]) for t in tasks)
    solved = sum(t["correct"] > 0 for t in tasks)
    return {"measured": len(tasks), "k": int(doc["key"]["k"]), "kept": int(kept), "solved_by_some_sample": solved,
            "solved_by_all": sum(t["n"] > 0 and t["correct"] == t["n"] for t in tasks)}


def learning_curve(run_dir: Path) -> list[dict]:
    """The GRPO run's evals on the curve questions (metrics.jsonl rows with eval/em): step, training
    minutes so far (the sum of step times, evals not included), check-set EM and F1, and the mean
    training reward of the last steps since the previous point."""
    from seekrl.observe.loggers import read_metrics

    out, minutes, rewards = [], 0.0, []
    for r in read_metrics(run_dir):
        minutes += r.get("time/step_s", 0.0) / 60
        if "reward/mean" in r:
            rewards.append(r["reward/mean"])
        if "eval/em" in r:
            out.append({"step": int(r["step"]), "minutes": minutes, "check EM": r["eval/em"], "check F1": r.get("eval/f1"),
                        "check well-formed": r.get("eval/well_formed"),
                        "reward/mean (steps since the last point)": sum(rewards) / len(rewards) if rewards else None})
            rewards = []
    return out


def check_from_curve(run_dir: Path) -> dict:
    """The last eval of the learning curve (the final policy on the curve questions), as eval.json's keys."""
    from seekrl.observe.loggers import read_metrics

    last = [r for r in read_metrics(run_dir) if "eval/em" in r]
    if not last:
        raise ValueError(f"{run_dir}/metrics.jsonl has no eval on the check questions")
    return {k: v for k, v in last[-1].items() if k.startswith("eval/")}


def _dev_rows() -> list[dict]:
    """HotpotQA's dev_distractor rows, wherever the builtin name `hotpotqa` resolves (data/loaders.py)."""
    from seekrl.data.loaders import builtin_rows

    return [row for _, row in builtin_rows("hotpotqa", "dev")]


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _write_jsonl(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)


def _evaluated(eval_dir: Path, model: str, questions: Path) -> bool:
    """Whether `eval_dir` holds a finished eval of this model on these questions (a rerun with
    more GRPO or SFT steps evaluates the new checkpoint again, and so does a rerun that wrote the
    same checkpoint path again after the eval: a stage retrained in DIR)."""
    import yaml

    result = eval_dir / "eval.json"
    if not result.is_file() or not (eval_dir / "config.yaml").is_file():
        return False
    cfg = yaml.safe_load((eval_dir / "config.yaml").read_text()) or {}
    if (cfg.get("model") or {}).get("path") != str(model) or (cfg.get("data") or {}).get("eval") != str(questions):
        return False
    weights = list(Path(model).glob("*.safetensors"))  # none for a named model (model.path=smollm2)
    return all(w.stat().st_mtime <= result.stat().st_mtime for w in weights)


def _at_once(console: Console, timings: dict, timings_path: Path, label: str, children: list[Child]) -> None:
    """`children` at once, each with its share of the cores (recipes/children.py); their wall time
    is one stage of stage_seconds.json (`label (at once)`), so the stages still add up to the run's."""
    threads = core_share(len(children))
    console.print(f"{len(children)} at once, {threads} torch thread{'s' * (threads > 1)} each: "
                  + ", ".join(f"{c.name} (log {c.log})" for c in children))
    start = time.perf_counter()
    run_at_once(children, threads, console)
    timings[f"{label} (at once)"] = round(time.perf_counter() - start, 1)
    timings_path.write_text(json.dumps(timings, indent=2))


def _train_seconds(run_dir: Path) -> float:
    """The sum of a training run's step times (metrics.jsonl `time/step_s`): its training time
    across resumes (a stage's wall time counts only its last, uninterrupted attempt)."""
    from seekrl.observe.loggers import read_metrics

    return round(sum(r.get("time/step_s", 0.0) for r in read_metrics(run_dir)), 1)


def grpo_engine_overrides(cfg: Config) -> list[str]:
    """The GRPO stages' engine keys: `demo.grpo_dtype` as engine.dtype (none when null), and for
    `demo.grpo_engine=vllm` one vLLM server started by each GRPO run, with `--max-model-len`
    model.max_context unless engine.server_args already gives it. The evals are not given them:
    they sample in-process, with engine.dtype."""
    dtype = [f"engine.dtype={cfg.demo.grpo_dtype}"] if cfg.demo.grpo_dtype else []
    if cfg.demo.grpo_engine == "local":
        return dtype
    args = [str(a) for a in cfg.engine.server_args]
    if not any(a.split("=")[0] == "--max-model-len" for a in args):
        args += ["--max-model-len", str(cfg.model.max_context)]
    return [*dtype, "engine.servers=1", "engine.server_kind=vllm", f"engine.server_args={json.dumps(args)}"]


def grpo_overrides(cfg: Config) -> list[str]:
    """Every key the GRPO stages set beyond the recipe's config: its engine keys
    (`grpo_engine_overrides`) and, with demo.grpo_micro_batch_tokens, their
    train.micro_batch_tokens (SFT keeps the config's)."""
    micro = [f"train.micro_batch_tokens={cfg.demo.grpo_micro_batch_tokens}"] if cfg.demo.grpo_micro_batch_tokens else []
    return [*grpo_engine_overrides(cfg), *micro]


def check_config(config: str, overrides: list[str]) -> Config:
    """The recipe's config with its overrides, every check run before any stage: the index the
    stages build does not exist yet, so the retriever is checked as a server URL would be (the
    index folder is checked once built), and the options that need the search tool
    (rollout.answer_branches, tools.format) are checked with it. The GRPO stages' own keys
    (`grpo_overrides`) are checked too: with demo.grpo_engine=vllm, vLLM installed and its
    config rules (no top-p, no top-k)."""
    import importlib.util

    from seekrl.engines.setup import default_server_python

    unbuilt = "tools.retriever=http://127.0.0.1:1/retrieve"
    cfg = load_config(config, [*overrides, unbuilt])
    grpo = grpo_overrides(cfg)
    if cfg.demo.grpo_engine == "vllm":
        if not (cfg.engine.server_python or default_server_python() or importlib.util.find_spec("vllm")):
            raise ConfigError("demo.grpo_engine=vllm samples GRPO on a vLLM server, and vLLM is not installed: run `make vllm` "
                              "(it builds .venv-vllm) or name its interpreter with engine.server_python")
    if grpo:
        load_config(config, [*overrides, *grpo, unbuilt])
    check_seed_memory(cfg)
    return cfg


def check_seed_memory(cfg: Config, n: int | None = None, available: float | None = None) -> None:
    """With demo.grpo_parallel > 1: `n` seeds at once (default: a whole group,
    min(demo.grpo_parallel, seeds)) must fit the machine's available memory, demo.seed_memory_gib
    each (`available`: GiB, default Linux MemAvailable; unknown: no check)."""
    d = cfg.demo
    n = min(d.grpo_parallel, len(d.grpo_seeds)) if n is None else n
    if n < 2 or d.seed_memory_gib <= 0:
        return
    available = available_memory_gib() if available is None else available
    if available is not None and n * d.seed_memory_gib > available:
        raise ConfigError(f"demo.grpo_parallel={d.grpo_parallel} runs {n} GRPO seeds at once, about {n * d.seed_memory_gib:.1f} GiB at their peak "
                          f"({n} x demo.seed_memory_gib={d.seed_memory_gib:g}), and {available:.1f} GiB is available: lower demo.grpo_parallel, "
                          f"free memory, or set demo.seed_memory_gib to what one seed of your setting takes (0: no check)")


def run(out: str = "runs/hotpotqa", config: str | None = None, overrides: list[str] = ()) -> dict:
    """Run every stage (module docstring); returns results.json's content."""
    from seekrl import jobs
    from seekrl.demo import markdown_table, stage_printer
    from seekrl.report import markdown_table_to_html, write_report
    from seekrl.retrieval.commands import build_index

    console = Console(stderr=True)
    out_dir = Path(out)
    config = str(config or DEFAULT_CONFIG)
    index_dir, data_dir = out_dir / "index", out_dir / "data"
    files = {k: data_dir / f"{k}.jsonl" for k in ("train", "heldout", "check", "base", "curve", "check_open")}
    paths = [f"data.train={files['train']}", f"data.eval={files['heldout']}", f"tools.retriever={index_dir}", f"log.dir={out_dir}"]
    overrides = list(overrides)
    cfg0 = check_config(config, paths + overrides)  # a bad config fails before anything runs
    d = cfg0.demo
    timings_path = out_dir / "stage_seconds.json"
    out_dir.mkdir(parents=True, exist_ok=True)
    timings: dict = json.loads(timings_path.read_text()) if timings_path.is_file() else {}
    t0 = time.perf_counter()
    stage = stage_printer(console, t0)

    def timed(name: str, fn, *args):
        start = time.perf_counter()
        result = fn(*args)
        timings[name] = round(time.perf_counter() - start, 1)
        timings_path.write_text(json.dumps(timings, indent=2))
        return result

    def cmd(*args: str) -> str:
        return "seekrl " + " ".join(shlex.quote(str(a)) for a in args)

    stage("1. index", cmd("index", "build", "--corpus", "hotpotqa", "--out", index_dir, "--kind", "bm25"))
    if not (index_dir / "meta.json").is_file():
        timed("index", build_index, "hotpotqa", str(index_dir), "bm25")

    stage("2. split", f"hotpotqa_split(dev_distractor.jsonl, n_eval={d.eval_questions}, n_check={d.check_questions})")
    if not all(f.is_file() for f in files.values()):
        split = hotpotqa_split(_dev_rows(), d.eval_questions, d.check_questions)
        split["base"] = split["heldout"][:d.base_questions]
        split["curve"] = split["check"][:d.curve_questions]
        split["check_open"] = [r for r in split["check"] if answer_options(r)[0] == "open"]  # what sampling can sharpen
        for k, rows in split.items():
            _write_jsonl(files[k], rows)
    counts = {k: sum(1 for _ in f.open(encoding="utf-8")) for k, f in files.items()}
    console.print(f"split: {counts['train']} train, {counts['heldout']} held-out, {counts['check']} check questions")
    load_config(config, paths + overrides)  # the tool checks, now that the index exists

    # demo.sft_share < 1: the teacher and SFT on the first share of the training questions, GRPO on the rest
    teacher_train, rl_train = files["train"], files["train"]
    if d.sft_share < 1:
        teacher_train, rl_train = data_dir / "train_sft.jsonl", data_dir / "train_rl.jsonl"
        stage("2b. share", f"the first {d.sft_share:g} of {files['train']} -> {teacher_train} (teacher, SFT), "
                           f"the rest -> {rl_train} (GRPO)")
        shares = sft_share_split(_read_jsonl(files["train"]), d.sft_share)
        for f, rows in zip((teacher_train, rl_train), shares):
            _write_jsonl(f, rows)
        counts["train_sft"], counts["train_rl"] = (len(rows) for rows in shares)
        console.print(f"SFT's share: the teacher plays {counts['train_sft']} training questions, "
                      f"GRPO draws from the other {counts['train_rl']} (demo.sft_share={d.sft_share:g})")

    episodes, sft_rows = out_dir / "teacher.jsonl", out_dir / "teacher_sft.jsonl"
    # the teacher's episodes are kept by search_r1's parts (em, retrieved_gold), whatever reward GRPO is given
    gen = [*paths, *overrides, f"data.train={teacher_train}", "data.eval=null", "generate.endpoint=teacher",
           f"generate.out={episodes}", f"generate.n={d.teacher_n}", "reward.functions=[search_r1]", "reward.weights=null"]
    stage("3. teacher", cmd("generate", config, *gen))
    made = out_dir / "teacher_counts.json"  # a rerun in DIR reuses the teacher and SFT stages: of the same share only
    if made.is_file() and (was := json.loads(made.read_text()).get("sft_share", 1.0)) != d.sft_share:
        raise ConfigError(f"{out_dir}'s teacher and SFT stages were made with demo.sft_share={was:g}, not {d.sft_share:g}: "
                          f"use another --out, or demo.sft_share={was:g}")
    if not sft_rows.is_file():
        timed("teacher", jobs.generate, load_config(config, gen))
        gold = _read_jsonl(episodes)
        rejected = episodes.with_name(episodes.stem + ".rejected.jsonl")
        played = gold + (_read_jsonl(rejected) if rejected.is_file() else [])
        kept = [r for r in gold if supported_episode(r)]
        _write_jsonl(sft_rows, kept)
        teacher = {"sft_share": d.sft_share, "episodes": len(played), "gold": len(gold), "kept": len(kept),
                   "searches_per_episode": sum(r["metrics"]["tool_calls"] for r in kept) / max(1, len(kept))}
        (out_dir / "teacher_counts.json").write_text(json.dumps(teacher, indent=2))
    teacher = json.loads((out_dir / "teacher_counts.json").read_text())
    console.print(f"teacher: kept {teacher['kept']} of {teacher['episodes']} episodes "
                  f"({teacher['gold']} gold answers), {teacher['searches_per_episode']:.2f} searches/episode")

    def eval_over(name: str, model: str, questions: str) -> list[str]:
        return [*paths, *overrides, f"model.path={model}", f"data.eval={files[questions]}", f"log.name={name}"]

    def heldout_eval(name: str, model: str) -> list[str]:
        """The command line of a seed's eval on the held-out questions, as a child runs it (printed as its stage)."""
        ev = eval_over(name, model, "heldout")
        stage(f"eval {name}", cmd("eval", config, *ev))
        return [sys.executable, "-m", "seekrl.cli", "eval", config, *ev]

    def evaluate(name: str, model: str, questions: str) -> dict:
        ev = eval_over(name, model, questions)
        stage(f"eval {name}", cmd("eval", config, *ev))
        result = out_dir / name / "eval" / "eval.json"
        if not _evaluated(result.parent, model, files[questions]):
            result.unlink(missing_ok=True)
            timed(f"eval {name}", jobs.evaluate, load_config(config, ev))
        return json.loads(result.read_text())

    evals = {"base": evaluate("base", cfg0.model.path, "base")}

    sft_over = [*paths, *overrides, f"data.train={sft_rows}", "data.eval=null", "log.name=sft",
                f"train.steps={d.sft_steps}", f"train.lr={d.sft_lr}", f"rollout.batch_size={d.sft_batch_size}",
                "train.warmup_steps=5", "train.schedule=cosine", f"train.save_every={max(1, d.sft_steps // 3)}", "train.resume=auto",
                "model.freeze_layers=0", f"train.mixed_precision={d.sft_precision}"]  # the warm start trains every weight
    sft_model = out_dir / "sft" / "checkpoints" / f"step_{d.sft_steps}" / "model"
    stage("5. sft", cmd("sft", config, *sft_over))
    if not (sft_model / "config.json").is_file():
        timed("sft", jobs.sft, load_config(config, sft_over))
    evals["sft"] = evaluate("sft", str(sft_model), "heldout")

    # what GRPO (and the curriculum) draws from: demo.sft_share, demo.grpo_share, demo.grpo_questions
    grpo_train = files["train"] if d.grpo_share == "all" else rl_train
    if d.grpo_questions in ("open", "retrievable"):
        drawn, grpo_train = grpo_train, data_dir / "train_open.jsonl"
        stage("6a. open", f"the open questions of {drawn} (answer_options) -> {grpo_train}")
        opened = [r for r in _read_jsonl(drawn) if answer_options(r)[0] == "open"]
        _write_jsonl(grpo_train, opened)
        counts["train_open"] = len(opened)
        console.print(f"GRPO trains on the {len(opened)} open training questions (demo.grpo_questions=open)" if d.grpo_questions == "open"
                      else f"{len(opened)} open training questions")
    if d.grpo_questions == "retrievable":
        grpo_train, topk = data_dir / "train_retrievable.jsonl", cfg0.tools.topk
        stage("6a. retrievable", f"the open questions whose needed paragraphs their own top {topk} search results hold -> {grpo_train}")
        found = retrievable_rows(opened, index_dir, topk)
        if not found:
            raise ValueError(f"demo.grpo_questions=retrievable: no open training question has every needed paragraph in the "
                             f"top {topk} results of its own search; raise tools.topk or use demo.grpo_questions=open")
        _write_jsonl(grpo_train, found)
        counts["train_retrievable"] = len(found)
        console.print(f"GRPO trains on the {len(found)} of them whose question, searched as it is, brings back every needed paragraph "
                      "(demo.grpo_questions=retrievable)")

    curriculum_over, curriculum = [], None  # every GRPO seed trains on the questions of one measured curriculum
    if d.curriculum_questions > 0:
        cache = out_dir / "curriculum.json"
        curriculum_over = [f"data.max_train={d.curriculum_questions}", f"data.curriculum={cache}", "data.curriculum_seed=0"]
        cur_over = [*paths, *overrides, f"model.path={sft_model}", f"data.train={grpo_train}", *curriculum_over,
                    "data.eval=null", "log.name=curriculum"]
        stage("6b. curriculum", cmd("curriculum", config, *cur_over))
        if cache.is_file():  # measured before: its key is checked (another model or setting measures again)
            jobs.curriculum(load_config(config, cur_over))
        else:
            timed("curriculum", jobs.curriculum, load_config(config, cur_over))
        curriculum = curriculum_counts(cache)
        console.print(f"curriculum: {curriculum['kept']} of {curriculum['measured']} training questions solved in some but not all "
                      f"of {curriculum['k']} samples")

    ptx_over = []  # PPO-ptx: SFT's episodes of the questions GRPO does not draw hold their behaviour (train/ptx.py)
    if d.ptx_coef > 0:
        ptx_file = data_dir / "ptx.jsonl"
        stage("6c. ptx", f"the teacher's kept episodes of the training questions not in {grpo_train} -> {ptx_file}" if grpo_train != files["train"]
              else f"the teacher's kept episodes (GRPO draws every training question) -> {ptx_file}")
        held = _read_jsonl(sft_rows)
        if grpo_train != files["train"]:  # demo.grpo_questions=open or demo.sft_share < 1: the others' episodes
            drawn = {str(r["_id"]) for r in _read_jsonl(grpo_train)}
            held = [r for r in held if str(r["id"]) not in drawn]
        kind = {str(r["_id"]): answer_options(r)[0] for r in _read_jsonl(files["train"])}
        held = [r for r in held if kind[str(r["id"])] in d.ptx_kinds]  # demo.ptx_kinds
        if not held:
            raise ValueError(f"demo.ptx_coef={d.ptx_coef:g}: no kept teacher episode of a {'/'.join(d.ptx_kinds)} question outside "
                             f"{grpo_train} to hold; widen demo.ptx_kinds or set demo.ptx_coef=0")
        _write_jsonl(ptx_file, held)
        counts["ptx"] = len(held)
        ptx_over = [f"data.ptx={ptx_file}", f"algo.ptx_coef={d.ptx_coef}"]
        console.print(f"PPO-ptx: {len(held)} teacher episodes at weight {d.ptx_coef:g} in every GRPO update (demo.ptx_coef)")

    runs = {}  # GRPO run name -> its seed: one run per demo.grpo_seeds, all from the SFT checkpoint
    seeds = list(enumerate(d.grpo_seeds))
    for group in (seeds[k:k + d.grpo_parallel] for k in range(0, len(seeds), d.grpo_parallel)):
        members = []  # (name, config overrides, model folder of the last step, its config) of each seed of this group
        for i, seed in group:
            name = "grpo" if i == 0 else f"grpo_s{seed}"
            curve = i == 0 and d.check_every > 0  # the first seed's learning curve on the check questions
            rl_over = [*paths, *overrides, *grpo_overrides(cfg0), f"model.path={sft_model}", f"train.seed={seed}", f"log.name={name}", "train.resume=auto",
                       f"data.train={grpo_train}", *curriculum_over, *ptx_over,
                       *([f"data.eval={files['curve']}", f"eval.every={d.check_every}"] if curve else ["data.eval=null"])]
            rl_cfg = load_config(config, rl_over)
            members.append((name, rl_over, out_dir / name / "checkpoints" / f"step_{rl_cfg.train.steps}" / "model", rl_cfg))
            stage(f"7. grpo (train.seed={seed})", cmd("train", config, *rl_over))
            runs[name] = seed
        todo = [m for m in members if not (m[2] / "config.json").is_file()]
        if d.grpo_parallel == 1:  # in this process, with every core; then its eval
            for name, _, _, rl_cfg in todo:
                timed(name, jobs.train, rl_cfg)
            for name, _, model, _ in members:
                evals[name] = evaluate(name, str(model), "heldout")
            continue
        if todo:  # demo.grpo_parallel: the group's seeds at once, each a `seekrl train` with its share of the cores,
            # then its eval on the held-out questions on the same cores, while the others may still train
            check_seed_memory(cfg0, len(todo))  # again, now: what the stages before hold is freed or still held
            _at_once(console, timings, timings_path, " + ".join(m[0] for m in todo) + ", each then its eval", [
                Child(name, [sys.executable, "-m", "seekrl.cli", "train", config, *over], out_dir / f"{name}.log",
                      done=steps_done(out_dir / name), total=c.train.steps, then=[heldout_eval(name, str(model))])
                for name, over, model, c in todo])
        stale = [m[0] for m in members if not _evaluated(out_dir / m[0] / "eval", str(m[2]), files["heldout"])]
        if stale:  # the evals still to run (of seeds trained before): at once too
            for name in stale:
                (out_dir / name / "eval" / "eval.json").unlink(missing_ok=True)
            _at_once(console, timings, timings_path, "eval " + " + ".join(stale), [
                Child(f"eval {name}", heldout_eval(name, str(model)), out_dir / f"{name}.eval.log")
                for name, _, model, _ in members if name in stale])
        for name, *_ in members:
            evals[name] = json.loads((out_dir / name / "eval" / "eval.json").read_text())
    first = next(iter(runs))
    if d.check_every > 0:  # the curve's last point is the check of the final policy
        evals["check"] = check_from_curve(out_dir / first)
    else:
        evals["check"] = evaluate("check", str(out_dir / first / "checkpoints" / f"step_{rl_cfg.train.steps}" / "model"), "check")

    rows = [("base", "base model", "base"), ("sft", "after SFT", "heldout")]
    rows += [(name, f"after GRPO (train.seed={seed})", "heldout") for name, seed in runs.items()]
    rows += [("check", "after GRPO, check questions" + (f" (train.seed={runs[first]})" if len(runs) > 1 else ""), "check")]
    table = []
    for name, label, questions in rows:
        m = evals[name]
        table.append({"model": label, "questions": questions, "n": int(m.get("eval/count", 0)),
                      **{col: m.get(key) for col, key in COLUMNS}})
    episodes = {name: _read_jsonl(out_dir / name / "eval" / "trajectories.jsonl") for name in ("base", "sft", *runs)}
    answers = {name: eval_answers(eps) for name, eps in episodes.items()}
    scores = {name: em for name, (em, _) in answers.items()}
    ids = sorted(scores["sft"])
    heldout = _read_jsonl(files["heldout"])
    kinds = question_types(heldout)
    compared = compare_scores(scores["sft"], {name: scores[name] for name in runs})  # each seed's gain, and their mean's
    gains = {name: {"seed": seed, **compared["gains"][name]} for name, seed in runs.items()}
    # the gain where an answer has to be read: the open questions only (answer_options)
    open_kind = {str(r["_id"]): answer_options(r)[0] == "open" for r in heldout}
    open_ids = [i for i in ids if open_kind.get(i)]
    open_gains = {name: {"seed": seed, **paired_bootstrap([scores["sft"][i] for i in open_ids], [scores[name][i] for i in open_ids])}
                  for name, seed in runs.items()} if open_ids else {}
    res = {"recipe": "hotpotqa_smollm2", "config": config, "overrides": overrides, "table": table, "evals": evals,
           "teacher": teacher, "curriculum": curriculum, "split": counts, "grpo_share": d.grpo_share if d.sft_share < 1 else "all", "stage_seconds": timings,
           "train_seconds": {name: _train_seconds(out_dir / name) for name in ("sft", *runs)},
           "grpo_gain": gains[first], "grpo_gains": gains,
           "grpo_gain_mean": sum(g["mean"] for g in gains.values()) / len(gains),
           "grpo_gain_mean_ci": compared.get("mean"),  # the seeds' task-by-task mean against SFT, paired bootstrap
           "em_by_type": {name: em_by_type(scores[name], kinds) for name in ("sft", *runs)},
           "two_way": {name: two_way_guesses(heldout, answers[name][1], scores[name]) for name in ("sft", *runs)},
           "search_support": {name: search_support(heldout, episodes[name]) for name in ("sft", *runs)},
           "open_gains": open_gains,
           "ceiling_command": shlex.join(["seekrl", "eval", str(out_dir / "sft" / "config.yaml"), f"model.path={sft_model}",
                                          f"data.eval={files['check_open']}", "log.name=sft_passk", "eval.n=8",
                                          f"eval.temperature={cfg0.rollout.temperature}"]),
           "curve": learning_curve(out_dir / first) if d.check_every > 0 else [],
           "sft_gain": paired_bootstrap([scores["base"][i] for i in sorted(scores["base"])],
                                        [scores["sft"][i] for i in sorted(scores["base"])])}
    md = results_markdown(res)
    (out_dir / "results.json").write_text(json.dumps(res, indent=2))
    (out_dir / "results.md").write_text(md)
    stage("9. report", cmd("report", out_dir / "grpo", "--out", out_dir / "report.html"))
    sections = [("Held-out questions before and after each stage (greedy)", markdown_table_to_html(markdown_table(table))),
                ("EM by question type (held-out)", markdown_table_to_html(markdown_table(type_rows(res)))),
                ("Questions with two possible answers (held-out)", markdown_table_to_html(markdown_table(two_way_rows(res)))),
                ("What the searches retrieved (held-out)", markdown_table_to_html(markdown_table(support_rows(res))))]
    if res["curve"]:
        sections.append(("Learning curve: check questions (greedy) and training reward, against steps and minutes",
                         markdown_table_to_html(markdown_table(res["curve"]))))
    report = write_report(out_dir / first, out_dir / "report.html",
                          title="seekrl recipe: SmolLM2-135M learns to search HotpotQA", sections=sections)
    print(md, end="")
    print(f"wrote {out_dir / 'results.json'}, {out_dir / 'results.md'} and {report}", file=sys.stderr)
    return res
