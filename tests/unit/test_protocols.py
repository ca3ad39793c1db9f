"""Every component implements the protocol the code around it relies on, member by member.

`isinstance` with a runtime-checkable Protocol only asks whether the members exist. Here each
protocol method must also exist on the implementation with the same kind (coroutine or not) and
accept every parameter the protocol names, by the same name and kind; each protocol attribute
must be set on a real instance. The protocols: InferenceEngine (engines/base.py), Workflow and
RolloutSource (rollout/base.py), RewardFn and Scorer (rewards/base.py), Tool (tools/base.py),
Teacher (train/teacher.py).
"""

from __future__ import annotations

import inspect
import typing

import torch

from seekrl.engines.base import InferenceEngine
from seekrl.rewards.base import RewardFn, Scorer
from seekrl.rollout.base import RolloutSource, Workflow
from seekrl.tools.base import Tool


def members(protocol: type) -> tuple[dict[str, object], set[str]]:
    """(methods by name, attribute names) a Protocol declares."""
    methods = {n: v for n, v in vars(protocol).items() if callable(v) and not n.startswith("_") or n == "__call__"}
    attributes = set(typing.get_type_hints(protocol)) - set(methods)
    return methods, attributes


def conforms(obj, protocol: type) -> list[str]:
    """What `obj` lacks of `protocol` (empty: it implements it)."""
    methods, attributes = members(protocol)
    problems = [f"attribute {a} missing" for a in sorted(attributes) if not hasattr(obj, a)]
    for name, spec in methods.items():
        impl = getattr(obj, name, None)
        if impl is None:
            problems.append(f"method {name} missing")
            continue
        target = impl.__call__ if name != "__call__" and not inspect.isroutine(impl) else impl
        if inspect.iscoroutinefunction(spec) != inspect.iscoroutinefunction(target):
            problems.append(f"{name}: {'async' if inspect.iscoroutinefunction(spec) else 'sync'} in the protocol")
        got = inspect.signature(target).parameters
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in got.values())
        for p in list(inspect.signature(spec).parameters.values())[1:]:  # past self
            if p.kind is p.VAR_KEYWORD:
                if not takes_kwargs:
                    problems.append(f"{name}: takes no **{p.name}")
            elif p.name not in got and not takes_kwargs:
                problems.append(f"{name}: no parameter {p.name}")
            elif p.name in got and got[p.name].kind is not p.kind and got[p.name].kind is not p.POSITIONAL_OR_KEYWORD:
                problems.append(f"{name}: {p.name} is {got[p.name].kind.description}, the protocol has {p.kind.description}")
    return problems


def test_the_checker_finds_what_is_missing():
    class Half:
        version = 0

        def generate(self, prompt_ids, params):  # sync, and no rid
            ...

    problems = conforms(Half(), InferenceEngine)
    assert "attribute exact_logprobs missing" in problems and "method update_weights missing" in problems
    assert "generate: async in the protocol" in problems and "generate: no parameter rid" in problems


def test_engines(tiny_model, tiny_tokenizer, tmp_path):
    from seekrl.engines.local import LocalEngine
    from seekrl.engines.remote import RemoteEngine
    from seekrl.rollout.interrupt import InterruptibleEngine

    local = LocalEngine(tiny_model, tiny_tokenizer)
    remote = RemoteEngine(["http://127.0.0.1:9"], weights_dir=tmp_path)  # nothing is contacted at construction
    for engine in (local, remote, InterruptibleEngine(local)):
        assert conforms(engine, InferenceEngine) == [], type(engine).__name__
        assert isinstance(engine, InferenceEngine)
    assert local.exact_logprobs and not remote.exact_logprobs and InterruptibleEngine(remote).exact_logprobs is False
    remote.close()


def test_workflows_and_scorers(tiny_tokenizer, tmp_path):
    from seekrl.data.corpus import Document
    from seekrl.retrieval.bm25 import BM25Index
    from seekrl.rewards.rubric import Rubric
    from seekrl.tools.config import ToolsConfig
    from seekrl.tools.parsers import get_format
    from seekrl.tools.setup import make_tool_executor
    from seekrl.types import SamplingParams
    from seekrl.workflows.agent import AgentWorkflow
    from seekrl.workflows.single_turn import SingleTurnWorkflow
    from seekrl.workflows.tool_agent import ToolAgentWorkflow

    BM25Index.build([Document.from_title_text("0", "Paris", "the capital of France")]).save(tmp_path / "index")
    rubric = Rubric(["qa_em", "format"])
    executor = make_tool_executor(ToolsConfig(format="search_r1", retriever=str(tmp_path / "index")))
    for wf in (SingleTurnWorkflow(tiny_tokenizer, SamplingParams(), rubric),
               ToolAgentWorkflow(tiny_tokenizer, SamplingParams(), rubric, get_format("search_r1"), executor),
               AgentWorkflow(tiny_tokenizer, SamplingParams(), rubric, lambda task, base_url, api_key: None)):
        assert conforms(wf, Workflow) == [] and isinstance(wf, Workflow), type(wf).__name__
    assert conforms(rubric, Scorer) == [] and rubric.names == ["qa_em", "format"]
    search = executor.registry.get("search")
    assert conforms(search, Tool) == [] and isinstance(search, Tool)


def test_reward_functions_and_tools():
    from seekrl.rewards.rubric import REWARD_FUNCTIONS
    from seekrl.tools.base import tool

    for name, fn in REWARD_FUNCTIONS.items():
        params = inspect.signature(fn).parameters
        assert list(params)[:2] == ["completion", "task"] and any(p.kind is p.VAR_KEYWORD for p in params.values()), name
        assert isinstance(fn, RewardFn)

    @tool(timeout_s=1)
    async def lookup(query: str) -> str:
        """Look something up.

        Args:
            query: what to look for.
        """
        return query

    assert conforms(lookup, Tool) == [] and isinstance(lookup, Tool)
    from seekrl.tools.base import ToolPolicy
    from seekrl.tools.mcp import MCPTool

    remote = MCPTool("search", "search the corpus", {"type": "object"}, ToolPolicy(), connection=None)
    assert conforms(remote, Tool) == [] and isinstance(remote, Tool)


def test_rollout_sources(tiny_model, tiny_tokenizer):
    from seekrl.data.iterator import TaskIterator
    from seekrl.engines.local import LocalEngine
    from seekrl.parallel.controller import FollowerRollout, LeaderRollout
    from seekrl.parallel.ranks import Ranks
    from seekrl.rewards.rubric import Rubric
    from seekrl.rollout.executor import AsyncRollout, SyncRollout
    from seekrl.types import SamplingParams, Task
    from seekrl.workflows.single_turn import SingleTurnWorkflow

    params = SamplingParams(max_new_tokens=2)
    wf = SingleTurnWorkflow(tiny_tokenizer, params, Rubric(["qa_em"]))
    engine = LocalEngine(tiny_model, tiny_tokenizer)
    it = TaskIterator([Task(id="a", prompt=[{"role": "user", "content": "x"}], answer="y")], 1)
    sync = SyncRollout(wf, engine, it, params, group_size=2, seed=0)
    asyn = AsyncRollout(wf, engine, it, params, group_size=2, tasks_per_step=1, max_staleness=1, max_concurrent=2, seed=0)
    for source in (sync, asyn, LeaderRollout(sync, Ranks(), torch.nn.Linear(1, 1)), FollowerRollout(Ranks())):
        assert conforms(source, RolloutSource) == [] and isinstance(source, RolloutSource), type(source).__name__


def test_teachers(tiny_model, tiny_tokenizer):
    from seekrl.engines.scoring import TeacherClient
    from seekrl.train.plan import MicroBatchPlan
    from seekrl.train.teacher import LocalTeacher, RemoteTeacher, Teacher

    client = TeacherClient("http://127.0.0.1:9")  # nothing is contacted at construction
    plan = MicroBatchPlan(1024, tiny_tokenizer.pad_token_id, torch.device("cpu"))
    for teacher in (LocalTeacher(tiny_model, plan, 1.0), RemoteTeacher(client, 1.0)):
        assert conforms(teacher, Teacher) == [] and isinstance(teacher, Teacher), type(teacher).__name__
    client.close()
