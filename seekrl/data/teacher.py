"""A scripted, imperfect-on-purpose teacher that plays the search agent loop (SFT data).

`ScriptedTeacher` is a chat engine (`seekrl.generate.ChatEngine`): `seekrl generate` drives it
through the same loop as any OpenAI-compatible endpoint, with the real search tool, and writes
its episodes as SFT rows. It knows each task's gold paragraph titles (`meta["gold_titles"]` for
the synthetic world; HotpotQA's supporting-fact titles) and answer, and it reads the real
observations: it searches for the next gold title it has not yet seen in a retrieved passage,
and answers once every gold paragraph has come back. Imperfect on purpose, so that RL has
something to improve (probabilities are per episode or per turn; each turn draws from its own
RNG, seeded by the teacher's seed, the request's `seed` (seekrl generate sends one per episode
and turn), the question and the turn number, so an episode does not depend on which other
episodes ran before it or alongside it):

- `skip_search`: overconfident: for the relations it believes it knows (a seeded half of them,
  or of those of the question kinds `overconfident_kinds` when given: `overconfident_relations`),
  it answers at once, without searching, with a guess (a comparison: one of the two names at
  random; otherwise the answer of another task with the same last relation). Systematic, as a real model's blind spots are: when the probability is
  above 1/2 a student copies the habit even at greedy decoding;
- `stop_early`: on questions that need several paragraphs, answers with a guess after the
  first one came back;
- `weak_query`: searches with a weak query (the question's other words, without the entity
  name), which usually misses the paragraph; it then searches again with the name...
- `give_up`: ...unless it gives up after a miss and guesses.

With `quote`, after each observation that brought back a paragraph it needs, the teacher first
writes the sentence of that paragraph that states the fact it needed, as its reasoning
(`<think> Vorlen Masu was born in the city of Kaego. </think>`), then acts. On a real dataset's
task (no hops; HotpotQA) the cited sentences of a gold paragraph are those that name the answer
or the other gold paragraph's title, or that its supporting facts mark. Citing the evidence
before using it is what Search-R1's template asks for (reason in `<think>` after new
information), and it turns reading into copying: the student writes the sentence's opening from
the question's words and then continues the passage it has just seen, which a small model
learns far more easily than picking the answer out of the passage in one step.

With `first_query="question"` (the HotpotQA recipe) the teacher searches as a reader of the
question would: its first query is the question itself; then, for each gold paragraph the
results have not brought back, the paragraph's title (on a bridge question, the bridge entity
that the first paragraph named); then it answers. Nothing in the observations is pasted: every
passage is what the real index returned for that query.

A teacher that ran out of turns guesses. Search turns are `<search> query </search>` (search_r1)
or `<call_tool name="search"> query </call_tool>` (dr_tulu); the answer is `<answer> a </answer>`.
The spaces inside the tags are Search-R1's style, and they let a word-level tokenizer give a name
the same token in the question, the query, the passage and the answer (so it can be copied).
"""

from __future__ import annotations

import random
import re

from seekrl.data.corpus import hotpotqa_gold_titles, twowiki_gold_titles
from seekrl.types import Task

__all__ = ["ScriptedTeacher", "gold_titles", "names_title"]


def names_title(text: str, title: str) -> bool:
    """Whether search results (`Doc i(Title: t) ...` lines, the title quoted or not) hold the
    paragraph titled `title`."""
    return f"(Title: {title})" in text or f'(Title: "{title}")' in text


def gold_titles(task: Task) -> list[str]:
    """The titles of the paragraphs a task needs, in hop order (empty when unknown): the synthetic
    tasks' `gold_titles`, HotpotQA's (`hotpotqa_gold_titles`) or 2WikiMultihopQA's
    (`twowiki_gold_titles`), read from the row kept in `task.meta`."""
    meta = task.meta or {}
    if meta.get("gold_titles"):
        return list(meta["gold_titles"])
    return hotpotqa_gold_titles(meta) or twowiki_gold_titles(meta)


class ScriptedTeacher:
    """See the module docstring. `tasks` are the tasks it may be asked about (their prompts)."""

    def __init__(
        self,
        tasks: list[Task],
        fmt: str = "search_r1",
        *,
        seed: int = 0,
        skip_search: float = 0.2,
        stop_early: float = 0.0,
        weak_query: float = 0.2,
        give_up: float = 0.5,
        max_turns: int = 4,
        quote: bool = False,
        overconfident_kinds=None,
        first_query: str = "title",
    ):
        if fmt not in ("search_r1", "dr_tulu"):
            raise ValueError(f"the scripted teacher writes search_r1 or dr_tulu turns, not '{fmt}'")
        for name, p in (("skip_search", skip_search), ("stop_early", stop_early), ("weak_query", weak_query), ("give_up", give_up)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"teacher {name} must be a probability in [0, 1], got {p}")
        if first_query not in ("title", "question"):
            raise ValueError(f"first_query must be title or question, not '{first_query}'")
        self.first_query = first_query
        self.fmt, self.skip_search, self.weak_query, self.give_up = fmt, skip_search, weak_query, give_up
        self.stop_early, self.quote = stop_early, quote
        self.max_turns = max_turns
        self.seed = seed
        self.by_prompt = {self._key(t.prompt): t for t in tasks}
        self.by_relation: dict[str, list[str]] = {}
        for t in tasks:
            self.by_relation.setdefault(self._relation(t), []).append(self._first(t.answer))
        relations = sorted(r for r in self.by_relation if overconfident_kinds is None or r.split(":")[0] in overconfident_kinds)
        if overconfident_kinds is not None and not relations:
            kinds = sorted({r.split(":")[0] for r in self.by_relation})
            raise ValueError(f"overconfident_kinds {list(overconfident_kinds)} match no task; the tasks' kinds are {kinds} (or none: all)")
        self.overconfident_relations = set(random.Random(f"teacher-relations-{seed}").sample(relations, len(relations) // 2))

    # ---- helpers ------------------------------------------------------------------------------
    @staticmethod
    def _key(messages: list[dict]) -> str:
        return next((m["content"] for m in messages if m["role"] == "user"), "")

    @staticmethod
    def _first(answer) -> str:
        return str(answer[0] if isinstance(answer, (list, tuple)) and answer else answer)

    @staticmethod
    def _relation(task: Task) -> str:
        hops = (task.meta or {}).get("hops") or []
        return f"{(task.meta or {}).get('kind', '')}:{hops[-1]['relation'] if hops else ''}"

    def _search(self, query: str) -> str:
        if self.fmt == "dr_tulu":
            return f'<call_tool name="search"> {query} </call_tool>'
        return f"<search> {query} </search>"

    def _guess(self, task: Task, rng: random.Random) -> str:
        if (task.meta or {}).get("kind") == "comparison":
            return rng.choice(gold_titles(task) or [self._first(task.answer)])
        pool = [a for a in self.by_relation.get(self._relation(task), []) if a != self._first(task.answer)]
        return rng.choice(pool) if pool else "unknown"

    @staticmethod
    def _answer(text: str) -> str:
        return f"<answer> {text} </answer>"

    @staticmethod
    def _evidence(task: Task, observation: str, cited: str = "") -> str:
        """The sentences of `observation` that state a fact of `task`'s hops (about a paragraph in
        it), in hop order, less those already in `cited`; empty when there are none. A task
        without hops (a real dataset's) cites `_passage_evidence`."""
        if not (task.meta or {}).get("hops"):
            return ScriptedTeacher._passage_evidence(task, observation, cited)
        found = []
        for hop in (task.meta or {}).get("hops") or []:
            text = ScriptedTeacher._paragraph(observation, hop["entity"])
            if text is None:
                continue
            value = str(hop["value"])
            values = {value, f"{int(value):,}"} if value.isdigit() else {value}
            for sentence in re.split(r"(?<=\.)\s+", text):
                if any(re.search(rf"(?<![\w,]){re.escape(v)}(?!\w|,\d)", sentence) for v in values):
                    if sentence.strip() not in cited:
                        found.append(sentence.strip())
                    break
        return " ".join(dict.fromkeys(found))

    @staticmethod
    def _paragraph(observation: str, title: str) -> str | None:
        """The text the observation shows of the paragraph titled `title`, or None."""
        m = re.search(r'\(Title: "?' + re.escape(title) + r'"?\)\s*(.*?)(?=(?:Doc \d+\(Title:|</information>|$))',
                      observation, re.DOTALL)
        return m.group(1).strip() if m else None

    @staticmethod
    def _passage_evidence(task: Task, observation: str, cited: str = "") -> str:
        """For a task with gold paragraphs and no hops (HotpotQA): in each gold paragraph the
        observation shows, in the task's title order, the sentences that name the answer or
        another gold paragraph's title (the bridge), or that the task's `supporting_facts` mark
        (their index within the text shown), less those already in `cited`."""
        meta = task.meta or {}
        titles = gold_titles(task)
        answers = [str(a) for a in (task.answer if isinstance(task.answer, (list, tuple)) else [task.answer])
                   if str(a).strip() and str(a).strip().lower() not in ("yes", "no")]
        marked: dict[str, set[int]] = {}
        for fact in meta.get("supporting_facts") or []:
            if fact and len(fact) > 1 and isinstance(fact[1], int):
                marked.setdefault(str(fact[0]), set()).add(fact[1])
        found = []
        for title in titles:
            text = ScriptedTeacher._paragraph(observation, title)
            if text is None:
                continue
            names = answers + [t for t in titles if t != title]
            for i, sentence in enumerate(re.split(r"(?<=[.!?])\s+", text)):
                sentence = sentence.strip()
                named = any(re.search(rf"(?<!\w){re.escape(v)}(?!\w)", sentence, re.IGNORECASE) for v in names)
                if sentence and (named or i in marked.get(title, ())) and sentence not in cited:
                    found.append(sentence)
        return " ".join(dict.fromkeys(found))

    def _think(self, task: Task, messages: list[dict], n_prompt: int) -> str:
        """`<think> evidence </think>\n` for the newest observation, when quoting and it has some."""
        if not self.quote or len(messages) <= n_prompt or messages[-1]["role"] == "assistant":
            return ""
        cited = " ".join(m["content"] for m in messages[n_prompt:] if m["role"] == "assistant")
        evidence = self._evidence(task, messages[-1]["content"], cited)
        return f"<think> {evidence} </think>\n" if evidence else ""

    @staticmethod
    def _question_query(prompt_text: str) -> str:
        """The question of a templated user message (its `Question:` line when there is one), on one line."""
        m = re.search(r"Question:\s*(.+)", prompt_text)
        return " ".join((m.group(1) if m else prompt_text).split())

    @staticmethod
    def _weak(question: str, title: str) -> str:
        words = [w for w in re.findall(r"\w+", question) if w.lower() not in title.lower()]
        return " ".join(words[-4:]) or "information"

    # ---- the ChatEngine interface ------------------------------------------------------------
    async def chat(self, messages: list[dict], *, stop=(), max_tokens: int = 256, temperature: float = 1.0,
                   seed: int | None = None) -> tuple[str, str]:
        """The teacher's next turn for this transcript: (text, "stop")."""
        key = self._key(messages)
        task = self.by_prompt.get(key)
        if task is None:
            raise ValueError("the scripted teacher was asked about a task it was not given")
        rng = random.Random(f"teacher-{self.seed}|{seed}|{key}|{len(messages)}")
        action = self._act(task, messages, stop, rng)
        return self._think(task, messages, len(task.prompt)) + action, "stop"

    def _act(self, task: Task, messages: list[dict], stop, rng: random.Random) -> str:
        n_prompt = len(task.prompt)
        turns = [re.sub(r"<think>.*?</think>\s*", "", m["content"], flags=re.DOTALL)
                 for m in messages[n_prompt:] if m["role"] == "assistant"]
        seen = "\n".join(m["content"] for m in messages[n_prompt:] if m["role"] != "assistant")
        question = task.prompt[-1]["content"]
        titles = gold_titles(task)
        answer = self._first(task.answer)
        can_search = "</answer>" not in stop or len(stop) > 1
        can_search = can_search and len(turns) < self.max_turns
        missing = [t for t in titles if not names_title(seen, t)]
        if not turns and self._relation(task) in self.overconfident_relations and rng.random() < self.skip_search:
            return self._answer(self._guess(task, rng))
        if missing and len(missing) < len(titles) and rng.random() < self.stop_early:
            return self._answer(self._guess(task, rng))
        if not missing or not titles:
            return self._answer(answer)
        if not can_search:
            return self._answer(self._guess(task, rng))
        if self.first_query == "question" and not turns:
            return self._search(self._question_query(question))
        target = missing[0]
        attempts = len(turns) - titles.index(target) - (self.first_query == "question")  # searches spent on it (about)
        if attempts > 0 and rng.random() < self.give_up:
            return self._answer(self._guess(task, rng))
        if attempts == 0 and rng.random() < self.weak_query:
            return self._search(self._weak(question, target))
        own = turns[1:] if self.first_query == "question" else turns  # the question query named no title on purpose
        if target in " ".join(own):  # the plain name missed: add the question's words
            return self._search(f"{target} {self._weak(question, target)}")
        return self._search(target)
