"""Which micro-batches an update runs: the token budget, the layouts, the ranks' shares, the dummies.

    plan = MicroBatchPlan(token_budget=8192, pad_id=0, device=cpu, share_prefix=True, pack=True, ranks=ranks)
    for mb in plan.micro_batches(batch, rows):        # batch: a TokenBatch; rows: e.g. one minibatch
        ...                                            # mb.rows, mb.dummy; layouts: train/batching.py

The policy and critic updates, their no-gradient scoring passes and SFT all take their
micro-batches from a plan, so the budget, packing and sharding rules live here once:

- **Budget.** Rows are grouped so that each micro-batch's padded size stays within
  `token_budget` (`plan_micro_batches`: sorted by length, so short and long sequences do not pad
  each other); with `share_prefix`, rows of the same prompt (or of the same lifted prefix: the
  branches of an episode) stay together and the cost counts each distinct prefix once
  (`plan_prefix_micro_batches`).
- **Layouts.** Each micro-batch is built by `batching.make_micro_batch`: right-padded, the
  shared-prefix layout (each distinct prompt run once, its KV cache expanded to its rows), or
  varlen-packed (`pack`, when that saves rows; train/packing.py).
- **Ranks.** Every rank holds the whole batch (rank 0 broadcast it), so every rank computes every
  rank's share without talking: `shard_rows` splits the rows into token-balanced parts
  (longest-processing-time greedy over units; the G rows of a task stay together so the
  shared-prefix pass still runs each prompt once), deterministically.
- **Dummies.** FSDP all-gathers a block's weights at each forward and reduce-scatters its
  gradients at each backward, so every rank must run the same number of passes: shorter plans
  are padded with dummy micro-batches (one real row, `dummy=True`) that the trainer runs with
  its loss multiplied by 0. A layer run twice in a forward (the shared-prefix pass) is gathered
  twice, so with `share_prefix` on several ranks every micro-batch, dummies too, takes the
  two-pass layout.
- **Gathering.** `gather(rows_BC)` puts per-row results computed on the ranks that own the rows
  into one `(B, C)` tensor on every rank.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from seekrl.parallel.ranks import Ranks
from seekrl.train.batch import TokenBatch
from seekrl.train.batching import MicroBatch, lifted_prefixes, make_micro_batch
from seekrl.train.config import TrainConfig

__all__ = ["MicroBatchPlan", "plan_micro_batches", "plan_prefix_micro_batches", "shard_rows"]


def plan_micro_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Group indices so that `len(group) * max_len(group) <= token_budget` (at least one each).

    Indices are sorted by length first, which keeps padding low. Returns groups in sorted order.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        new_longest = max(longest, lengths[i])
        if current and new_longest * (len(current) + 1) > token_budget:
            groups.append(current)
            current, new_longest = [], lengths[i]
        current.append(i)
        longest = new_longest
    if current:
        groups.append(current)
    return groups


def plan_prefix_micro_batches(batch: TokenBatch, index: list[int], token_budget: int) -> list[list[int]]:
    """Like `plan_micro_batches`, keeping rows with the same prompt together.

    Cost of a micro-batch: distinct prefixes × longest prefix + rows × longest rest of a
    completion, the tokens the shared-prefix forward processes. A row's prefix is its prompt and
    its lifted completion tokens (`batching.lifted_prefixes`: the history the branches of an
    episode share); rows of one lifted prefix are never split between micro-batches, since each
    micro-batch lifts only what its own rows share. Returns groups of positions into `index`.
    """
    lift = lifted_prefixes(batch, index)
    keys = [tuple(batch.prompt_ids[i]) + tuple(batch.completion_ids[i][:f]) for i, f in zip(index, lift)]
    rest = [len(batch.completion_ids[i]) - f for i, f in zip(index, lift)]
    order = sorted(range(len(index)), key=lambda k: (len(keys[k]), keys[k], rest[k]))
    units: list[list[int]] = []  # rows that share a lifted prefix go into one micro-batch together (the lift needs them all)
    for k in order:
        if lift[k] and units and lift[units[-1][0]] and keys[units[-1][0]] == keys[k]:
            units[-1].append(k)
        else:
            units.append([k])
    groups: list[list[int]] = []
    current: list[int] = []
    prompts: set = set()
    lp = lc = 0
    for unit in units:
        key = keys[unit[0]]
        n_p = len(prompts | {key})
        new_lp, new_lc = max(lp, len(key)), max(lc, *(rest[k] for k in unit))
        if current and n_p * new_lp + (len(current) + len(unit)) * new_lc > token_budget:
            groups.append(current)
            current, prompts = [], set()
            new_lp, new_lc = len(key), max(rest[k] for k in unit)
        current.extend(unit)
        prompts.add(key)
        lp, lc = new_lp, new_lc
    if current:
        groups.append(current)
    return groups


def shard_rows(batch: TokenBatch, idx: list[int], world: int) -> list[list[int]]:
    """`idx` split into `world` token-balanced parts (module docstring), each in `idx` order."""
    units: dict[tuple, list[int]] = {}
    for i in idx:
        units.setdefault(tuple(batch.prompt_ids[i]), []).append(i)
    items = list(units.values())
    if len(items) < world:  # fewer prompts than ranks: split by rows
        items = [[i] for i in idx]

    def cost(unit: list[int]) -> int:
        return len(batch.prompt_ids[unit[0]]) + sum(len(batch.completion_ids[i]) for i in unit)

    loads, parts = [0] * world, [[] for _ in range(world)]
    for k in sorted(range(len(items)), key=lambda k: (-cost(items[k]), k)):
        r = min(range(world), key=lambda r: (loads[r], r))
        parts[r].extend(items[k])
        loads[r] += cost(items[k])
    pos = {i: n for n, i in enumerate(idx)}
    return [sorted(p, key=pos.__getitem__) for p in parts]


@dataclass(frozen=True)
class MicroBatchPlan:
    """How an update's rows become micro-batches (module docstring)."""

    token_budget: int
    pad_id: int
    device: torch.device
    share_prefix: bool = False
    pack: bool = False
    ranks: Ranks = field(default_factory=Ranks)
    buckets: int = TrainConfig.length_buckets  # lengths rounded up (train/packing.py `bucket_length`); the callers pass train.length_buckets

    def groups(self, batch: TokenBatch, rows: list[int]) -> list[list[int]]:
        """The rows of each micro-batch within the budget (one rank's view: no sharding)."""
        if not rows:
            return []
        if self.share_prefix:
            groups = plan_prefix_micro_batches(batch, rows, self.token_budget)
        else:
            groups = plan_micro_batches([batch.seq_len(i) for i in rows], self.token_budget)
        return [[rows[k] for k in g] for g in groups]

    def _make(self, batch: TokenBatch, rows: list[int], always_prefix: bool) -> MicroBatch:
        return make_micro_batch(batch, rows, self.pad_id, self.device, share_prefix=self.share_prefix,
                                always_prefix=always_prefix, pack=self.pack, buckets=self.buckets)

    def micro_batches(self, batch: TokenBatch, rows: list[int]) -> Iterator[MicroBatch]:
        """This rank's micro-batches of `rows`, as many as every other rank's (padded with dummies)."""
        if not self.ranks.distributed:
            for group in self.groups(batch, rows):
                yield self._make(batch, group, always_prefix=False)
            return
        plans = [self.groups(batch, part) for part in shard_rows(batch, rows, self.ranks.world)]
        mine = plans[self.ranks.rank]
        for group in mine:
            yield self._make(batch, group, always_prefix=self.share_prefix)
        for _ in range(max(len(p) for p in plans) - len(mine)):
            mb = self._make(batch, [rows[0]], always_prefix=self.share_prefix)
            mb.dummy = True
            yield mb

    def gather(self, owned: dict[int, torch.Tensor], batch: TokenBatch) -> torch.Tensor:
        """Per-row results `{row: values (its completion's length)}` computed on the ranks that own
        the rows -> one `(B, C)` float32 tensor, zero past each row's end, on every rank."""
        if self.ranks.distributed:  # JSON of float32 values: exact
            parts = self.ranks.all_gather_json({str(i): v.tolist() for i, v in owned.items()})
            owned = {int(i): torch.tensor(v, dtype=torch.float32) for part in parts for i, v in part.items()}
        out = torch.zeros(len(batch), batch.width)
        for i, v in owned.items():
            out[i, : len(v)] = v.float().cpu()
        return out
