"""Policy (and critic) optimisation: PPO-style epochs over minibatches of token-budget micro-batches.

`PolicyTrainer.update(batch, stats)` takes the step's `TokenBatch` (train/batch.py) with its
per-token advantages and old log-probs filled in, and runs `train.ppo_epochs` passes of
`train.minibatches` optimizer steps each; every micro-batch (train/plan.py) carries its share of
the minibatch loss (tokens for token-mean, sequences otherwise), so the gradient equals the one
of the whole minibatch at once whatever the token budget, packing or number of ranks. The KL
term (when `algo.kl_in=loss`) and the entropy bonus are added per micro-batch the same way. The
learning-rate schedule steps once per RL step (warmup and cosine are counted in RL steps).

`CriticTrainer` is the PPO value model's twin: the same loop with the clipped value loss.

An optimizer step whose loss or gradient norm is nan/inf is skipped (train/optim.py
`NonFiniteGuard`); with several ranks the step is skipped on every rank or on none.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from seekrl.algo.advantages import kl_estimate
from seekrl.algo.config import AlgoConfig
from seekrl.algo.losses import POLICY_LOSSES, aggregate, kl_loss, value_loss
from seekrl.algo.mismatch import Correction, correction_weights
from seekrl.models import unwrap_peft
from seekrl.observe.stats import StatsTracker
from seekrl.parallel.fsdp import grad_scale, sync_gradients
from seekrl.parallel.ranks import Ranks
from seekrl.train.batch import TokenBatch
from seekrl.train.batching import MicroBatch, can_share_prefix, completion_logprobs
from seekrl.train.config import TrainConfig
from seekrl.train.optim import NonFiniteGuard, finite_everywhere, make_optimizer, minibatch_count, minibatch_indices, step_scheduler
from seekrl.train.packing import can_pack
from seekrl.train.plan import MicroBatchPlan
from seekrl.train.ptx import PtxAnchor

__all__ = ["PolicyTrainer", "CriticTrainer", "Minibatch"]


@dataclass(frozen=True)
class Minibatch:
    """One optimizer step's rows and what each micro-batch's share of its loss is measured against."""

    rows: list[int]
    mask_BC: torch.Tensor  # the loss mask the update trains on (algo.mask_truncated applied), whole batch
    row_tokens: list[float]  # trained tokens of each of `rows`
    tokens: int  # trained tokens in the minibatch (token-mean weights)
    sequences: int  # sequences with a trained token (sequence-mean weights)

    def share(self, row_tokens_R: torch.Tensor, token_mean: bool) -> float:
        """The part of the minibatch's loss carried by rows with these trained-token counts:
        their tokens (token-mean) or their sequences with a trained token (otherwise)."""
        if token_mean:
            return float(row_tokens_R.sum()) / self.tokens
        return float((row_tokens_R > 0).sum()) / max(1, self.sequences)


def _minibatch(rows: list[int], mask_BC: torch.Tensor) -> Minibatch:
    sums = [float(mask_BC[i].sum()) for i in rows]
    return Minibatch(rows, mask_BC, sums, int(sum(sums)), sum(1 for s in sums if s > 0))


class PolicyTrainer:
    """The policy update; `logprobs` / `ref_logprobs` score a batch without gradient."""

    def __init__(self, model, train: TrainConfig, algo: AlgoConfig, *, pad_id: int, temperature: float, norm_tokens: int,
                 total_steps: int, ref_model=None, ranks: Ranks | None = None, correction: Correction | None = None,
                 ptx: PtxAnchor | None = None):
        """`temperature`: the sampling temperature the log-probs are taken at; `norm_tokens`: the
        constant of algo.loss_agg=seq-mean-token-sum-norm (rollout.max_new_tokens). Several `ranks`:
        `model` (and `ref_model`) are sharded over them (parallel/fsdp.py). `ptx`: PPO-ptx's
        supervised examples, whose loss joins every optimizer step's gradient (train/ptx.py)."""
        self.model, self.train, self.algo = model, train, algo.resolved()  # (idempotent: a Config built in code too)
        self.correction = correction  # engine/trainer mismatch weights (algo/mismatch.py); None: off
        self.temperature, self.norm_tokens = temperature, norm_tokens
        self.ranks = ranks or Ranks()
        self.ref_model = ref_model
        self.ptx = ptx
        self.device = next(model.parameters()).device
        self.optimizer, self.scheduler = make_optimizer(model.parameters(), train.lr, train, total_steps)
        self.gen = torch.Generator().manual_seed(train.seed)
        self.plan = MicroBatchPlan(train.micro_batch_tokens, pad_id, self.device,
                                   share_prefix=train.share_prefix and can_share_prefix(model),
                                   pack=train.packing and can_pack(unwrap_peft(model)), ranks=self.ranks,
                                   buckets=train.length_buckets)
        self.guard = NonFiniteGuard(train.max_nonfinite)  # the RL loop closes its steps (train/optim.py)

    # ---- scoring without gradient -------------------------------------------------------------
    @torch.no_grad()
    def logprobs(self, batch: TokenBatch, model=None) -> torch.Tensor:
        """Per-token log-probs `(B, C)` of each completion under `model` (default: the policy)."""
        model = model if model is not None else self.model
        was_training = model.training
        model.eval()
        owned: dict[int, torch.Tensor] = {}
        for mb in self.plan.micro_batches(batch, list(range(len(batch)))):
            logp_BC, _ = completion_logprobs(model, mb, self.temperature)
            if not mb.dummy:
                for b, i in enumerate(mb.index):
                    owned[i] = logp_BC[b, : len(batch.completion_ids[i])]
        model.train(was_training)
        return self.plan.gather(owned, batch)

    def ref_logprobs(self, batch: TokenBatch) -> torch.Tensor:
        """Reference log-probs: the frozen initial policy, or the LoRA base with adapters off."""
        if self.ref_model is not None:
            return self.logprobs(batch, self.ref_model)
        if hasattr(self.model, "disable_adapter"):
            with self.model.disable_adapter():
                return self.logprobs(batch)
        raise RuntimeError("KL needs a reference model: build PolicyTrainer with ref_model or use LoRA")

    # ---- the update ---------------------------------------------------------------------------
    def update(self, batch: TokenBatch, stats: StatsTracker) -> None:
        """PPO epochs × minibatches over the batch: `batch.adv_BC` and `batch.old_logp_BC` set (None with
        one optimizer step: the update's own log-probs, detached, train/offpolicy.py), and
        `batch.ref_logp_BC` when `batch.kl_coef` > 0. Decoupled PPO (algo.decoupled,
        train/offpolicy.py): `batch.behav_logp_BC` are the behaviour log-probs and `old_logp_BC` the
        proximal ones, or with `batch.prox_alpha_BC` the proximal ones are interpolated in the loss."""
        t, groups = self.train, batch.group_ids_B.tolist()
        minibatches = minibatch_count(t, groups)
        if batch.old_logp_BC is None and (t.ppo_epochs > 1 or minibatches > 1):
            raise ValueError("old log-probs from the update's own forward pass need one optimizer step a batch "
                             "(train.ppo_epochs=1, one minibatch); recompute them first (trainer.logprobs)")
        mask_BC = batch.train_mask_BC(self.algo.mask_truncated)
        live_B = self._live_rows(batch, mask_BC)
        self.model.train()
        ptx_s = 0.0
        for _, idx in minibatch_indices(len(batch), t.ppo_epochs, minibatches, self.gen, groups):
            mini = _minibatch(idx, mask_BC)
            if mini.tokens == 0:
                stats.add(skipped_minibatches=1.0)
                continue
            run = self._rows_to_run(idx, live_B, mask_BC, mini, stats)
            self.optimizer.zero_grad(set_to_none=True)
            finite = True
            for mb in self.plan.micro_batches(batch, run):
                finite = self._micro_step(mb, batch, mini, stats) and finite
                if not finite and not self.ranks.distributed:
                    break  # its step is skipped anyway (every rank runs all its micro-batches: FSDP's collectives)
            if self.ptx is not None and (finite or self.ranks.distributed):  # PPO-ptx: the supervised loss joins this step's gradient
                t0 = time.perf_counter()
                finite = self.guard.finite({"loss/ptx": self.ptx.backward(self.model, stats)}) and finite
                ptx_s += time.perf_counter() - t0
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
        if self.ptx is not None:
            stats.add(**{"time/ptx_s": ptx_s})
        step_scheduler(self.scheduler)

    def _live_rows(self, batch: TokenBatch, mask_BC: torch.Tensor) -> torch.Tensor | None:
        """Which rows can move the weights (train.skip_zero_advantage): those with a nonzero
        advantage on a trained token. Every policy loss (algo/losses.py) is the advantage times a
        function of the ratio, so a row whose trained tokens all have advantage 0 has a gradient of
        exactly 0. None (every row runs) when the option is off or the loss has a term that does
        not vanish with the advantage: the KL in the loss, the entropy bonus."""
        if not self.train.skip_zero_advantage or self._kl_in_loss(batch) or self.algo.entropy_coef > 0:
            return None
        return ((batch.adv_BC != 0) & (mask_BC > 0)).any(dim=1)

    def _rows_to_run(self, idx: list[int], live_B: torch.Tensor | None, mask_BC: torch.Tensor, mini: Minibatch,
                     stats: StatsTracker) -> list[int]:
        """The minibatch's rows the update runs. The rows left out still count in `mini` (the
        loss's token or sequence normaliser), so the gradient is the whole minibatch's; their zero
        loss joins `loss/policy` with their share. A minibatch without a live row runs one row
        (a zero gradient), so the optimizer steps as it would on the whole minibatch (AdamW's
        moments move on a zero gradient, not on none)."""
        if live_B is None:
            return idx
        trained = [i for i, n in zip(idx, mini.row_tokens) if n > 0]
        run = [i for i in trained if bool(live_B[i])] or trained[:1]
        ran = set(run)
        left = [i for i in trained if i not in ran]
        stats.add_weighted(len(trained), **{"train/skipped_rows": len(left) / len(trained)})
        if left and self.ranks.is_main:  # once: the ranks' stats are merged (each micro-batch is its owner's)
            share = mini.share(mask_BC[left].sum(1), self.algo.loss_agg == "token-mean")
            stats.add_weighted(share, **{"loss/policy": 0.0})
        return run

    def _kl_in_loss(self, batch: TokenBatch) -> bool:
        """The loss has the KL term (algo.kl_in=loss, with reference log-probs and a coefficient)."""
        return batch.ref_logp_BC is not None and self.algo.kl_in == "loss" and batch.kl_coef > 0

    def _micro_step(self, mb: MicroBatch, batch: TokenBatch, mini: Minibatch, stats: StatsTracker) -> bool:
        """Forward and backward of one micro-batch; False (and no backward) when its loss is not finite."""
        a, rows, C, dev = self.algo, mb.index, mb.width, self.device
        mask_BC = batch.rows(mini.mask_BC, rows, C, dev)
        n_mb = float(mask_BC.sum())
        if mb.dummy or n_mb == 0:  # nothing to learn; with several ranks it still runs forward and backward
            if self.ranks.distributed:
                (completion_logprobs(self.model, mb, self.temperature)[0].sum() * 0.0).backward()
            return True
        # Each micro-batch carries its share of the minibatch loss (exact for every aggregation).
        weight = mini.share(mask_BC.sum(1), a.loss_agg == "token-mean")
        logp_BC, ent_BC = completion_logprobs(self.model, mb, self.temperature, entropy=True, where_BC=mask_BC)
        # None: one optimizer step on fresh tokens, so the old policy is this forward pass's (train/offpolicy.py)
        old_BC = logp_BC.detach() if batch.old_logp_BC is None else batch.rows(batch.old_logp_BC, rows, C, dev)
        adv_BC = batch.rows(batch.adv_BC, rows, C, dev)
        weight_BC, wstats = None, {}
        if a.decoupled or self.correction is not None:  # weigh each token by (proximal or old) / behaviour
            behav_BC = batch.rows(batch.behav_logp_BC, rows, C, dev)
            if a.decoupled and batch.prox_alpha_BC is not None:  # loglinear proximal log-probs
                alpha_BC = batch.rows(batch.prox_alpha_BC, rows, C, dev)
                old_BC = behav_BC + alpha_BC * (logp_BC.detach() - behav_BC)
            has_BC = mask_BC.bool() & (batch.rows(batch.versions_BC, rows, C, dev) >= 0)  # sampled: has behaviour log-probs
            c = self.correction or Correction("none", "token", None)  # decoupled PPO alone: the plain weight
            weight_BC, wstats = correction_weights(old_BC, behav_BC, has_BC, c, dtype=logp_BC.dtype)
            weight_BC = torch.where(has_BC, weight_BC, torch.ones_like(weight_BC))  # inserted tokens trained on: weight 1
        loss, pstats = POLICY_LOSSES[a.policy_loss](  # ppo | gspo | gspo_token | cispo (algo/losses.py)
            logp_BC, old_BC, adv_BC, mask_BC,
            clip_low=a.clip_low, clip_high=a.clip_high, dual_clip=a.dual_clip, agg=a.loss_agg, **self._norm(),
            is_weight_BT=weight_BC,
        )
        # decoupled PPO's behaviour weight (1 on-policy, where nothing is capped); the mismatch correction's effect
        pstats["behav_imp_weight/mean"] = wstats.get("weight_mean", 1.0) if a.decoupled else 1.0
        pstats["behav_cap_frac"] = wstats.get("masked_frac", 0.0) if a.decoupled else 0.0
        parts = {"loss/policy": loss.item()}
        stats.add_weighted(weight, **parts)  # exported: the minibatch's loss, however it was split
        stats.add_max(**{"actor/ratio_max": pstats.pop("ratio_max")})
        for k, v in pstats.items():  # token means within the micro-batch: weighted by its tokens
            stats.add_weighted(n_mb / mini.tokens, **{f"actor/{k}": v})
        if self.correction is not None:  # mismatch/weight_mean, mismatch/masked_frac, mismatch/truncated_frac
            stats.add_weighted(n_mb / mini.tokens, **{f"mismatch/{k}": v for k, v in wstats.items()})
        if self._kl_in_loss(batch):
            ref_BC = batch.rows(batch.ref_logp_BC, rows, C, dev)
            kl = kl_loss(logp_BC, ref_BC, mask_BC, kind=a.kl_estimator, agg=a.loss_agg, **self._norm())
            loss = loss + batch.kl_coef * kl
            parts["loss/kl"] = kl.item()
            stats.add_weighted(weight, **{"loss/kl": parts["loss/kl"]})
            if batch.old_logp_BC is None:  # the old policy is this pass's: the step's `kl` metric, on the trained tokens
                stats.add_masked("kl", kl_estimate(old_BC, ref_BC, kind=a.kl_estimator), mask_BC)
        if a.entropy_coef <= 0:
            ent_BC = ent_BC.detach()
        stats.add_masked("entropy", ent_BC.detach(), mask_BC)
        if a.entropy_coef > 0:
            loss = loss - a.entropy_coef * aggregate(ent_BC, mask_BC, a.loss_agg, **self._norm())
        if not self.guard.finite({**parts, "loss": loss.item()}):
            if self.ranks.distributed:  # the others reduce this backward's gradients; the step is skipped everywhere
                (loss * 0.0).backward()
            return False
        (loss * (weight * grad_scale(self.ranks))).backward()
        return True

    def _norm(self) -> dict:
        return {"norm_const": self.norm_tokens} if self.algo.loss_agg == "seq-mean-token-sum-norm" else {}


class CriticTrainer:
    """The PPO value model: per-token values in completion layout, clipped value loss."""

    def __init__(self, value_model, train: TrainConfig, algo: AlgoConfig, *, pad_id: int, total_steps: int,
                 ranks: Ranks | None = None):
        self.model, self.train, self.algo = value_model, train, algo.resolved()
        self.ranks = ranks or Ranks()
        self.device = next(value_model.parameters()).device
        self.optimizer, self.scheduler = make_optimizer(value_model.parameters(), train.critic_lr, train, total_steps)
        self.gen = torch.Generator().manual_seed(train.seed + 1)
        self.plan = MicroBatchPlan(train.micro_batch_tokens, pad_id, self.device, ranks=self.ranks,  # full passes, padded
                                   buckets=train.length_buckets)
        self.guard = NonFiniteGuard(train.max_nonfinite)  # used when update() is given none

    def _values(self, mb: MicroBatch) -> torch.Tensor:
        values_BL = self.model(input_ids=mb.input_ids_BL, attention_mask=mb.attention_mask_BL)
        return values_BL.gather(1, mb.gather_idx_BC).float()

    @torch.no_grad()
    def values(self, batch: TokenBatch) -> torch.Tensor:
        """The critic's values `(B, C)` of each completion token."""
        was_training = self.model.training
        self.model.eval()
        owned: dict[int, torch.Tensor] = {}
        for mb in self.plan.micro_batches(batch, list(range(len(batch)))):
            v_BC = self._values(mb)
            if not mb.dummy:
                for b, i in enumerate(mb.index):
                    owned[i] = v_BC[b, : len(batch.completion_ids[i])]
        self.model.train(was_training)
        return self.plan.gather(owned, batch)

    def update(self, batch: TokenBatch, stats: StatsTracker, guard: NonFiniteGuard | None = None) -> None:
        """Value-loss epochs × minibatches against `batch.returns_BC` (clipped around
        `batch.values_BC`); an optimizer step with a non-finite loss or gradient norm is skipped and
        reported to `guard` (the policy trainer's in the RL loop)."""
        t = self.train
        guard = guard if guard is not None else self.guard
        mask_all = batch.train_mask_BC(self.algo.mask_truncated)
        self.model.train()
        groups = batch.group_ids_B.tolist()
        for _, idx in minibatch_indices(len(batch), t.ppo_epochs, minibatch_count(t, groups), self.gen, groups):
            mini = _minibatch(idx, mask_all)
            if mini.tokens == 0:
                continue
            self.optimizer.zero_grad(set_to_none=True)
            finite = True
            dist = self.ranks.distributed
            for mb in self.plan.micro_batches(batch, idx):
                C = mb.width
                mask_BC = batch.rows(mask_all, mb.index, C, self.device)
                if mb.dummy or mask_BC.sum() == 0:
                    if dist:  # every rank runs as many backward passes (FSDP's collectives)
                        (self._values(mb).sum() * 0.0).backward()
                    continue
                v_BC = self._values(mb)
                old_BC = batch.rows(batch.values_BC, mb.index, C, self.device)
                ret_BC = batch.rows(batch.returns_BC, mb.index, C, self.device)
                loss, vstats = value_loss(v_BC, old_BC, ret_BC, mask_BC, clip=self.algo.value_clip)
                loss_value = loss.item()
                weight = float(mask_BC.sum()) / mini.tokens
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
