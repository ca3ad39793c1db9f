"""What a run builds before its model loads: the run folder, the rubric, the task sets.

Everything here fails fast on bad input (unknown reward name, missing data file, malformed row)
so that a mistake costs seconds, not a model load.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from seekrl.config import Config
from seekrl.data.iterator import TaskIterator
from seekrl.data.loaders import DataError, load_tasks
from seekrl.data.templates import get_template
from seekrl.data.tiny import make_tiny_tasks, tiny_corpus
from seekrl.rewards.rubric import Rubric
from seekrl.types import SamplingParams, Task
from seekrl.workflows.single_turn import SingleTurnWorkflow


def prepare_run_dir(cfg: Config, write: bool = True) -> Path:
    """Create runs/<name>/, print the resolved config and save it as config.yaml (`write=False`:
    only the path, for trainer ranks other than 0)."""
    run_dir = Path(cfg.log.dir) / (cfg.log.name or "run")
    if not write:
        return run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(cfg.to_yaml())
    if cfg.log.progress:
        Console(stderr=True).print(f"[bold]seekrl[/bold] run folder: {run_dir}\n" + cfg.to_yaml(), highlight=False)
    return run_dir


def build_rubric(cfg: Config) -> Rubric:
    r = cfg.reward
    params: dict[str, dict] = {}
    if "repetition" in r.functions:
        params["repetition"] = {"ngram_size": r.repetition_ngram, "max_penalty": r.repetition_max_penalty}
    if "cosine" in r.functions:
        params["cosine"] = {"max_len": r.cosine_max_len or cfg.rollout.max_new_tokens}
    if "overlong" in r.functions:
        buffer = r.overlong_buffer or cfg.rollout.max_new_tokens // 4
        params["overlong"] = {"max_tokens": cfg.rollout.max_new_tokens, "buffer": buffer}
    try:
        return Rubric(r.functions, r.weights, params)
    except (ValueError, ImportError) as e:
        from seekrl.config import ConfigError

        raise ConfigError(f"reward.functions: {e}") from None


_SLICE = re.compile(r"^(?P<spec>.+)\[(?P<start>-?\d*):(?P<stop>-?\d*)\]$")


def load_split(spec: str, cfg: Config, split_default: str, limit: int | None) -> list[Task]:
    """One source, or several joined by commas ("nq_open,hotpotqa"): `limit` applies to each.
    A source may end in a Python slice of its rows, `hotpotqa[:200]` / `hotpotqa[200:]`, to
    train and evaluate on disjoint parts of one file (taken before `limit`)."""
    if "," in spec:
        return [t for part in spec.split(",") if part.strip() for t in load_split(part.strip(), cfg, split_default, limit)]
    m = _SLICE.match(spec)
    if m and not Path(spec).exists():
        start, stop = (int(m[k]) if m[k] else None for k in ("start", "stop"))
        source = load_split(m["spec"], cfg, split_default, None)
        tasks = source[start:stop]
        if not tasks:  # config_checks refuses the slices that are empty whatever the source holds
            raise DataError(f"'{spec}' selects no rows: {m['spec']} has {len(source)} rows; "
                            f"take rows within them (e.g. {m['spec']}[:{max(1, len(source) // 2)}])")
        return tasks[:limit] if limit is not None else tasks
    d = cfg.data
    if spec.startswith("tiny:"):
        kind, _, split = spec[5:].partition(":")
        return make_tiny_tasks(kind, n=limit or 512, seed=cfg.train.seed, split=split or split_default)
    template = None
    if d.template or d.system_prompt or d.user_template:
        template = get_template(d.template, system=d.system_prompt, user=d.user_template)
    return load_tasks(
        spec, converter=d.converter, prompt_field=d.prompt_field, answer_field=d.answer_field,
        template=template, limit=limit,
    )


@dataclass
class TaskSets:
    train: list[Task]
    eval: list[Task]
    iterator: TaskIterator
    tiny_texts: list[str] = field(default_factory=list)
    dropped: int = 0

    def drop_long_prompts(self, encode, max_tokens: int) -> None:
        """Remove tasks whose rendered prompt exceeds `max_tokens`; count them. Rebuilds the iterator."""
        keep = [t for t in self.train if len(encode(t)) <= max_tokens]
        self.eval = [t for t in self.eval if len(encode(t)) <= max_tokens]
        self.dropped = len(self.train) - len(keep)
        if not keep:
            raise ValueError(f"every training prompt is longer than rollout.max_prompt_tokens={max_tokens}; raise it")
        if self.dropped:
            Console(stderr=True).print(f"dropped {self.dropped} training tasks longer than {max_tokens} prompt tokens")
            self.train = keep
            it = self.iterator
            self.iterator = TaskIterator(keep, it.batch_size, seed=it.seed, shuffle=it.shuffle)


def load_task_sets(cfg: Config) -> TaskSets:
    d = cfg.data
    train = load_split(d.train, cfg, "train", d.max_train)
    evals = load_split(d.eval, cfg, "test", d.max_eval) if d.eval else []
    tasks_per_step = cfg.rollout.batch_size // cfg.rollout.group_size
    iterator = TaskIterator(train, tasks_per_step, seed=cfg.train.seed, shuffle=d.shuffle)
    tiny = tiny_corpus(train + evals) if cfg.model.path == "tiny" else []
    if tiny and cfg.tools.format:  # tool output (passages, markers) may hold any printable character
        tiny.append(string.printable)
    return TaskSets(train, evals, iterator, tiny)


def make_workflow(cfg: Config, tokenizer, rubric: Rubric):
    """Single-turn RLVR, or the multi-turn tool agent when `tools.format` is set."""
    params = sampling_params(cfg, tokenizer)
    if cfg.tools.format is None:
        return SingleTurnWorkflow(tokenizer, params, rubric)
    from seekrl.tools.parsers import get_format
    from seekrl.workflows.tool_agent import ToolAgentWorkflow

    r = cfg.rollout
    return ToolAgentWorkflow(
        tokenizer, params, rubric, get_format(cfg.tools.format), make_tool_executor(cfg), max_turns=r.max_turns,
        max_obs_tokens=r.max_obs_tokens, max_total_tokens=r.max_total_tokens, mask_observations=r.mask_observations,
    )


def make_tool_executor(cfg: Config):
    """The tools of `tools.*` (the search tool over `tools.retriever`, the `tools.mcp` servers' tools)."""
    from seekrl.retrieval.retriever import HTTPRetriever, LocalRetriever, load_index
    from seekrl.tools.base import ToolPolicy, ToolRegistry
    from seekrl.tools.executor import ToolExecutor
    from seekrl.tools.search import make_search_tool

    tl = cfg.tools
    registry = ToolRegistry()
    if tl.retriever:
        if tl.retriever.startswith(("http://", "https://")):
            retriever = HTTPRetriever(tl.retriever, token=tl.token, timeout=tl.timeout_s)
        else:
            retriever = LocalRetriever(load_index(tl.retriever))
        policy = ToolPolicy(timeout_s=tl.timeout_s, retries=1, cache_size=4096, max_calls=tl.max_calls)
        registry.register(make_search_tool(retriever, tl.topk, policy=policy, passage_words=tl.passage_words))
    if tl.mcp:
        import asyncio

        from seekrl.tools.mcp import load_mcp_tools

        # no retries or cache by default: a remote tool may have side effects
        policy = ToolPolicy(timeout_s=tl.timeout_s, max_calls=tl.max_calls)
        for server in tl.mcp:
            for t in asyncio.run(load_mcp_tools(server, token=tl.mcp_token, policy=policy, timeout_s=tl.timeout_s)):
                if t.name in registry:
                    raise ValueError(f"tools.mcp: '{server}' offers a tool named '{t.name}' that another source already provides")
                registry.register(t)
    return ToolExecutor(registry)


def load_policy(cfg: Config, tiny_texts: list[str] | None = None):
    """`(model, tokenizer)` as `cfg.model` describes them (`models.load_model`), seeded by
    train.seed; `tiny_texts` train the tokenizer of `model.path=tiny`. RL, SFT and eval call this."""
    from seekrl.models import load_model

    m = cfg.model
    return load_model(
        m.path, gguf_file=m.gguf_file, dtype=m.dtype, device=m.device,
        gradient_checkpointing=m.gradient_checkpointing, lora_r=m.lora_r, lora_alpha=m.lora_alpha,
        lora_dropout=m.lora_dropout, tiny_texts=tiny_texts, tiny_hidden=m.tiny_hidden, tiny_layers=m.tiny_layers,
        tiny_vocab=m.tiny_vocab, tiny_heads=m.tiny_heads, tiny_intermediate=m.tiny_intermediate, seed=cfg.train.seed,
    )


def sampling_params(cfg: Config, tokenizer, temperature: float | None = None, seed: int | None = None) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(
        max_new_tokens=r.max_new_tokens,
        temperature=r.temperature if temperature is None else temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        stop=tuple(r.stop),
        seed=seed,
    )
