"""Advantages, KL estimators and KL controllers: pure tensor functions, no model, no I/O.

Everything works on padded tensors named by axes: `_B` batch (one row per trajectory),
`_T` completion tokens, `mask_BT` 1 where the token was sampled by the policy (counts) and 0
for padding and inserted tokens (tool output, environment text). The trainer turns a list of
`TrajectoryGroup` into these tensors; nothing here knows about trajectories.

What is here, and the papers it follows:
- `group_advantages`: GRPO (Shao et al. 2024, DeepSeekMath), (r - mean_g) / (std_g + eps);
  Dr. GRPO (Liu et al. 2025) drops the std with `scale="none"`; RLOO (Ahmadian et al. 2024)
  uses the leave-one-out baseline `baseline="rloo"`. The std is the *unbiased* sample std
  (torch.std's default, as TRL and verl use); a group of one sample gets advantage 0.
- `reinforce_pp_advantages`: REINFORCE++ (Hu 2025): gamma=1 returns of the token rewards,
  whitened over the whole batch with the mask.
- `gae`: generalized advantage estimation (Schulman et al. 2016) with one departure needed for
  tool use (Search-R1, verl's multi-turn GAE): masked positions are *skipped*, not treated as
  steps. Each valid token bootstraps from the value of the next *valid* token, so a block of
  tool-output tokens in the middle of a sequence is invisible to the recursion.
- `whiten`: masked mean/variance whitening (TRL / verl `masked_whiten`), with Bessel's
  correction; positions outside the mask are returned as 0 (verl leaves them unspecified).
- `kl_estimate`: Schulman's "Approximating KL divergence" (2020) k1/k2/k3 of KL(pi || ref),
  sampled from pi. k3 is clamped to [-10, 10] like verl's `low_var_kl`, and its log-ratio to
  [-20, 20] before the exp so that the gradient never sees inf.
- `token_rewards_with_kl`, `FixedKLController`, `AdaptiveKLController`: the "KL in the
  reward" variant of PPO-RLHF (Ziegler et al. 2019, Ouyang et al. 2022).
- `zero_std_group_mask`: DAPO's dynamic sampling filter (Yu et al. 2025): groups whose rewards
  are all equal carry no GRPO signal. `informative_mask` is the filter that follows the credit:
  with `algo.branch_credit=local` a group trains only through the answer-branch sets whose rewards
  differ, so a group is informative when one of its sets has spread (the refill and
  `algo.filter_zero_std` both ask it); with `algo.turn_advantage` a spread of the per-turn
  returns among the group's episodes counts too.
- Multi-turn episodes (`_B` rows may be the turns of one episode: rollout.trajectory=stepwise):
  `episode_group_advantages` takes the group baseline over episodes (each counted once, however
  many rows it has) and gives each row its episode's advantage; `episode_sum` sums a per-row
  value over each episode; `turn_discount` is turn_gamma^(K-1-k) for turn k of K (the outcome
  arrives after the last turn); `turn_advantages` turns per-turn rewards into per-turn
  advantages: discounted returns over the remaining turns, with the group baseline taken among
  the group's episodes at the same turn position.
- Answer branches (rollout.answer_branches: an episode and K - 1 answers sampled again from its
  history): `shared_history_advantages` credits the history the set shares with the mean
  advantage of the set's rows (Tree-GRPO, Ji et al. 2025: a tree node's value is the mean of its
  leaves'), each answer with its own.

Run the tests: `python -m pytest tests/unit/test_advantages.py -q`.
"""

from __future__ import annotations

import torch

from seekrl.algo.config import KL_KINDS

__all__ = [
    "group_advantages",
    "reinforce_pp_advantages",
    "gae",
    "whiten",
    "kl_estimate",
    "token_rewards_with_kl",
    "FixedKLController",
    "AdaptiveKLController",
    "zero_std_group_mask",
    "informative_mask",
    "turn_returns",
    "episode_group_advantages",
    "episode_sum",
    "shared_history_advantages",
    "turn_discount",
    "turn_advantages",
    "KL_KINDS",
]



def _check_same_shape(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{name_a} has shape {tuple(a.shape)} but {name_b} has shape {tuple(b.shape)}; they must match")


def _float(x: torch.Tensor) -> torch.Tensor:
    return x if x.is_floating_point() else x.float()


def _group_stats(rewards_B: torch.Tensor, group_ids_B: torch.Tensor):
    """Per-sample group sum, count and unbiased std, with scatter ops (no Python loop over groups).

    Returns (inv_B, sum_B, count_B, std_B): the group's values gathered back to each sample.
    """
    if rewards_B.dim() != 1 or group_ids_B.dim() != 1:
        raise ValueError(
            f"rewards_B and group_ids_B must be 1-D (one entry per sample), got shapes "
            f"{tuple(rewards_B.shape)} and {tuple(group_ids_B.shape)}"
        )
    _check_same_shape("rewards_B", rewards_B, "group_ids_B", group_ids_B)
    # Arbitrary ids (not sorted, not contiguous) -> dense group index 0..K-1.
    _, inv_B = torch.unique(group_ids_B, return_inverse=True)
    K = int(inv_B.max().item()) + 1 if inv_B.numel() else 0
    sum_K = torch.zeros(K, dtype=rewards_B.dtype, device=rewards_B.device).index_add_(0, inv_B, rewards_B)
    count_K = torch.zeros(K, dtype=rewards_B.dtype, device=rewards_B.device).index_add_(
        0, inv_B, torch.ones_like(rewards_B)
    )
    mean_K = sum_K / count_K
    dev2_B = (rewards_B - mean_K[inv_B]) ** 2
    ss_K = torch.zeros(K, dtype=rewards_B.dtype, device=rewards_B.device).index_add_(0, inv_B, dev2_B)
    # Unbiased (n-1) variance; a group of one has no spread, std 0 (not NaN as torch.std gives).
    var_K = torch.where(count_K > 1, ss_K / (count_K - 1).clamp(min=1), torch.zeros_like(ss_K))
    std_K = var_K.sqrt()
    return inv_B, sum_K[inv_B], count_K[inv_B], std_K[inv_B]


@torch.no_grad()
def group_advantages(
    rewards_B: torch.Tensor,
    group_ids_B: torch.Tensor,
    baseline: str = "mean",
    scale: str = "std",
    eps: float = 1e-6,
) -> torch.Tensor:
    """Group-relative advantage per sample (GRPO / Dr. GRPO / RLOO).

    rewards_B: (B,) scalar reward per trajectory. group_ids_B: (B,) integer ids, equal for the
    samples of one prompt; any values, any order.
    baseline: "mean" (GRPO: the group mean, the sample itself included) or "rloo" (the mean of
    the other G-1 samples; a group of one gets advantage 0).
    scale: "std" (divide by the unbiased group std + eps) or "none" (Dr. GRPO).
    Returns adv_B (B,), float, detached.
    """
    if baseline not in ("mean", "rloo"):
        raise ValueError(f"baseline must be 'mean' or 'rloo', got {baseline!r}")
    if scale not in ("std", "none"):
        raise ValueError(f"scale must be 'std' or 'none', got {scale!r}")
    rewards_B = _float(rewards_B)
    _, sum_B, count_B, std_B = _group_stats(rewards_B, group_ids_B)
    if baseline == "mean":
        base_B = sum_B / count_B
    else:
        # Leave-one-out mean; for a group of one there is no other sample -> baseline = itself.
        base_B = torch.where(count_B > 1, (sum_B - rewards_B) / (count_B - 1).clamp(min=1), rewards_B)
    adv_B = rewards_B - base_B  # (B,)
    if scale == "std":
        adv_B = adv_B / (std_B + eps)
    return adv_B


@torch.no_grad()
def zero_std_group_mask(rewards_B: torch.Tensor, group_ids_B: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """DAPO dynamic-sampling filter: keep_B (B,) bool, False for every member of a group whose
    rewards have no spread (max - min <= eps; a group of one sample has none)."""
    rewards_B = _float(rewards_B)
    inv_B, _, _, _ = _group_stats(rewards_B, group_ids_B)
    K = int(inv_B.max().item()) + 1 if inv_B.numel() else 0
    max_K = torch.full((K,), -torch.inf, dtype=rewards_B.dtype, device=rewards_B.device)
    min_K = torch.full((K,), torch.inf, dtype=rewards_B.dtype, device=rewards_B.device)
    max_K = max_K.scatter_reduce(0, inv_B, rewards_B, reduce="amax")
    min_K = min_K.scatter_reduce(0, inv_B, rewards_B, reduce="amin")
    return ((max_K - min_K) > eps)[inv_B]


def informative_mask(rewards_B: torch.Tensor, group_ids_B: torch.Tensor, set_ids_B: torch.Tensor | None = None,
                     turn_rewards: list[list[float]] | None = None, turn_gamma: float = 1.0,
                     eps: float = 1e-6) -> torch.Tensor:
    """keep_B (B,) bool: True for every member of a group in which the credit gives some row a
    nonzero advantage. `set_ids_B` None: the group's rewards have spread (`zero_std_group_mask`).
    With the answer-branch sets of algo.branch_credit=local (`set_ids_B`, unique in the batch, -1:
    in none), a row in a set trains only if its set's rewards have spread (its advantage is
    `(r - mean_set) / scale`, its history gets 0), and a row in no set if its group's have: a group
    whose sets each scored alike is uninformative even when its sets differ from one another.
    `turn_rewards` (algo.turn_advantage: each row's per-turn rewards): a row also trains when its
    return at some turn (`turn_returns`) differs from another row's of the group at that turn."""
    group_spread_B = zero_std_group_mask(rewards_B, group_ids_B, eps)
    row_B = group_spread_B
    if set_ids_B is not None:
        _check_same_shape("rewards_B", rewards_B, "set_ids_B", set_ids_B)
        in_set_B = set_ids_B >= 0
        alone_B = -1 - torch.arange(set_ids_B.numel(), device=set_ids_B.device)  # a row in no set has no set spread
        set_spread_B = zero_std_group_mask(rewards_B, torch.where(in_set_B, set_ids_B, alone_B), eps)
        row_B = torch.where(in_set_B, set_spread_B, group_spread_B)
    if turn_rewards is not None:
        if len(turn_rewards) != rewards_B.numel():
            raise ValueError(f"{len(turn_rewards)} rows of turn rewards for {rewards_B.numel()} rewards")
        returns_N, positions_N = _turn_positions(turn_rewards, group_ids_B.tolist(), turn_gamma)
        if returns_N.numel():
            row_N = torch.repeat_interleave(torch.arange(len(turn_rewards)), torch.tensor([len(r) for r in turn_rewards]))
            spread_N = zero_std_group_mask(returns_N, positions_N, eps)
            row_B = row_B | (torch.zeros(len(turn_rewards), dtype=torch.long).index_add_(0, row_N, spread_N.long()) > 0)
    _, inv_B = torch.unique(group_ids_B, return_inverse=True)
    any_G = torch.zeros(int(inv_B.max().item()) + 1 if inv_B.numel() else 0, dtype=torch.long, device=inv_B.device)
    any_G = any_G.index_add_(0, inv_B, row_B.long())
    return any_G[inv_B] > 0


def _episodes(episode_ids_B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(inv_B, first_E): each row's dense episode index, and each episode's first row."""
    _, inv_B = torch.unique(episode_ids_B, return_inverse=True)
    E = int(inv_B.max().item()) + 1 if inv_B.numel() else 0
    rows_B = torch.arange(inv_B.numel(), device=inv_B.device)
    first_E = torch.full((E,), inv_B.numel(), dtype=torch.long, device=inv_B.device).scatter_reduce(0, inv_B, rows_B, reduce="amin")
    return inv_B, first_E


@torch.no_grad()
def episode_group_advantages(
    rewards_B: torch.Tensor,
    group_ids_B: torch.Tensor,
    episode_ids_B: torch.Tensor | None,
    baseline: str = "mean",
    scale: str = "std",
    eps: float = 1e-6,
) -> torch.Tensor:
    """`group_advantages` when an episode may span several rows (one per turn): every episode counts
    once in its group's baseline (G episodes per task, not their turn rows), and each of its rows
    gets the episode's advantage. Rows of one episode must share its reward and group.
    `episode_ids_B` None (or all distinct): one row per episode, exactly `group_advantages`."""
    if episode_ids_B is None:
        return group_advantages(rewards_B, group_ids_B, baseline, scale, eps)
    _check_same_shape("rewards_B", rewards_B, "episode_ids_B", episode_ids_B)
    inv_B, first_E = _episodes(episode_ids_B)
    if first_E.numel() == inv_B.numel() and torch.equal(first_E, torch.arange(inv_B.numel(), device=inv_B.device)):
        return group_advantages(rewards_B, group_ids_B, baseline, scale, eps)  # one row per episode, in order
    rewards_B = _float(rewards_B)
    if not torch.equal(rewards_B, rewards_B[first_E][inv_B]) or not torch.equal(group_ids_B, group_ids_B[first_E][inv_B]):
        raise ValueError("the rows of one episode must share its reward and group")
    return group_advantages(rewards_B[first_E], group_ids_B[first_E], baseline, scale, eps)[inv_B]


@torch.no_grad()
def shared_history_advantages(adv_B: torch.Tensor, set_ids_B: torch.Tensor, shared_B: torch.Tensor, width: int,
                              local: bool = False) -> torch.Tensor:
    """Answer-branch credit (rollout.answer_branches, algo.branch_credit=mean): `(B, width)`, row b's
    advantage `adv_B[b]` at every column, except its first `shared_B[b]` columns, which get the mean
    advantage of the rows of its set (`set_ids_B`, -1: in none). The history an episode's branches
    share is one node of a tree whose leaves are the set's answers: its advantage is the mean of
    theirs (Tree-GRPO's node value), an estimate of the same quantity as the episode's own
    advantage with less variance; with one episode per task (G = 1) it is exactly 0 under a mean
    baseline, since the set is the whole group.

    `local` (algo.branch_credit=local): the shared history gets 0 and each row of a set its
    advantage less the set's mean, `(r_row - mean_set) / scale_group`: only how an answer read the
    set's context against its siblings trains, never what was searched. Rows in no set keep
    `adv_B[b]`."""
    _check_same_shape("adv_B", adv_B, "set_ids_B", set_ids_B)
    _check_same_shape("adv_B", adv_B, "shared_B", shared_B)
    adv_B = _float(adv_B)
    out_BC = adv_B[:, None].expand(-1, width).clone()
    in_set_B = set_ids_B >= 0
    if not local and not bool((in_set_B & (shared_B > 0)).any()):  # no history to credit
        return out_BC
    _, inv_B = torch.unique(torch.where(in_set_B, set_ids_B, -1), return_inverse=True)
    n = int(inv_B.max().item()) + 1
    sums = torch.zeros(n, dtype=adv_B.dtype).index_add_(0, inv_B, adv_B)
    counts = torch.zeros(n, dtype=adv_B.dtype).index_add_(0, inv_B, torch.ones_like(adv_B))
    mean_B = (sums / counts)[inv_B]
    cols_BC = torch.arange(width)[None, :] < torch.where(in_set_B, shared_B, 0)[:, None]
    if local:
        own_B = torch.where(in_set_B, adv_B - mean_B, adv_B)
        return torch.where(cols_BC, torch.zeros_like(out_BC), own_B[:, None].expand(-1, width))
    return torch.where(cols_BC, mean_B[:, None], out_BC)


@torch.no_grad()
def episode_sum(x_B: torch.Tensor, episode_ids_B: torch.Tensor | None) -> torch.Tensor:
    """Per row, the sum of `x_B` over the rows of its episode (None: each row is an episode: `x_B`)."""
    if episode_ids_B is None:
        return x_B
    _check_same_shape("x_B", x_B, "episode_ids_B", episode_ids_B)
    inv_B, first_E = _episodes(episode_ids_B)
    if first_E.numel() == inv_B.numel():
        return x_B
    return torch.zeros(first_E.numel(), dtype=x_B.dtype, device=x_B.device).index_add_(0, inv_B, x_B)[inv_B]


def turn_discount(turn_BC: torch.Tensor, turns_B: torch.Tensor, gamma: float) -> torch.Tensor:
    """gamma^(K-1-k) for a token of turn k in an episode of K turns (B, C): the outcome reward comes
    after the last turn, K-1-k turns after turn k. 1 everywhere when gamma == 1."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"turn gamma must be in [0, 1], got {gamma}")
    steps_BC = (turns_B[:, None] - 1 - turn_BC).clamp(min=0)
    return torch.full(steps_BC.shape, float(gamma)).pow(steps_BC.float()) if gamma != 1.0 else torch.ones(steps_BC.shape)


def turn_returns(rewards: list[float], gamma: float = 1.0) -> list[float]:
    """The return of each turn of one episode, G_k = r_k + gamma * G_{k+1} (the rewards of the turns left)."""
    g, out = 0.0, []
    for r in reversed(rewards):
        g = float(r) + gamma * g
        out.append(g)
    return out[::-1]


def _turn_positions(turn_rewards: list[list[float]], group_ids: list[int], gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Every turn's return (`turn_returns`), flat in episode order, and its (group, turn) as a dense
    id: the positions that `turn_advantages` compares, and `informative_mask` checks for spread."""
    returns: list[float] = []
    keys: list[tuple[int, int]] = []
    for rewards, group in zip(turn_rewards, group_ids):
        returns += turn_returns(rewards, gamma)
        keys += [(int(group), k) for k in range(len(rewards))]
    dense = {key: i for i, key in enumerate(dict.fromkeys(keys))}
    return torch.tensor(returns, dtype=torch.float64), torch.tensor([dense[k] for k in keys], dtype=torch.long)


@torch.no_grad()
def turn_advantages(
    turn_rewards: list[list[float]],
    group_ids: list[int],
    gamma: float = 1.0,
    baseline: str = "mean",
    scale: str = "std",
    eps: float = 1e-6,
) -> list[list[float]]:
    """Per-turn advantages from per-turn rewards (turn-level credit, `algo.turn_advantage`).

    turn_rewards[e][k]: the reward of episode e's turn k; group_ids[e]: its task's group. The return
    of turn k is G_k = r_k + gamma * G_{k+1} (the rewards of the turns left, discounted), and its
    advantage is `group_advantages` of G_k among the episodes of the group that reached turn k
    (same baseline and scale as the outcome's: a group's episodes are compared position by
    position, so identical episodes get 0, and a position only one episode reached gets 0).
    Returns the same ragged shape as `turn_rewards`.
    """
    if len(turn_rewards) != len(group_ids):
        raise ValueError(f"{len(turn_rewards)} episodes of turn rewards but {len(group_ids)} group ids")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"turn gamma must be in [0, 1], got {gamma}")
    returns_N, positions_N = _turn_positions(turn_rewards, group_ids, gamma)
    if not returns_N.numel():
        return [[] for _ in turn_rewards]
    adv = group_advantages(returns_N, positions_N, baseline, scale, eps)
    flat, out, pos = adv.tolist(), [], 0
    for rewards in turn_rewards:
        out.append(flat[pos : pos + len(rewards)])
        pos += len(rewards)
    return out


def whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Whiten x over the positions where mask is 1: (x - mean) / sqrt(var + eps).

    Mean and (unbiased, Bessel-corrected) variance are taken over all valid positions of the
    whole tensor. shift_mean=False adds the mean back (TRL / verl), so only the scale changes.
    Positions outside the mask are returned as 0. With fewer than 2 valid positions the
    variance is taken as 0.
    """
    _check_same_shape("x", x, "mask", mask)
    x = _float(x)
    m = mask.bool()
    n = m.sum()
    xm = torch.where(m, x, torch.zeros_like(x))
    mean = xm.sum() / n.clamp(min=1)
    dev2 = torch.where(m, (x - mean) ** 2, torch.zeros_like(x))
    var = torch.where(n > 1, dev2.sum() / (n - 1).clamp(min=1), torch.zeros_like(mean))
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(m, out, torch.zeros_like(out))


@torch.no_grad()
def reinforce_pp_advantages(rewards_B: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """REINFORCE++ advantages adv_BT (B, T): gamma=1 returns, whitened over the batch with the mask.

    rewards_B: (B,) scalar outcome reward, broadcast to every valid token (its gamma=1 return).
    Also accepts token rewards (B, T) (e.g. from `token_rewards_with_kl`): the return at a
    valid token is then the sum of the rewards at it and at the valid tokens after it.
    Masked positions get 0.
    """
    m_BT = mask_BT.bool()
    rewards = _float(rewards_B)
    if rewards.dim() == 1:
        if rewards.shape[0] != mask_BT.shape[0]:
            raise ValueError(f"rewards_B has {rewards.shape[0]} rows but mask_BT has {mask_BT.shape[0]}")
        returns_BT = rewards[:, None].expand(m_BT.shape)
    elif rewards.dim() == 2:
        _check_same_shape("rewards", rewards, "mask_BT", mask_BT)
        r_BT = torch.where(m_BT, rewards, torch.zeros_like(rewards))
        returns_BT = r_BT.flip(-1).cumsum(-1).flip(-1)  # reverse cumulative sum, gamma = 1
    else:
        raise ValueError(f"rewards must be (B,) or (B, T), got shape {tuple(rewards.shape)}")
    return whiten(returns_BT, m_BT, shift_mean=True)


@torch.no_grad()
def gae(
    rewards_BT: torch.Tensor,
    values_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation that skips masked positions. Returns (adv_BT, returns_BT).

    For each valid token t, with t' the next valid token of the row (none -> bootstrap 0):
        delta_t = r_t + gamma * V_t' - V_t
        A_t     = delta_t + gamma * lam * A_t'
        R_t     = A_t + V_t
    Masked positions (padding, tool output anywhere in the row) are not steps: their rewards
    and values are ignored and they get A = R = 0. The recursion runs right to left over T,
    vectorized over B. Inputs are detached (these are targets).
    """
    _check_same_shape("rewards_BT", rewards_BT, "mask_BT", mask_BT)
    _check_same_shape("values_BT", values_BT, "mask_BT", mask_BT)
    if not (0.0 <= gamma <= 1.0) or not (0.0 <= lam <= 1.0):
        raise ValueError(f"gamma and lam must be in [0, 1], got gamma={gamma}, lam={lam}")
    rewards_BT = _float(rewards_BT)
    values_BT = _float(values_BT).to(rewards_BT.dtype)
    m_BT = mask_BT.bool()
    B, T = m_BT.shape
    next_value_B = torch.zeros(B, dtype=rewards_BT.dtype, device=rewards_BT.device)  # V at next valid token
    next_adv_B = torch.zeros_like(next_value_B)  # A at next valid token
    adv_BT = torch.zeros_like(rewards_BT)
    for t in reversed(range(T)):
        valid_B = m_BT[:, t]
        delta_B = rewards_BT[:, t] + gamma * next_value_B - values_BT[:, t]
        a_B = delta_B + gamma * lam * next_adv_B
        adv_BT[:, t] = torch.where(valid_B, a_B, torch.zeros_like(a_B))
        # Only a valid token moves the "next valid" carry; masked tokens pass it through.
        next_adv_B = torch.where(valid_B, a_B, next_adv_B)
        next_value_B = torch.where(valid_B, values_BT[:, t], next_value_B)
    returns_BT = torch.where(m_BT, adv_BT + values_BT, torch.zeros_like(adv_BT))
    return adv_BT, returns_BT


def kl_estimate(logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor, kind: str = "k1") -> torch.Tensor:
    """Per-token estimate of KL(pi || ref) from samples of pi (Schulman 2020). Keeps the graph.

    With log_ratio = logp - ref_logp (= log pi/ref):
        k1 = log_ratio                                  (unbiased, high variance, can be < 0)
        k2 = 0.5 * log_ratio**2                         (biased, low variance, >= 0)
        k3 = exp(-log_ratio) - 1 + log_ratio            (unbiased, low variance, >= 0;
             = ratio - 1 - log ratio with ratio = ref/pi; verl's "low_var_kl")
    k3: log_ratio is clamped to [-20, 20] before the exp and the result to [-10, 10], as verl
    does, so one badly off token cannot blow up the loss (its gradient is then 0).
    """
    if kind not in KL_KINDS:
        raise ValueError(f"unknown KL estimator kind {kind!r}; valid kinds are {', '.join(KL_KINDS)}")
    _check_same_shape("logp_BT", logp_BT, "ref_logp_BT", ref_logp_BT)
    log_ratio_BT = logp_BT - ref_logp_BT
    if kind == "k1":
        return log_ratio_BT
    if kind == "k2":
        return 0.5 * log_ratio_BT.square()
    log_ratio_BT = log_ratio_BT.clamp(-20.0, 20.0)
    kl_BT = torch.exp(-log_ratio_BT) - 1.0 + log_ratio_BT
    return kl_BT.clamp(-10.0, 10.0)


@torch.no_grad()
def token_rewards_with_kl(
    rewards_B: torch.Tensor, kl_BT: torch.Tensor, mask_BT: torch.Tensor, coef: float
) -> torch.Tensor:
    """"KL in the reward": rewards_BT = -coef * kl at every valid token, plus the scalar
    reward at the last valid token of each row. Masked positions get 0; a row with no valid
    token gets no reward (there is no token to put it on)."""
    _check_same_shape("kl_BT", kl_BT, "mask_BT", mask_BT)
    rewards_B = _float(rewards_B)
    if rewards_B.shape != (mask_BT.shape[0],):
        raise ValueError(f"rewards_B must have shape ({mask_BT.shape[0]},), got {tuple(rewards_B.shape)}")
    m_BT = mask_BT.bool()
    kl_BT = kl_BT.to(rewards_B.dtype)
    out_BT = torch.where(m_BT, -coef * kl_BT, torch.zeros_like(kl_BT))
    T = m_BT.shape[1]
    pos_T = torch.arange(1, T + 1, device=m_BT.device)
    last_B = (m_BT * pos_T).argmax(dim=-1)  # index of the last valid token (0 if none)
    has_valid_B = m_BT.any(dim=-1)
    bonus_B = torch.where(has_valid_B, rewards_B, torch.zeros_like(rewards_B))
    out_BT[torch.arange(m_BT.shape[0], device=m_BT.device), last_B] += bonus_B
    return out_BT


class FixedKLController:
    """A constant KL coefficient, with the same interface as `AdaptiveKLController`."""

    def __init__(self, coef: float):
        if coef < 0:
            raise ValueError(f"KL coef must be >= 0, got {coef}")
        self.value = float(coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        pass

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, sec. 2.2): steer the measured KL to `target`.

        err   = clip(current_kl / target - 1, -0.2, 0.2)
        value = value * (1 + err * n_steps / horizon)
    `n_steps` is the number of samples (or steps) since the last update, as in the paper.
    """

    def __init__(self, init_coef: float, target: float, horizon: float):
        if init_coef < 0:
            raise ValueError(f"init_coef must be >= 0, got {init_coef}")
        if target <= 0:
            raise ValueError(f"target KL must be > 0, got {target}")
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {horizon}")
        self.value = float(init_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        err = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + err * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])
        self.target = float(state.get("target", self.target))
        self.horizon = float(state.get("horizon", self.horizon))
