"""rollout.agent's configuration: one-line errors, before any model loads."""

from __future__ import annotations

import pytest

import seekrl.build as build
from seekrl.config import load_config
from seekrl.errors import ConfigError
from seekrl.workflows.agent import load_agent

BASE = ["model.path=tiny", "model.max_context=64", "data.train=tiny:copy", "rollout.group_size=4", "rollout.batch_size=16",
        "rollout.max_new_tokens=4", "rollout.max_prompt_tokens=32", "reward.functions=[qa_f1]"]


def test_agent_config_rules():
    cfg = load_config(None, [*BASE, "rollout.agent=examples.openai_agent.agent:run", "rollout.agent_kwargs={topk: 2}"])
    assert cfg.rollout.agent == "examples.openai_agent.agent:run" and cfg.rollout.agent_kwargs == {"topk": 2}
    with pytest.raises(ConfigError, match="drop tools.format"):
        load_config(None, [*BASE, "rollout.agent=m:f", "tools.format=search_r1", "tools.retriever=http://127.0.0.1:9/retrieve"])
    with pytest.raises(ConfigError, match="algo.name=ppo"):
        load_config(None, [*BASE, "rollout.agent=m:f", "algo.name=ppo"])
    with pytest.raises(ConfigError, match="rollout.agent_max_calls"):
        load_config(None, [*BASE, "rollout.agent_max_calls=0"])


def test_load_agent_names_what_is_wrong(tmp_path):
    with pytest.raises(ConfigError, match="write it as package.module:function"):
        load_agent("no_colon")
    with pytest.raises(ConfigError, match="cannot import no_such_module_xyz"):
        load_agent("no_such_module_xyz:run")
    with pytest.raises(ConfigError, match="has no function 'nope'"):
        load_agent("json:nope")
    with pytest.raises(ConfigError, match="no file"):
        load_agent(str(tmp_path / "missing.py") + ":run")
    (tmp_path / "my_agent.py").write_text("def run(task, base_url, api_key):\n    return 'ok'\n")
    assert load_agent(str(tmp_path / "my_agent.py") + ":run")({}, "", "") == "ok"
    assert load_agent("examples.openai_agent.agent:run").__name__ == "run"  # from the working directory, as python -m finds it


def test_a_bad_agent_fails_before_the_model_loads(monkeypatch):
    def no_model(*a, **k):
        raise AssertionError("the model loaded before the agent was checked")

    monkeypatch.setattr(build, "_policy", no_model)
    with pytest.raises(ConfigError, match="cannot import"):
        build.build_rl(load_config(None, [*BASE, "rollout.agent=no_such_module_xyz:run", "log.dir=/tmp/seekrl-never"]))
