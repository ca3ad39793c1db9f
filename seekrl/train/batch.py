"""One update's per-token data, built once from its trajectories: the `TokenBatch`.

Every per-token tensor is in *completion layout* `(B, C)`: row b holds trajectory b's completion
tokens (sampled and inserted) at columns `0 .. len(completion)-1`, zero past its end; C is the
longest completion of the batch. Built once per RL step (`from_trajectories`), or from token
sequences for SFT (`from_sequences`: the first token is the prompt, the rest the completion);
the RL step then fills in what it computes, in order:

    old_logp_BC     the ratio's denominator (train/offpolicy.py): behaviour, recomputed or proximal
    prox_alpha_BC   decoupled PPO with prox_logp=loglinear: the interpolation weight per token
    ref_logp_BC     the reference policy's log-probs (algo.kl_coef > 0)
    teacher_logp_BC the distillation teacher's log-probs of the same tokens (algo.teacher; train/teacher.py)
    values_BC       the critic's values (PPO)
    adv_BC          advantages (train/estimate.py)
    returns_BC      the critic's targets (PPO)
    kl_coef         the KL coefficient in the loss this step (algo.kl_in=loss)

Rows and episodes: a trajectory in the prefix layout is one row; a stepwise one (rollout.trajectory=
stepwise) is one row per turn, its prompt the exact ids the engine was given for that turn and its
completion the turn's sampled tokens. `episode_ids_B` says which rows are one episode (the group
baseline counts episodes, train/estimate.py), `turn_BC` / `turns_B` which turn of how many a token
belongs to (turn discount, turn-level advantages), `turn_rewards` the episode's per-turn rewards.
Answer branches (rollout.answer_branches): `branch_set_B` says which rows are one episode and its
branches, `shared_B` how many leading tokens of the episode's row its branches share (the
history they copy, masked in them; algo.branch_credit credits it).

Micro-batches take rows of these tensors (`rows`), never lists: the batch goes to tensors once.
Values computed on the batch are zero past each row's end, as the rows they came from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from seekrl.types import Trajectory

__all__ = ["TokenBatch", "pad_completion"]


def pad_completion(rows: list[list], width: int, dtype=torch.float32) -> torch.Tensor:
    """Per-row lists (each as long as its completion) -> a `(B, width)` tensor, zero past each row's end."""
    out = torch.zeros(len(rows), width, dtype=dtype)
    for b, row in enumerate(rows):
        if row:
            out[b, : len(row)] = torch.as_tensor(row, dtype=dtype)
    return out


@dataclass
class TokenBatch:
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    loss_mask_BC: torch.Tensor  # float32: 1 where the token was sampled by the policy (trained)
    token_mask_BC: torch.Tensor  # bool: a completion token exists there (sampled or inserted)
    behav_logp_BC: torch.Tensor  # float32: the engine's log-probs; 0 where inserted
    versions_BC: torch.Tensor  # long: policy version that sampled each token; -1 where inserted
    rewards_B: torch.Tensor  # float32
    group_ids_B: torch.Tensor  # long: which task's group each row belongs to
    truncated_B: torch.Tensor  # bool: the completion was cut by its token budget
    episode_ids_B: torch.Tensor | None = None  # long: the episode of each row (stepwise: one row per turn); None: one row per episode
    turn_BC: torch.Tensor | None = None  # long: the episode's turn each completion token belongs to (Trajectory.turn_index)
    turns_B: torch.Tensor | None = None  # long: the number of turns of the row's episode
    turn_rewards: list[list[float] | None] | None = None  # per row: its episode's per-turn rewards (None: the rubric gave none)
    temperature_B: torch.Tensor | None = None  # float32: the temperature a row was sampled at when its own (NaN: the run's); None: every row at the run's
    branch_set_B: torch.Tensor | None = None  # long: the answer-branch set of each row, unique in the batch (-1: none); None: no branches
    shared_B: torch.Tensor | None = None  # long: a set's episode row, the leading completion tokens its branches share; 0 otherwise
    old_logp_BC: torch.Tensor | None = None
    prox_alpha_BC: torch.Tensor | None = None
    ref_logp_BC: torch.Tensor | None = None
    teacher_logp_BC: torch.Tensor | None = None
    values_BC: torch.Tensor | None = None
    adv_BC: torch.Tensor | None = None
    returns_BC: torch.Tensor | None = None
    kl_coef: float = 0.0

    @classmethod
    def from_trajectories(cls, trajs: list[Trajectory], group_ids: list[int] | None = None) -> TokenBatch:
        """One row per trajectory; a stepwise one (`Trajectory.stepwise`) gives one row per turn
        (`Trajectory.steps`: the exact prompt the engine was given, the turn's sampled tokens), each
        with the episode's reward and group, and the episode in `episode_ids_B`."""
        groups = group_ids if group_ids is not None else list(range(len(trajs)))
        episodes, rows, turn_of = [], [], []
        for e, t in enumerate(trajs):
            parts = t.steps() if t.stepwise else [t]
            episodes += [e] * len(parts)
            rows += parts
            turn_of += [[k] * len(p.completion_ids) for k, p in enumerate(parts)] if t.stepwise else [t.turn_index()]
        C = max(1, max((len(t.completion_ids) for t in rows), default=0))
        lengths = torch.tensor([len(t.completion_ids) for t in rows])
        sets: dict[tuple[int, int], int] = {}  # (group, set in the group) -> a batch-wide id
        set_of = [-1 if trajs[e].branch_set is None else sets.setdefault((groups[e], trajs[e].branch_set), len(sets)) for e in episodes]
        branched = any(s >= 0 for s in set_of)
        return cls(
            prompt_ids=[list(t.prompt_ids) for t in rows],
            completion_ids=[list(t.completion_ids) for t in rows],
            loss_mask_BC=pad_completion([t.loss_mask for t in rows], C),
            token_mask_BC=torch.arange(C)[None, :] < lengths[:, None],
            behav_logp_BC=pad_completion([t.logprobs for t in rows], C),
            versions_BC=pad_completion([t.versions for t in rows], C, torch.long) - (torch.arange(C)[None, :] >= lengths[:, None]).long(),
            rewards_B=torch.tensor([t.reward for t in rows], dtype=torch.float32),
            group_ids_B=torch.tensor([groups[e] for e in episodes], dtype=torch.long),
            truncated_B=torch.tensor([t.finish_reason == "length" for t in rows], dtype=torch.bool),
            episode_ids_B=torch.tensor(episodes, dtype=torch.long),
            turn_BC=pad_completion(turn_of, C, torch.long),
            turns_B=torch.tensor([trajs[e].num_turns for e in episodes], dtype=torch.long),
            turn_rewards=[trajs[e].turn_rewards for e in episodes],
            temperature_B=(torch.tensor([float("nan") if t.temperature is None else t.temperature for t in rows], dtype=torch.float32)
                           if any(t.temperature is not None for t in rows) else None),
            branch_set_B=torch.tensor(set_of, dtype=torch.long) if branched else None,
            shared_B=torch.tensor([t.shared_tokens for t in rows], dtype=torch.long) if branched else None,
        )

    @classmethod
    def from_sequences(cls, examples: list[tuple[list[int], list[int]]]) -> TokenBatch:
        """SFT examples `(ids, labels_mask)`: token 0 is the prompt, tokens 1.. the completion,
        trained where the mask is 1 (a label at position 0 has nothing to be predicted from)."""
        C = max(1, max(len(ids) - 1 for ids, _ in examples))
        comps = [list(ids[1:]) for ids, _ in examples]
        lengths = torch.tensor([len(c) for c in comps])
        zeros = torch.zeros(len(examples), C)
        return cls(
            prompt_ids=[list(ids[:1]) for ids, _ in examples],
            completion_ids=comps,
            loss_mask_BC=pad_completion([list(mask[1:]) for _, mask in examples], C),
            token_mask_BC=torch.arange(C)[None, :] < lengths[:, None],
            behav_logp_BC=zeros,
            versions_BC=torch.full((len(examples), C), -1, dtype=torch.long),
            rewards_B=torch.zeros(len(examples)),
            group_ids_B=torch.arange(len(examples)),
            truncated_B=torch.zeros(len(examples), dtype=torch.bool),
        )

    def __len__(self) -> int:
        return len(self.completion_ids)

    @property
    def width(self) -> int:
        """C: the longest completion (at least 1)."""
        return self.loss_mask_BC.shape[1]

    def seq_len(self, i: int) -> int:
        return len(self.prompt_ids[i]) + len(self.completion_ids[i])

    def train_mask_BC(self, mask_truncated: bool = False) -> torch.Tensor:
        """The loss mask the update trains on: with `mask_truncated`, zero on completions cut by
        their budget (DAPO's overlong filtering)."""
        if not mask_truncated:
            return self.loss_mask_BC
        return self.loss_mask_BC * (~self.truncated_B)[:, None].float()

    def trim(self, x_BC: torch.Tensor) -> torch.Tensor:
        """`x_BC` with zeros past each row's end (float32, on the CPU)."""
        return torch.where(self.token_mask_BC, x_BC.detach().float().cpu(), 0.0)

    def select(self, rows: list[int]) -> TokenBatch:
        """A batch of the rows `rows` (the inputs only: nothing the step fills in), cut to their width."""
        C = max(1, max((len(self.completion_ids[i]) for i in rows), default=0))
        return TokenBatch(
            prompt_ids=[self.prompt_ids[i] for i in rows], completion_ids=[self.completion_ids[i] for i in rows],
            loss_mask_BC=self.loss_mask_BC[rows, :C], token_mask_BC=self.token_mask_BC[rows, :C],
            behav_logp_BC=self.behav_logp_BC[rows, :C], versions_BC=self.versions_BC[rows, :C],
            rewards_B=self.rewards_B[rows], group_ids_B=self.group_ids_B[rows], truncated_B=self.truncated_B[rows],
            episode_ids_B=None if self.episode_ids_B is None else self.episode_ids_B[rows],
            turn_BC=None if self.turn_BC is None else self.turn_BC[rows, :C],
            turns_B=None if self.turns_B is None else self.turns_B[rows],
            turn_rewards=None if self.turn_rewards is None else [self.turn_rewards[i] for i in rows],
            temperature_B=None if self.temperature_B is None else self.temperature_B[rows],
            branch_set_B=None if self.branch_set_B is None else self.branch_set_B[rows],
            shared_B=None if self.shared_B is None else self.shared_B[rows],
        )

    def rows(self, x_BC: torch.Tensor, rows: list[int], width: int, device) -> torch.Tensor:
        """The rows `rows` of a batch tensor, cut to `width` columns, on `device`."""
        return x_BC[rows, :width].to(device)
