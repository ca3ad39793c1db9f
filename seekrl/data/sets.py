"""The task sets of a run: its training tasks (and their order), its evaluation tasks.

    sets = load_task_sets(cfg.data, seed=0, tasks_per_step=8, tiny=False, tools=True)
    sets.train, sets.eval, sets.iterator            # TaskIterator: endless, seeded, resumable batches

Everything here fails fast on bad input (missing data file, malformed row), before any model
loads. `data.train` / `data.eval` may join several sources with commas, and each may end in a
slice of its rows, `hotpotqa[:200]` / `hotpotqa[200:]`, to train and evaluate on disjoint parts
of one file (taken before `data.max_train` / `data.max_eval`, which apply to each source).

`data.train` as a list of `{name, weight}` is a mixture: each source loads as above (a failure
names its entry, `data.train[1]: nq.jsonl:3: ...`), and a `MixtureIterator` (data/mixture.py)
draws each step's tasks from them by weight. `TaskSets.train` then holds every source's tasks;
`load_split` of a mixture (seekrl generate) is all of them, weights aside.

`data.skip_flat` > 0 gives the iterator a `FlatHistory` (data/skip.py): the rollout tells it
which groups had reward spread, and later epochs leave out the tasks that recently had none.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from rich.console import Console

from seekrl.data.config import DATA_SLICE, DataConfig, DataSource
from seekrl.data.iterator import TaskIterator
from seekrl.data.loaders import load_tasks
from seekrl.data.mixture import MixtureIterator
from seekrl.data.skip import FlatHistory
from seekrl.data.templates import get_template
from seekrl.data.tiny import make_tiny_tasks, tiny_corpus
from seekrl.errors import DataError
from seekrl.types import Task

__all__ = ["TaskSets", "load_split", "load_task_sets", "tiny_texts_of"]


def load_split(spec: str | list[DataSource], d: DataConfig, split_default: str, limit: int | None, seed: int = 0) -> list[Task]:
    """One source, or several joined by commas ("nq_open,hotpotqa"), or a mixture's sources one
    after the other: `limit` applies to each (module docstring); `seed` seeds the tiny tasks."""
    if isinstance(spec, list):
        return [t for ts in _mixture_sources(spec, d, split_default, limit, seed).values() for t in ts]
    if "," in spec:
        return [t for part in spec.split(",") if part.strip() for t in load_split(part.strip(), d, split_default, limit, seed)]
    m = DATA_SLICE.match(spec)
    if m and not Path(spec).exists():
        start, stop = (int(m[k]) if m[k] else None for k in ("start", "stop"))
        source = load_split(m["spec"], d, split_default, None, seed)
        tasks = source[start:stop]
        if not tasks:  # the config refuses the slices that are empty whatever the source holds
            raise DataError(f"'{spec}' selects no rows: {m['spec']} has {len(source)} rows; "
                            f"take rows within them (e.g. {m['spec']}[:{max(1, len(source) // 2)}])")
        return tasks[:limit] if limit is not None else tasks
    if spec.startswith("tiny:"):
        kind, _, split = spec[5:].partition(":")
        return make_tiny_tasks(kind, n=limit or 512, seed=seed, split=split or split_default)
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
    iterator: TaskIterator | MixtureIterator
    tiny_texts: list[str] = field(default_factory=list)  # the texts a tiny model's tokenizer is trained on
    dropped: int = 0

    def drop_long_prompts(self, encode: Callable[[Task], list[int]], max_tokens: int) -> None:
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
            if isinstance(it, MixtureIterator):
                kept = {id(t) for t in keep}
                self.iterator = it.filtered(lambda t: id(t) in kept)
            else:
                self.iterator = TaskIterator(keep, it.batch_size, seed=it.seed, shuffle=it.shuffle, history=it.history)


def load_task_sets(d: DataConfig, *, seed: int, tasks_per_step: int, tiny: bool = False, tools: bool = False,
                   keep: Callable[[Task], bool] | None = None) -> TaskSets:
    """`data.train` (ordered by a TaskIterator of `tasks_per_step` tasks, seeded by `seed`) and
    `data.eval`; `tiny`: also the texts a tiny model's tokenizer is trained on (with every
    printable character when `tools`: tool output may hold any); `keep`: the training tasks to
    train on (a curriculum, data/curriculum.py; the tiny texts are those of all of them)."""
    history = FlatHistory(d.skip_flat, d.skip_flat_prob, d.skip_flat_keep) if d.skip_flat else None  # the online curriculum (data/skip.py)
    if isinstance(d.train, list):  # a mixture: each step's tasks drawn from the sources by weight
        sources = _mixture_sources(d.train, d, "train", d.max_train, seed)
        train = [t for ts in sources.values() for t in ts]
        evals = load_split(d.eval, d, "test", d.max_eval, seed) if d.eval else []
        texts = tiny_texts_of(train + evals, tools) if tiny else []
        weights = {s.name.strip(): s.weight for s in d.train}
        if keep is not None:
            sources = {k: _kept(ts, keep, f"data.train source '{k}'", int(weights[k] > 0)) for k, ts in sources.items()}
            train = [t for ts in sources.values() for t in ts]
        iterator: TaskIterator | MixtureIterator = MixtureIterator(sources, weights, tasks_per_step, seed=seed, shuffle=d.shuffle,
                                                                   history=history)
    else:
        train = load_split(d.train, d, "train", d.max_train, seed)
        evals = load_split(d.eval, d, "test", d.max_eval, seed) if d.eval else []
        texts = tiny_texts_of(train + evals, tools) if tiny else []
        if keep is not None:
            train = _kept(train, keep, "data.train", tasks_per_step)
        iterator = TaskIterator(train, tasks_per_step, seed=seed, shuffle=d.shuffle, history=history)
    return TaskSets(train, evals, iterator, texts)


def _kept(tasks: list[Task], keep: Callable[[Task], bool], what: str, needed: int) -> list[Task]:
    """The curriculum's tasks of one source, counted on stderr; fewer than `needed` left: a DataError."""
    kept = [t for t in tasks if keep(t)]
    Console(stderr=True).print(f"data.curriculum: {what}: kept {len(kept)} of {len(tasks)} tasks (0 < pass rate < 1)")
    if len(kept) < needed:
        raise DataError(f"data.curriculum: {what} keeps {len(kept)} tasks the starting model solves sometimes but not always, "
                        f"fewer than the {needed} needed; raise data.curriculum_k or rollout.temperature and measure again, "
                        "lower rollout.batch_size, or drop data.curriculum")
    return kept


def _mixture_sources(sources: list[DataSource], d: DataConfig, split_default: str, limit: int | None,
                     seed: int) -> dict[str, list[Task]]:
    """Each source of a mixture loaded (`load_split`), by name; a DataError names its entry."""
    out: dict[str, list[Task]] = {}
    for i, s in enumerate(sources):
        try:
            out[s.name.strip()] = load_split(s.name.strip(), d, split_default, limit, seed)
        except DataError as e:
            raise DataError(f"data.train[{i}]: {e}") from None
    return out


def tiny_texts_of(tasks: list[Task], tools: bool = False) -> list[str]:
    """The texts a tiny model's tokenizer is trained on: the tasks' prompts and answers, and with
    `tools` every printable character (tool output, passages and markers, may hold any)."""
    texts = tiny_corpus(tasks)
    if texts and tools:
        texts.append(string.printable)
    return texts
