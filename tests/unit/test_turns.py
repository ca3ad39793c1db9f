"""Multi-turn training data against values worked out by hand: the stepwise layout (one row per
turn, Trajectory.steps / TokenBatch), the group baseline over episodes, the turn discount, and
per-turn rewards turned into per-turn advantages (algo/advantages.py, train/estimate.py)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from seekrl.algo.advantages import (episode_group_advantages, episode_sum, group_advantages, informative_mask, shared_history_advantages,
                                    turn_advantages, turn_discount)
from seekrl.train.batch import TokenBatch
from seekrl.train.estimate import estimate_advantages
from seekrl.types import Task, Trajectory

TASK = Task(id="t", prompt=[], answer="")
A = 0.5 / (math.sqrt(0.5) + 1e-6)  # GRPO advantage of rewards [1, 0] in one group: (1 - .5) / (std + eps), std = sqrt(.5)


def episode(reward, turns, *, stepwise, rewritten=(), turn_rewards=None, prompt=(1, 2)):
    """An episode of `turns` = [(sampled, inserted), ...] token counts; with `stepwise`, the turns
    in `rewritten` were sampled from a prompt that is not the concatenation (a re-rendered history)."""
    t = Trajectory(TASK, list(prompt), [], [], [], [], reward=reward, turn_prompts=[] if stepwise else None,
                   turn_rewards=turn_rewards)
    tok = 100
    for k, (n, obs) in enumerate(turns):
        given = t.prompt_ids + t.completion_ids
        if k in rewritten:
            given = [9, k] + t.completion_ids[-1:]  # what a template that drops earlier turns would give
        ids = list(range(tok, tok + n))
        t.append_turn(ids, logprobs=[-0.1 * (i + 1) for i in range(n)], version=k, prompt_ids=given)
        t.append(list(range(tok + 50, tok + 50 + obs)), sampled=False)
        tok += 10
    return t


# ---- the pure functions ----------------------------------------------------------------------


def test_episode_group_advantages_count_each_episode_once():
    # task 0: episode 0 has three rows (turns) with reward 1, episode 1 one row with reward 0.
    # Over episodes: mean .5, std sqrt(.5) -> +-A; over the four rows it would be mean .75.
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 2.0, 2.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    episodes = torch.tensor([0, 0, 0, 1, 2, 3])
    adv = episode_group_advantages(rewards, groups, episodes)
    assert adv.tolist() == pytest.approx([A, A, A, -A, 0.0, 0.0], abs=1e-6)
    rows_as_samples = group_advantages(rewards, groups)
    assert rows_as_samples[3].item() == pytest.approx(-0.75 / (0.5 + 1e-6))  # what a per-row baseline would say (std .5)
    dr = episode_group_advantages(rewards, groups, episodes, scale="none")
    assert dr.tolist() == pytest.approx([0.5, 0.5, 0.5, -0.5, 0.0, 0.0])
    rloo = episode_group_advantages(rewards, groups, episodes, baseline="rloo", scale="none")
    assert rloo.tolist() == pytest.approx([1.0, 1.0, 1.0, -1.0, 0.0, 0.0])


def test_one_row_per_episode_is_exactly_group_advantages():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(24, generator=gen)
    groups = torch.arange(24) // 4
    for episodes in (None, torch.arange(24)):
        assert torch.equal(episode_group_advantages(rewards, groups, episodes), group_advantages(rewards, groups))
    assert torch.equal(episode_sum(rewards, torch.arange(24)), rewards)


def test_rows_of_an_episode_must_agree():
    with pytest.raises(ValueError, match="share its reward and group"):
        episode_group_advantages(torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0, 0, 0]), torch.tensor([0, 0, 1]))


def test_episode_sum():
    x = torch.tensor([1.0, 2.0, 4.0, 8.0])
    assert episode_sum(x, torch.tensor([0, 0, 1, 0])).tolist() == [11.0, 11.0, 4.0, 11.0]
    assert episode_sum(x, None) is x


def test_turn_discount():
    # turns 0, 1, 2 of a 3-turn episode; a 1-turn episode; gamma .5: .25, .5, 1 (the outcome is after the last turn)
    turn_BC = torch.tensor([[0, 0, 1, 2], [0, 0, 0, 0]])
    d = turn_discount(turn_BC, torch.tensor([3, 1]), 0.5)
    assert d.tolist() == [[0.25, 0.25, 0.5, 1.0], [1.0, 1.0, 1.0, 1.0]]
    assert torch.equal(turn_discount(turn_BC, torch.tensor([3, 1]), 1.0), torch.ones(2, 4))
    with pytest.raises(ValueError):
        turn_discount(turn_BC, torch.tensor([3, 1]), 1.5)


def test_turn_advantages_by_hand():
    # Episode a: turn 0 found the gold (1), turn 1 answered (0). Episode b: a miss, a hit, the answer.
    # gamma 1: returns a [1, 0], b [1, 1, 0]. Position 0: [1, 1] -> 0, 0; position 1: [0, 1] ->
    # -+A; position 2: reached by b only -> 0.
    rewards = [[1.0, 0.0], [0.0, 1.0, 0.0]]
    assert turn_advantages(rewards, [0, 0], gamma=1.0) == [pytest.approx([0.0, -A], abs=1e-6), pytest.approx([0.0, A, 0.0], abs=1e-6)]
    # gamma .5: returns a [1, 0], b [.5, 1, 0]; position 0: [1, .5]: mean .75, std .3536 -> +-A
    assert turn_advantages(rewards, [0, 0], gamma=0.5) == [pytest.approx([A, -A], abs=1e-6), pytest.approx([-A, A, 0.0], abs=1e-6)]
    # Dr. GRPO's scale and RLOO's baseline, as for the outcome
    assert turn_advantages(rewards, [0, 0], gamma=0.5, scale="none") == [pytest.approx([0.25, -0.5]), pytest.approx([-0.25, 0.5, 0.0])]
    assert turn_advantages(rewards, [0, 0], gamma=0.5, baseline="rloo", scale="none") == [
        pytest.approx([0.5, -1.0]), pytest.approx([-0.5, 1.0, 0.0])]
    # identical episodes get nothing (a pooled baseline would push the last turn down in every one)
    assert turn_advantages([[1.0, 0.0]] * 3, [0, 0, 0]) == [[0.0, 0.0]] * 3
    # groups are separate; an episode without turns is fine
    out = turn_advantages([[1.0], [0.0], [5.0], []], [0, 0, 1, 1])
    assert out == [pytest.approx([A]), pytest.approx([-A]), [0.0], []]
    with pytest.raises(ValueError):
        turn_advantages([[1.0]], [0, 1])


# ---- the trajectory and the batch ------------------------------------------------------------


def test_append_turn_records_spans_and_only_rewritten_prompts():
    t = episode(1.0, [(3, 2), (2, 1), (1, 0)], stepwise=True, rewritten={2})
    assert t.turn_spans == [[0, 3], [5, 7], [8, 9]]
    assert t.turn_prompts == [None, None, [9, 2, 160]]  # turn 1's prompt was the concatenation: not stored
    assert t.turn_prompt(1) == [1, 2] + t.completion_ids[:5]
    assert t.turn_prompt(2) == [9, 2, 160]
    assert t.turn_index() == [0, 0, 0, 0, 0, 1, 1, 1, 2]
    steps = t.steps()
    assert [s.prompt_ids for s in steps] == [t.turn_prompt(k) for k in range(3)]
    assert [s.completion_ids for s in steps] == [[100, 101, 102], [110, 111], [120]]
    assert [s.logprobs for s in steps] == [[-0.1, -0.2, pytest.approx(-0.3)], [-0.1, -0.2], [-0.1]]
    assert [s.versions for s in steps] == [[0] * 3, [1] * 2, [2]]
    assert all(s.loss_mask == [1] * len(s.completion_ids) and s.reward == 1.0 for s in steps)
    prefix = episode(1.0, [(3, 2), (2, 1)], stepwise=False)
    assert prefix.turn_prompts is None and not prefix.stepwise and prefix.turn_spans == [[0, 3], [5, 7]]
    with pytest.raises(ValueError, match="turn prompts"):
        Trajectory(TASK, [1], [], [], [], [], turn_spans=[[0, 0]], turn_prompts=[])


def test_trajectory_turns_cross_ranks_as_json():
    """The controller broadcasts trajectories as JSON (parallel/controller.py): the turn fields survive."""
    from seekrl.parallel.controller import decode_batch, encode_batch
    from seekrl.rollout.base import RolloutBatch
    from seekrl.types import TrajectoryGroup

    t = episode(1.0, [(3, 2), (2, 0)], stepwise=True, rewritten={1}, turn_rewards=[1.0, 0.0])
    back = decode_batch(json.loads(json.dumps(encode_batch(RolloutBatch([TrajectoryGroup(TASK, [t])])))))
    u = back.groups[0].trajectories[0]
    assert (u.turn_spans, u.turn_prompts, u.turn_rewards) == (t.turn_spans, t.turn_prompts, t.turn_rewards)
    assert [s.prompt_ids for s in u.steps()] == [s.prompt_ids for s in t.steps()]


def test_stepwise_batch_has_one_row_per_turn_with_the_exact_ids():
    a = episode(1.0, [(3, 2), (2, 1)], stepwise=True, rewritten={1})
    b = episode(0.0, [(4, 0)], stepwise=True)
    c = episode(0.5, [(2, 3), (2, 0)], stepwise=False)
    batch = TokenBatch.from_trajectories([a, b, c], [0, 0, 1])
    rows = [*a.steps(), *b.steps(), c]
    assert len(batch) == 4
    assert batch.prompt_ids == [r.prompt_ids for r in rows] and batch.completion_ids == [r.completion_ids for r in rows]
    assert batch.prompt_ids[1] == [9, 1, 151]  # the re-rendered prompt turn 1 was sampled from
    assert batch.group_ids_B.tolist() == [0, 0, 0, 1] and batch.episode_ids_B.tolist() == [0, 0, 1, 2]
    assert batch.rewards_B.tolist() == [1.0, 1.0, 0.0, 0.5] and batch.turns_B.tolist() == [2, 2, 1, 2]
    assert batch.turn_BC[0, :3].tolist() == [0, 0, 0] and batch.turn_BC[1, :2].tolist() == [1, 1]
    assert batch.turn_BC[3, :7].tolist() == [0, 0, 0, 0, 0, 1, 1]  # prefix row: turn 0's tokens and observation, then turn 1
    for i, r in enumerate(rows):
        n = len(r.completion_ids)
        assert batch.loss_mask_BC[i, :n].tolist() == r.loss_mask and batch.versions_BC[i, :n].tolist() == r.versions
        assert batch.behav_logp_BC[i, :n].tolist() == pytest.approx(r.logprobs)
    sub = batch.select([1, 3])
    assert sub.episode_ids_B.tolist() == [0, 2] and sub.turns_B.tolist() == [2, 2] and sub.turn_BC.shape == (2, 7)


# ---- the estimator ---------------------------------------------------------------------------


def adv_rows(batch, est):
    return [est.adv_BC[i, : len(c)].tolist() for i, c in enumerate(batch.completion_ids)]


def test_stepwise_grpo_gives_every_turn_its_episodes_advantage():
    a = episode(1.0, [(2, 1), (1, 0)], stepwise=True, rewritten={1})
    b = episode(0.0, [(3, 0)], stepwise=True)
    batch = TokenBatch.from_trajectories([a, b], [0, 0])
    est = estimate_advantages("grpo", batch)
    assert adv_rows(batch, est) == [pytest.approx([A, A]), pytest.approx([A]), pytest.approx([-A] * 3)]
    # turn gamma .5: turn 0 of a's 2 turns gets half; b's only turn is its last
    est = estimate_advantages("grpo", TokenBatch.from_trajectories([a, b], [0, 0]), turn_gamma=0.5)
    assert adv_rows(batch, est) == [pytest.approx([A / 2, A / 2]), pytest.approx([A]), pytest.approx([-A] * 3)]


def test_prefix_and_stepwise_give_each_sampled_token_the_same_advantage():
    """The same episodes in the two layouts: on every sampled token the same advantage (turn
    discount and turn advantages included), so the layout changes contexts, not credit."""
    specs = [(1.0, [(2, 1), (3, 2), (1, 0)], [0.0, 1.0, 0.0]), (0.0, [(4, 0)], [0.0]),
             (1.0, [(1, 1), (2, 0)], [1.0, 0.0]), (0.5, [(2, 2), (2, 2), (2, 0)], [0.0, 0.0, 1.0])]
    groups = [0, 0, 1, 1]

    def per_token(stepwise, algo, **kw):
        trajs = [episode(r, turns, stepwise=stepwise, turn_rewards=tr) for r, turns, tr in specs]
        batch = TokenBatch.from_trajectories(trajs, groups)
        est = estimate_advantages(algo, batch, **kw)
        out = []
        for i, comp in enumerate(batch.completion_ids):
            out += [v for v, m in zip(est.adv_BC[i, : len(comp)].tolist(), batch.loss_mask_BC[i].tolist()) if m]
        return out

    for algo in ("grpo", "dr_grpo", "rloo"):
        for kw in ({}, {"turn_gamma": 0.7}, {"turn_advantage": True}, {"turn_gamma": 0.5, "turn_advantage": True}):
            assert per_token(True, algo, **kw) == pytest.approx(per_token(False, algo, **kw), abs=1e-6), (algo, kw)


def test_turn_advantage_by_hand_in_the_prefix_layout():
    # one group: a [turn rewards 1, 0], b [0, 1, 0]; outcome rewards 1 and 0.
    a = episode(1.0, [(1, 1), (1, 0)], stepwise=False, turn_rewards=[1.0, 0.0])
    b = episode(0.0, [(1, 1), (1, 1), (1, 0)], stepwise=False, turn_rewards=[0.0, 1.0, 0.0])
    batch = TokenBatch.from_trajectories([a, b], [0, 0])
    est = estimate_advantages("grpo", batch, turn_advantage=True)
    # outcome +-A on every sampled token; turn advantages (gamma 1): a [0, -A], b [0, A, 0]; observations 0
    assert adv_rows(batch, est) == [pytest.approx([A, 0.0, A - A], abs=1e-6), pytest.approx([-A, 0.0, -A + A, 0.0, -A], abs=1e-6)]
    without = TokenBatch.from_trajectories([episode(1.0, [(1, 0)], stepwise=False), episode(0.0, [(1, 0)], stepwise=False)], [0, 0])
    with pytest.raises(ValueError, match="no per-turn rewards"):
        estimate_advantages("grpo", without, turn_advantage=True)
    bad = TokenBatch.from_trajectories([episode(1.0, [(1, 0)], stepwise=False, turn_rewards=[1.0, 0.0])], [0])
    with pytest.raises(ValueError, match="one per turn"):
        estimate_advantages("grpo", bad, turn_advantage=True)


def branch_set(rewards, history, own=1, g=0):
    """An episode of `history` = [(sampled, inserted), ...] then a last turn of `own` tokens, and one
    answer branch per further reward: the history copied and masked, its own `own` tokens (set 0)."""
    first = episode(rewards[0], [*history, (own, 0)], stepwise=False)
    shared = sum(n + obs for n, obs in history)
    first.branch_set, first.shared_tokens = g, shared
    out = [first]
    for r in rewards[1:]:
        b = episode(r, [*history, (own, 0)], stepwise=False)
        b.loss_mask[:shared], b.logprobs[:shared], b.versions[:shared] = [0] * shared, [0.0] * shared, [-1] * shared
        b.branch_set = g
        out.append(b)
    return out


def test_answer_branches_credit_the_shared_history_with_the_sets_mean_advantage():
    # one task, two episodes with 2 branches each: set 0 rewards [1, 1, 0], set 1 [0, 0, 1]; Dr. GRPO
    # (mean .5): advantages set 0 [.5, .5, -.5] (mean 1/6), set 1 [-.5, -.5, .5] (mean -1/6).
    trajs = branch_set([1.0, 1.0, 0.0], [(2, 3)]) + branch_set([0.0, 0.0, 1.0], [(2, 3)], g=1)
    batch = TokenBatch.from_trajectories(trajs, [0] * 6)
    assert batch.branch_set_B.tolist() == [0, 0, 0, 1, 1, 1] and batch.shared_B.tolist() == [5, 0, 0, 5, 0, 0]
    tree = adv_rows(batch, estimate_advantages("dr_grpo", batch))  # branch_credit="mean", the default
    third = pytest.approx(1 / 6, abs=1e-6)
    assert tree[0] == [third, third, 0.0, 0.0, 0.0, pytest.approx(0.5)]  # the history's 2 sampled tokens, 3 inserted, its answer
    assert tree[1] == [0.0] * 5 + [pytest.approx(0.5)] and tree[2] == [0.0] * 5 + [pytest.approx(-0.5)]
    assert tree[3][:2] == [pytest.approx(-1 / 6, abs=1e-6)] * 2 and tree[3][5] == pytest.approx(-0.5)
    own = adv_rows(batch, estimate_advantages("dr_grpo", batch, branch_credit="episode"))
    assert own[0] == [pytest.approx(0.5)] * 2 + [0.0] * 3 + [pytest.approx(0.5)] and own[1:3] == tree[1:3]
    # local: the history gets 0 and each answer its advantage less its set's mean: set 0 [1/3, 1/3, -2/3], set 1 the negatives
    loc = adv_rows(batch, estimate_advantages("dr_grpo", batch, branch_credit="local"))
    assert loc[0] == [0.0] * 5 + [pytest.approx(1 / 3, abs=1e-6)] and loc[2] == [0.0] * 5 + [pytest.approx(-2 / 3, abs=1e-6)]
    assert loc[3] == [0.0] * 5 + [pytest.approx(-1 / 3, abs=1e-6)] and loc[5] == [0.0] * 5 + [pytest.approx(2 / 3, abs=1e-6)]
    assert sum(row[5] for row in loc[:3]) == pytest.approx(0.0, abs=1e-6)  # within a set the advantages sum to 0: the context is not credited
    # a set with no shared history (its episode answered at once, the branches resampled all of it) is still centred on its mean
    adv_B, sets_B = torch.tensor([0.5, 0.5, -0.5, -0.5]), torch.tensor([0, 0, 0, 1])
    flat = shared_history_advantages(adv_B, sets_B, torch.zeros(4, dtype=torch.long), 2, local=True)
    assert flat[:, 0].tolist() == pytest.approx([1 / 3, 1 / 3, -2 / 3, 0.0], abs=1e-6) and torch.equal(flat[:, 0], flat[:, 1])
    # one episode per task (G = 1): the set is the group, its mean advantage 0: only the answers train
    solo = TokenBatch.from_trajectories(branch_set([1.0, 0.0, 0.0, 1.0], [(3, 2), (1, 4)]), [0] * 4)
    adv = adv_rows(solo, estimate_advantages("grpo", solo))
    assert adv[0][:10] == [pytest.approx(0.0, abs=1e-6)] * 10
    assert adv[0][10] == pytest.approx(0.5 / (torch.tensor([1.0, 0.0, 0.0, 1.0]).std().item() + 1e-6), abs=1e-5)
    with pytest.raises(ValueError, match="branch_credit must be"):
        estimate_advantages("grpo", solo, branch_credit="first")
    # no branches: the estimator is the plain one (no set tensors on the batch)
    plain = TokenBatch.from_trajectories([episode(1.0, [(2, 0)], stepwise=False), episode(0.0, [(2, 0)], stepwise=False)], [0, 0])
    assert plain.branch_set_B is None and plain.shared_B is None


def test_informative_mask_follows_the_credit():
    """Without sets: a group is kept iff its rewards differ. With the sets of branch_credit=local: iff
    one of its sets' rewards differ, or one of its rows in no set is credited against a group with
    spread; and then every member of the group is kept."""
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 3])
    sets = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, -1, 4, 4, -1])
    assert informative_mask(rewards, groups).tolist() == [True] * 11 + [False]
    assert informative_mask(rewards, groups, sets).tolist() == [False] * 4 + [True] * 7 + [False]
    # the estimator agrees: group 0 (sets alike) has zero advantage at every column under local
    adv = group_advantages(rewards, groups)
    local = shared_history_advantages(adv, sets, torch.tensor([2] * 12), 4, local=True)
    assert local[:4].abs().max() == 0 and local[4:11].abs().max() > 0
    with pytest.raises(ValueError):
        informative_mask(rewards, groups, sets[:3])
    # algo.turn_advantage: a group also trains where the returns at one turn differ among its rows
    turns = [[0.0, 1.0]] * 4 + [[0.0]] * 7 + [[1.0]]
    assert informative_mask(rewards, groups, sets, turns).tolist() == [False] * 4 + [True] * 7 + [False]  # returns 1, 1 each
    turns[2] = [1.0, 0.0]  # returns 1, 0: they differ at turn 1
    assert informative_mask(rewards, groups, sets, turns).tolist() == [True] * 11 + [False]
    turns[2] = [1.0]  # returns 1 at turn 0, as the others'; turn 1 has the others only, alike
    assert informative_mask(rewards, groups, sets, turns).tolist() == [False] * 4 + [True] * 7 + [False]
    assert informative_mask(rewards, groups, sets, turns, turn_gamma=0.5).tolist() == [True] * 11 + [False]  # 0.5 vs 1 at turn 0
    with pytest.raises(ValueError):
        informative_mask(rewards, groups, sets, turns[:3])


def test_kl_in_the_reward_is_the_whole_episodes():
    # k1 = old - ref: a's two turns 1 + 1 -> 2 (coef .25: reward 1 - .5), b's 0: rewards [.5, 0] -> +-A
    a = episode(1.0, [(1, 0), (1, 0)], stepwise=True, rewritten={1})
    b = episode(0.0, [(1, 0)], stepwise=True)
    batch = TokenBatch.from_trajectories([a, b], [0, 0])
    batch.old_logp_BC = torch.tensor([[1.0], [1.0], [0.0]])
    est = estimate_advantages("dr_grpo", batch, ref_logp_BC=torch.zeros(3, 1), kl_coef_in_reward=0.25)
    assert adv_rows(batch, est) == [pytest.approx([0.25]), pytest.approx([0.25]), pytest.approx([-0.25])]


def test_defaults_are_the_old_estimator_bit_for_bit():
    gen = torch.Generator().manual_seed(1)
    trajs = [episode(float(torch.rand(1, generator=gen)), [(3, 2), (2, 0)], stepwise=False) for _ in range(8)]
    batch = TokenBatch.from_trajectories(trajs, [i // 4 for i in range(8)])
    for algo in ("grpo", "dr_grpo", "rloo"):
        from seekrl.train.estimate import GROUP_ESTIMATORS

        old = batch.trim(group_advantages(batch.rewards_B, batch.group_ids_B, **GROUP_ESTIMATORS[algo])[:, None] * batch.loss_mask_BC)
        assert torch.equal(estimate_advantages(algo, batch).adv_BC, old)


# ---- config ----------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides, message", [
    (["rollout.trajectory=stepwise", "algo.name=ppo"], "algo.name=ppo takes returns along one sequence: use grpo, dr_grpo, rloo or distill"),
    (["rollout.trajectory=stepwise", "algo.name=reinforce_pp"], "or rollout.trajectory=prefix"),
    (["rollout.trajectory=stepwise", "tools.format=search_r1", "tools.retriever=http://127.0.0.1:1/retrieve",
      "rollout.mask_observations=false", "algo.decoupled=false"], "set rollout.mask_observations=true"),
    (["algo.turn_advantage=true", "algo.name=ppo"], "algo.turn_advantage=true acts on a group baseline's advantage"),
    (["algo.turn_gamma=0.9", "algo.name=reinforce_pp"], "algo.turn_gamma=0.9 acts on a group baseline's advantage"),
    (["rollout.trajectory=sideways"], "rollout.trajectory"),
    (["rollout.answer_branches=4"], "rollout.answer_branches=4 samples the last turn of a tool episode again"),
    (["rollout.answer_branches=2", "rollout.trajectory=stepwise", "tools.format=search_r1", "tools.retriever=http://127.0.0.1:1/retrieve"],
     "it needs tools.format set and rollout.trajectory=prefix; set rollout.answer_branches=1"),
    (["rollout.answer_branches=0"], "rollout.answer_branches"),
    (["rollout.group_size=1", "rollout.refill=true", "algo.filter_zero_std=true"], "needs rollout.group_size >= 2 (or rollout.answer_branches >= 2)"),
    (["algo.branch_credit=first"], "algo.branch_credit"),
    (["rollout.branch_from=answer"], "rollout.branch_from=answer starts answer branches after the answer's opening tag"),
    (["rollout.branch_from=answer", "rollout.answer_branches=4", "tools.format=hermes", "tools.retriever=http://127.0.0.1:1/retrieve"],
     "tools.format search_r1 or dr_tulu"),
    (["rollout.branch_temperature=1.2"], "rollout.branch_temperature=1.2 is the temperature of answer branches: it needs "
                                         "rollout.answer_branches > 1"),
    (["rollout.branch_temperature=0", "rollout.answer_branches=2", "tools.format=search_r1", "tools.retriever=http://127.0.0.1:1/retrieve"],
     "rollout.branch_temperature=0 is the temperature of answer branches"),
])
def test_config_refuses_what_the_layouts_cannot_do(overrides, message):
    from seekrl.config import load_config
    from seekrl.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_config_accepts_the_layouts():
    from seekrl.config import load_config

    for algo in ("grpo", "dr_grpo", "rloo"):
        cfg = load_config(None, ["rollout.trajectory=stepwise", f"algo.name={algo}", "algo.turn_advantage=true", "algo.turn_gamma=0.9",
                                 "rollout.mode=async"])
        assert cfg.rollout.trajectory == "stepwise" and cfg.algo.turn_advantage
    assert load_config(None, []).rollout.trajectory == "prefix"
    branched = load_config(None, ["rollout.answer_branches=4", "tools.format=search_r1", "tools.retriever=http://127.0.0.1:1/retrieve"])
    assert branched.rollout.answer_branches == 4 and load_config(None, []).rollout.answer_branches == 1
    hot = load_config(None, ["rollout.answer_branches=4", "rollout.branch_temperature=1.2", "tools.format=search_r1",
                             "tools.retriever=http://127.0.0.1:1/retrieve"])
    assert hot.rollout.branch_temperature == 1.2 and branched.rollout.branch_temperature is None
    solo = load_config(None, ["rollout.answer_branches=8", "rollout.group_size=1", "rollout.batch_size=16", "rollout.refill=true",
                              "algo.filter_zero_std=true", "tools.format=search_r1", "tools.retriever=http://127.0.0.1:1/retrieve"])
    assert solo.rollout.group_size == 1 and solo.algo.branch_credit == "mean"  # one episode and its branches are the group
    assert solo.rollout.branch_from == "turn"
    answers = load_config(None, ["rollout.answer_branches=8", "rollout.branch_from=answer", "tools.format=search_r1",
                                 "tools.retriever=http://127.0.0.1:1/retrieve"])
    assert answers.rollout.branch_from == "answer"
    assert load_config(None, ["rollout.answer_branches=4", "algo.branch_credit=episode", "tools.format=search_r1",
                              "tools.retriever=http://127.0.0.1:1/retrieve"]).algo.branch_credit == "episode"


def test_turn_advantage_without_a_per_turn_reward_fails_before_the_model_loads(tmp_path, monkeypatch):
    import seekrl.build as build
    from seekrl.config import load_config
    from seekrl.errors import ConfigError

    monkeypatch.setattr(build, "load_policy", lambda *a, **k: pytest.fail("the model loaded"))
    cfg = load_config(None, ["algo.turn_advantage=true", "reward.functions=[qa_em]", f"log.dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"no reward of reward.functions=\['qa_em'\] gives per-turn rewards; add one"):
        build.build_rl(cfg)


def test_retrieved_support_turn_without_gold_titles_fails_before_the_model_loads(tmp_path, monkeypatch):
    """The reward credits the paragraphs a task names: on rows that name none it would score 0 on
    every episode, so the run is refused in one line; rows that name them (supporting_titles) pass."""
    import json

    import seekrl.build as build
    from seekrl.config import load_config
    from seekrl.errors import ConfigError

    rows = [{"question": f"q{i}?", "answer": "a"} for i in range(8)]
    data = tmp_path / "plain.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(build, "load_policy", lambda *a, **k: pytest.fail("the model loaded"))
    over = [f"data.train={data}", "data.template=search_r1", "tools.format=null",
            "reward.functions=[qa_f1, retrieved_support_turn]", f"log.dir={tmp_path}"]
    with pytest.raises(ConfigError, match=r"none of the 8 training tasks of data.train=.*plain.jsonl names its gold paragraphs"):
        build.build_rl(load_config(None, over))
    titled = tmp_path / "titled.jsonl"
    titled.write_text("".join(json.dumps({**r, "supporting_titles": ["T"]}) + "\n" for r in rows))

    class Loaded(Exception):
        pass

    def loaded(*a, **k):
        raise Loaded

    monkeypatch.setattr(build, "load_policy", loaded)
    with pytest.raises(Loaded):  # past the check: the model is what comes next
        build.build_rl(load_config(None, [*over[1:], f"data.train={titled}"]))
