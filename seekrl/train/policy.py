"""Policy (and critic) optimisation: PPO-style epochs over minibatches of token-budget micro-batches.

`PolicyTrainer.update` takes trajectories with their per-token advantages and old log-probs (all
in completion layout, see batching.py) and runs `train.ppo_epochs` passes of
`train.minibatches` optimizer steps each; every micro-batch's loss is weighted by its share of
the minibatch (tokens for token-mean, sequences otherwise), so the gradient equals the one of
the whole minibatch at once whatever the token budget. The KL term (when `algo.kl_in=loss`) and
the entropy bonus are added per micro-batch the same way. The learning-rate schedule steps
once per RL step (warmup and cosine are counted in RL steps).

`CriticTrainer` is the PPO value model's twin: the same loop with the clipped value loss.

Non-finite updates (`NonFiniteGuard`). Before each optimizer step the loss of every micro-batch
and the clipped gradient norm are checked; when one is nan or inf that optimizer step is skipped
(gradients zeroed, no optimizer.step, so the weights and the optimizer state never take a
non-finite value) while the learning-rate schedule still advances: it counts RL steps, so the lr
at step N is the same in every run. The RL loop counts an RL step with a skipped update in
`train/nonfinite_skipped` (1.0) and `train/nonfinite_skipped_total`, and stops with
`NonFiniteError` after `train.max_nonfinite` such steps in a row (0: never).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator

import torch

from seekrl.algo.losses import aggregate, kl_loss, policy_loss, value_loss
from seekrl.config import Config, ConfigError
from seekrl.observe.stats import StatsTracker
from seekrl.parallel.fsdp import grad_scale, sync_gradients
from seekrl.parallel.ranks import Ranks
from seekrl.parallel.shards import rank_micro_batches
from seekrl.train.batching import MicroBatch, _unwrap, can_share_prefix, completion_logprobs, pad_completion
from seekrl.train.packing import can_pack
from seekrl.types import Trajectory


class NonFiniteError(ConfigError):
    """`train.max_nonfinite` RL steps in a row had a non-finite loss or gradient norm. Their updates
    were skipped, so the weights and every checkpoint are finite. A ConfigError because the cause is
    an input (train.lr, the rewards): the CLI prints the one-line message and exits 2."""


class NonFiniteGuard:
    """Decides whether an optimizer step may run, and counts RL steps whose updates were skipped.

        if guard.finite({"loss/policy": loss, "grad_norm/policy": norm}): optimizer.step()
        ...
        stats.add(**guard.end_step())   # once per RL step: train/nonfinite_skipped(_total)
        guard.raise_if_stuck(step)      # NonFiniteError after max_consecutive skipped steps in a row

    Several updates (policy and critic, several minibatches) may report into one guard in one RL
    step; the step counts as skipped when any of them was. `state_dict` goes into checkpoints.
    """

    def __init__(self, max_consecutive: int, hint: str = "lower train.lr or check the rewards") -> None:
        self.max_consecutive = max_consecutive  # 0: never stop
        self.hint = hint  # the fix the stop message suggests
        self.consecutive = 0  # RL steps in a row with a skipped update
        self.total = 0  # RL steps with a skipped update, over the run
        self.first_bad: tuple[str, float] | None = None  # this RL step's first non-finite value
        self.last_bad: tuple[str, float] | None = None

    def finite(self, values: dict[str, float]) -> bool:
        """True when every value is finite; otherwise records the first bad one and returns False."""
        for name, value in values.items():
            if not math.isfinite(value):
                if self.first_bad is None:
                    self.first_bad = (name, value)
                return False
        return True

    def end_step(self) -> dict[str, float]:
        """Close one RL step; its metrics train/nonfinite_skipped (0 or 1) and train/nonfinite_skipped_total."""
        skipped = self.first_bad is not None
        if skipped:
            self.total += 1
            self.consecutive += 1
            self.last_bad = self.first_bad
        else:
            self.consecutive = 0
        self.first_bad = None
        return {"train/nonfinite_skipped": float(skipped), "train/nonfinite_skipped_total": float(self.total)}

    def raise_if_stuck(self, step: int) -> None:
        if self.max_consecutive and self.consecutive >= self.max_consecutive:
            name, value = self.last_bad or ("loss", math.nan)
            raise NonFiniteError(
                f"step {step}: {name} is {value}; {self.consecutive} consecutive steps had a non-finite loss or gradient "
                f"norm and their updates were skipped (train.max_nonfinite={self.max_consecutive}); "
                f"{self.hint} (the checkpoints hold the last finite weights)"
            )

    def state_dict(self) -> dict:
        return {"consecutive": self.consecutive, "total": self.total}

    def load_state_dict(self, state: dict) -> None:
        self.consecutive = int(state.get("consecutive", 0))
        self.total = int(state.get("total", 0))


def step_scheduler(scheduler) -> None:
    """`scheduler.step()`, without torch's warning about a scheduler step before any optimizer
    step: that happens on purpose when the first updates were skipped as non-finite."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before `optimizer.step\\(\\)`")
        scheduler.step()


def lr_lambda(warmup: int, total: int, schedule: str, min_ratio: float):
    """Multiplier of the base lr at RL step s: linear warmup, then constant or cosine to min_ratio."""

    def f(s: int) -> float:
        if warmup and s < warmup:
            return (s + 1) / warmup
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (s - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def make_optimizer(params, lr: float, weight_decay: float, total_steps: int, cfg: Config):
    params = [p for p in params if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.999), eps=1e-8)
    t = cfg.train
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(t.warmup_steps, total_steps, t.schedule, t.min_lr_ratio))
    return opt, sched


def minibatch_indices(n: int, epochs: int, minibatches: int, gen: torch.Generator) -> Iterator[tuple[int, list[int]]]:
    """(epoch, indices) for each optimizer step; reshuffled per epoch when there are several minibatches."""
    size = n // minibatches
    for epoch in range(epochs):
        perm = torch.randperm(n, generator=gen).tolist() if minibatches > 1 else list(range(n))
        for k in range(minibatches):
            yield epoch, perm[k * size : (k + 1) * size] if k < minibatches - 1 else perm[k * size :]


def micro_batches(trajs: list[Trajectory], idx: list[int], cfg: Config, pad_id: int, device, share: bool,
                  ranks: Ranks | None = None, pack: bool = False) -> Iterator[MicroBatch]:
    """The micro-batches of the trajectories `idx`, within `train.micro_batch_tokens`; with several
    ranks, this rank's share of them (parallel/shards.py), padded with dummies to the others' count;
    `pack`: varlen-packed rows (train/packing.py) instead of padded ones."""
    yield from rank_micro_batches(trajs, idx, cfg.train.micro_batch_tokens, pad_id, device, share, ranks or Ranks(), pack)


def gather_rows(rows: dict[int, list[float]], n: int, ranks: Ranks) -> list[list[float]]:
    """Per-row results computed on the ranks that own the rows → the list of all `n`, on every rank."""
    if ranks.distributed:
        rows = {int(i): v for part in ranks.all_gather_json({str(i): v for i, v in rows.items()}) for i, v in part.items()}
    return [rows.get(i, []) for i in range(n)]


def finite_everywhere(finite: bool, guard: NonFiniteGuard, ranks: Ranks) -> bool:
    """An optimizer step runs on every rank or on none: skipped when any rank saw a non-finite loss."""
    if not ranks.distributed:
        return finite
    everywhere = ranks.all_true(finite)
    if not everywhere:
        guard.finite({"loss (on another rank)": math.nan})  # counts the step as skipped on this rank too
    return everywhere


def effective_loss_masks(trajs: list[Trajectory], mask_truncated: bool) -> list[list[int]]:
    """The loss mask of each trajectory; all zero for truncated ones when `mask_truncated`."""
    return [[0] * len(t.loss_mask) if mask_truncated and t.finish_reason == "length" else t.loss_mask for t in trajs]


class PolicyTrainer:
    def __init__(self, model, cfg: Config, pad_id: int, total_steps: int, ref_model=None, ranks: Ranks | None = None):
        self.model = model
        self.ranks = ranks or Ranks()  # several: `model` (and ref_model) are sharded over them (parallel/fsdp.py)
        self.cfg = cfg
        self.pad_id = pad_id
        self.ref_model = ref_model
        self.device = next(model.parameters()).device
        self.optimizer, self.scheduler = make_optimizer(
            model.parameters(), cfg.train.lr, cfg.train.weight_decay, total_steps, cfg
        )
        self.gen = torch.Generator().manual_seed(cfg.train.seed)
        self.share_prefix = cfg.train.share_prefix and can_share_prefix(model)
        self.pack = cfg.train.packing and can_pack(_unwrap(model))
        self.guard = NonFiniteGuard(cfg.train.max_nonfinite)  # the RL loop closes its steps (module docstring)

    # ---- scoring without gradient -------------------------------------------------------------
    @torch.no_grad()
    def logprobs(self, trajs: list[Trajectory], model=None) -> list[list[float]]:
        """Per-token log-probs of each completion under `model` (default: the policy), no grad."""
        model = model if model is not None else self.model
        was_training = model.training
        model.eval()
        out: dict[int, list[float]] = {}
        for mb in micro_batches(trajs, list(range(len(trajs))), self.cfg, self.pad_id, self.device, self.share_prefix, self.ranks, self.pack):
            logp_BC, _ = completion_logprobs(model, mb, self.cfg.rollout.temperature)
            if not mb.dummy:
                for b, i in enumerate(mb.index):
                    out[i] = logp_BC[b, : len(trajs[i].completion_ids)].tolist()
        model.train(was_training)
        return gather_rows(out, len(trajs), self.ranks)

    def ref_logprobs(self, trajs: list[Trajectory]) -> list[list[float]]:
        """Reference log-probs: the frozen initial policy, or the LoRA base with adapters off."""
        if self.ref_model is not None:
            return self.logprobs(trajs, self.ref_model)
        if hasattr(self.model, "disable_adapter"):
            with self.model.disable_adapter():
                return self.logprobs(trajs)
        raise RuntimeError("KL needs a reference model: build PolicyTrainer with ref_model or use LoRA")

    # ---- the update ---------------------------------------------------------------------------
    def update(
        self,
        trajs: list[Trajectory],
        adv: list[list[float]],
        old_logp: list[list[float]],
        ref_logp: list[list[float]] | None,
        kl_coef: float,
        stats: StatsTracker,
        *,
        behav_logp: list[list[float]] | None = None,
        prox_alpha: list[list[float]] | None = None,
    ) -> None:
        """PPO epochs × minibatches over `trajs`; `adv`, `old_logp`, `ref_logp` are per token.
        Decoupled PPO (train/offpolicy.py): `behav_logp` are the behaviour log-probs and `old_logp`
        the proximal ones, or with `prox_alpha` the proximal ones are interpolated in the loss."""
        a, t = self.cfg.algo, self.cfg.train
        masks = effective_loss_masks(trajs, a.mask_truncated)
        self.model.train()
        for _, idx in minibatch_indices(len(trajs), t.ppo_epochs, t.minibatches, self.gen):
            n_tok = sum(sum(masks[i]) for i in idx)
            n_seq = sum(1 for i in idx if any(masks[i]))
            if n_tok == 0:
                stats.add(skipped_minibatches=1.0)
                continue
            self.optimizer.zero_grad(set_to_none=True)
            finite = True
            for mb in micro_batches(trajs, idx, self.cfg, self.pad_id, self.device, self.share_prefix, self.ranks, self.pack):
                finite = self._micro_step(mb, masks, adv, old_logp, ref_logp, kl_coef, n_tok, n_seq, stats, behav_logp,
                                          prox_alpha) and finite
                if not finite and not self.ranks.distributed:
                    break  # its step is skipped anyway (every rank runs all its micro-batches: FSDP's collectives)
            finite = finite_everywhere(finite, self.guard, self.ranks)
            if finite:
                sync_gradients(self.model, self.ranks)
                grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.max_grad_norm))
                stats.add(**{"grad_norm/policy": grad_norm})
                finite = self.guard.finite({"grad_norm/policy": grad_norm})
            if finite:
                self.optimizer.step()
            else:  # skipped: the weights and the optimizer state stay as they were
                self.optimizer.zero_grad(set_to_none=True)
        stats.add(lr=self.scheduler.get_last_lr()[0])
        step_scheduler(self.scheduler)

    def _micro_step(self, mb: MicroBatch, masks, adv, old_logp, ref_logp, kl_coef, n_tok, n_seq, stats, behav_logp=None,
                    prox_alpha=None) -> bool:
        """Forward and backward of one micro-batch; False (and no backward) when its loss is not finite."""
        a = self.cfg.algo
        C = mb.target_ids_BC.shape[1]
        rows = mb.index
        mask_BC = pad_completion([masks[i] for i in rows], C).to(self.device)
        n_mb = float(mask_BC.sum())
        if mb.dummy or n_mb == 0:  # nothing to learn; with several ranks it still runs forward and backward
            if self.ranks.distributed:
                (completion_logprobs(self.model, mb, self.cfg.rollout.temperature)[0].sum() * 0.0).backward()
            return True
        # Each micro-batch carries its share of the minibatch loss (exact for every aggregation).
        if a.loss_agg == "token-mean":
            weight = n_mb / n_tok
        else:
            weight = float((mask_BC.sum(1) > 0).sum()) / max(1, n_seq)
        logp_BC, ent_BC = completion_logprobs(self.model, mb, self.cfg.rollout.temperature, entropy=True, where_BC=mask_BC)
        old_BC = pad_completion([old_logp[i] for i in rows], C).to(self.device)
        adv_BC = pad_completion([adv[i] for i in rows], C).to(self.device)
        behav_BC = None
        if behav_logp is not None:  # decoupled PPO
            behav_BC = pad_completion([behav_logp[i] for i in rows], C).to(self.device)
            if prox_alpha is not None:  # loglinear proximal log-probs
                alpha_BC = pad_completion([prox_alpha[i] for i in rows], C).to(self.device)
                old_BC = behav_BC + alpha_BC * (logp_BC.detach() - behav_BC)
        loss, pstats = policy_loss(
            logp_BC, old_BC, adv_BC, mask_BC,
            clip_low=a.clip_low, clip_high=a.clip_high, dual_clip=a.dual_clip, agg=self._agg(), **self._norm(),
            behav_logp_BT=behav_BC, behav_imp_cap=a.behav_imp_cap if behav_BC is not None else None,
        )
        # on-policy (plain PPO): the behaviour weight is 1 and nothing is capped
        pstats["behav_imp_weight/mean"] = pstats.pop("behav_imp_weight_mean", 1.0)
        pstats.setdefault("behav_cap_frac", 0.0)
        parts = {"loss/policy": loss.item()}
        stats.add_weighted(weight, **parts)  # exported: the minibatch's loss, however it was split
        stats.add_max(**{"actor/ratio_max": pstats.pop("ratio_max")})
        for k, v in pstats.items():  # token means within the micro-batch: weighted by its tokens
            stats.add_weighted(n_mb / n_tok, **{f"actor/{k}": v})
        if ref_logp is not None and a.kl_in == "loss" and kl_coef > 0:
            ref_BC = pad_completion([ref_logp[i] for i in rows], C).to(self.device)
            kl = kl_loss(logp_BC, ref_BC, mask_BC, kind=a.kl_estimator, agg=self._agg(), **self._norm())
            loss = loss + kl_coef * kl
            parts["loss/kl"] = kl.item()
            stats.add_weighted(weight, **{"loss/kl": parts["loss/kl"]})
        if a.entropy_coef <= 0:
            ent_BC = ent_BC.detach()
        stats.add_masked("entropy", ent_BC.detach(), mask_BC)
        if a.entropy_coef > 0:
            loss = loss - a.entropy_coef * aggregate(ent_BC, mask_BC, self._agg(), **self._norm())
        if not self.guard.finite({**parts, "loss": loss.item()}):
            if self.ranks.distributed:  # the others reduce this backward's gradients; the step is skipped everywhere
                (loss * 0.0).backward()
            return False
        (loss * (weight * grad_scale(self.ranks))).backward()
        return True

    def _agg(self):
        return self.cfg.algo.loss_agg

    def _norm(self) -> dict:
        return {"norm_const": self.cfg.rollout.max_new_tokens} if self.cfg.algo.loss_agg == "seq-mean-token-sum-norm" else {}


class CriticTrainer:
    """The PPO value model: per-token values in completion layout, clipped value loss."""

    def __init__(self, value_model, cfg: Config, pad_id: int, total_steps: int, ranks: Ranks | None = None):
        self.model = value_model
        self.ranks = ranks or Ranks()
        self.cfg = cfg
        self.pad_id = pad_id
        self.device = next(value_model.parameters()).device
        self.optimizer, self.scheduler = make_optimizer(
            value_model.parameters(), cfg.train.critic_lr, cfg.train.weight_decay, total_steps, cfg
        )
        self.gen = torch.Generator().manual_seed(cfg.train.seed + 1)
        self.guard = NonFiniteGuard(cfg.train.max_nonfinite)  # used when update() is given none

    def _values(self, mb: MicroBatch) -> torch.Tensor:
        values_BL = self.model(input_ids=mb.input_ids_BL, attention_mask=mb.attention_mask_BL)
        return values_BL.gather(1, mb.gather_idx_BC).float()

    @torch.no_grad()
    def values(self, trajs: list[Trajectory]) -> list[list[float]]:
        was_training = self.model.training
        self.model.eval()
        out: dict[int, list[float]] = {}
        for mb in micro_batches(trajs, list(range(len(trajs))), self.cfg, self.pad_id, self.device, False, self.ranks):
            v_BC = self._values(mb)
            if not mb.dummy:
                for b, i in enumerate(mb.index):
                    out[i] = v_BC[b, : len(trajs[i].completion_ids)].tolist()
        self.model.train(was_training)
        return gather_rows(out, len(trajs), self.ranks)

    def update(self, trajs: list[Trajectory], old_values, returns, stats: StatsTracker, guard: NonFiniteGuard | None = None) -> None:
        """Value-loss epochs × minibatches; an optimizer step with a non-finite loss or gradient
        norm is skipped and reported to `guard` (the policy trainer's in the RL loop)."""
        t = self.cfg.train
        guard = guard if guard is not None else self.guard
        masks = effective_loss_masks(trajs, self.cfg.algo.mask_truncated)
        self.model.train()
        for _, idx in minibatch_indices(len(trajs), t.ppo_epochs, t.minibatches, self.gen):
            n_tok = sum(sum(masks[i]) for i in idx)
            if n_tok == 0:
                continue
            self.optimizer.zero_grad(set_to_none=True)
            finite = True
            dist = self.ranks.distributed
            for mb in micro_batches(trajs, idx, self.cfg, self.pad_id, self.device, False, self.ranks):
                C = mb.target_ids_BC.shape[1]
                mask_BC = pad_completion([masks[i] for i in mb.index], C).to(self.device)
                if mb.dummy or mask_BC.sum() == 0:
                    if dist:  # every rank runs as many backward passes (FSDP's collectives)
                        (self._values(mb).sum() * 0.0).backward()
                    continue
                v_BC = self._values(mb)
                old_BC = pad_completion([old_values[i] for i in mb.index], C).to(self.device)
                ret_BC = pad_completion([returns[i] for i in mb.index], C).to(self.device)
                loss, vstats = value_loss(v_BC, old_BC, ret_BC, mask_BC, clip=self.cfg.algo.value_clip)
                loss_value = loss.item()
                weight = float(mask_BC.sum()) / n_tok
                stats.add_weighted(weight, **{"loss/value": loss_value})
                for k, v in vstats.items():
                    stats.add_weighted(weight, **{f"critic/{k}": v})
                if not guard.finite({"loss/value": loss_value}):
                    finite = False
                    if not dist:
                        break
                    (loss * 0.0).backward()
                    continue
                (loss * (weight * grad_scale(self.ranks))).backward()
            finite = finite_everywhere(finite, guard, self.ranks)
            if finite:
                sync_gradients(self.model, self.ranks)
                grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.max_grad_norm))
                stats.add(**{"grad_norm/critic": grad_norm})
                finite = guard.finite({"grad_norm/critic": grad_norm})
            if finite:
                self.optimizer.step()
            else:  # skipped, as in PolicyTrainer.update
                self.optimizer.zero_grad(set_to_none=True)
        step_scheduler(self.scheduler)
