"""The demo and recipe stage lines print each command literally: an override with brackets
(reward.functions=[qa_em]) is part of the command, not rich markup to be swallowed."""

from __future__ import annotations

import io
import time

from rich.console import Console

from seekrl.demo import stage_printer


def test_stage_prints_bracketed_overrides_literally():
    buf = io.StringIO()
    console = Console(file=buf, width=200, color_system=None)
    stage = stage_printer(console, time.perf_counter())
    stage("7. grpo [seed 0]", "seekrl train x.yaml 'reward.functions=[qa_em]' data.eval=[b]")
    out = buf.getvalue()
    assert "'reward.functions=[qa_em]'" in out
    assert "data.eval=[b]" in out
    assert "7. grpo [seed 0]" in out
