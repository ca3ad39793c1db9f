"""Workflows own the interaction with the engine: `async run(task, engine, n) -> TrajectoryGroup`.

single_turn.py (one completion per episode, RLVR) and tool_agent.py (the multi-turn tool loop)
implement the `Workflow` protocol (seekrl/rollout/base.py), which the rollout runs.
"""
