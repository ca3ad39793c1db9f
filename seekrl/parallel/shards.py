"""Which rows each rank computes, and micro-batches that keep the ranks' collectives in step.

Every rank holds the whole batch (rank 0 broadcast it), so every rank can compute every rank's
share without talking: `shard_rows` splits the rows of a minibatch into N parts of about equal
tokens (longest-processing-time greedy over units; the G rows of a task stay together so the
shared-prefix pass still runs each prompt once), deterministically.

FSDP all-gathers a block's weights at each forward and reduce-scatters its gradients at each
backward, so every rank must run the same number of forward (and backward) passes.
`rank_micro_batches` plans every rank's micro-batches and pads the shorter plans with dummy
micro-batches (one real row, `dummy=True`): the trainer runs them and multiplies their loss by 0.
A layer run twice in a forward (the shared-prefix pass: prompts, then completions on their KV
cache) is gathered twice, so with `share_prefix` every micro-batch of every rank, dummies too,
takes the two-pass layout even where no rows share a prompt.
"""

from __future__ import annotations

from collections.abc import Iterator

from seekrl.parallel.ranks import Ranks
from seekrl.train.batching import MicroBatch, make_micro_batch, plan_micro_batches, plan_prefix_micro_batches, seq_len
from seekrl.types import Trajectory


def shard_rows(trajs: list[Trajectory], idx: list[int], world: int) -> list[list[int]]:
    """`idx` split into `world` token-balanced parts (module docstring), each in `idx` order."""
    units: dict[tuple, list[int]] = {}
    for i in idx:
        units.setdefault(tuple(trajs[i].prompt_ids), []).append(i)
    items = list(units.values())
    if len(items) < world:  # fewer prompts than ranks: split by rows
        items = [[i] for i in idx]

    def cost(unit: list[int]) -> int:
        return len(trajs[unit[0]].prompt_ids) + sum(len(trajs[i].completion_ids) for i in unit)

    loads, parts = [0] * world, [[] for _ in range(world)]
    for k in sorted(range(len(items)), key=lambda k: (-cost(items[k]), k)):
        r = min(range(world), key=lambda r: (loads[r], r))
        parts[r].extend(items[k])
        loads[r] += cost(items[k])
    pos = {i: n for n, i in enumerate(idx)}
    return [sorted(p, key=pos.__getitem__) for p in parts]


def plan(trajs: list[Trajectory], idx: list[int], budget: int, share: bool) -> list[list[int]]:
    """Micro-batches of the rows `idx` within `budget` tokens, as lists of rows."""
    if not idx:
        return []
    groups = plan_prefix_micro_batches(trajs, idx, budget) if share else plan_micro_batches([seq_len(trajs[i]) for i in idx], budget)
    return [[idx[k] for k in g] for g in groups]


def rank_micro_batches(trajs: list[Trajectory], idx: list[int], budget: int, pad_id: int, device, share: bool,
                       ranks: Ranks, pack: bool = False) -> Iterator[MicroBatch]:
    """This rank's micro-batches of the rows `idx`, as many as every other rank's (padded with dummies)."""
    if not ranks.distributed:
        for rows in plan(trajs, idx, budget, share):
            yield make_micro_batch(trajs, rows, pad_id, device, share_prefix=share, pack=pack)
        return
    plans = [plan(trajs, part, budget, share) for part in shard_rows(trajs, idx, ranks.world)]
    mine = plans[ranks.rank]
    for rows in mine:
        yield make_micro_batch(trajs, rows, pad_id, device, share_prefix=share, always_prefix=share, pack=pack)
    for _ in range(max(len(p) for p in plans) - len(mine)):
        mb = make_micro_batch(trajs, [idx[0]], pad_id, device, share_prefix=share, always_prefix=share, pack=pack)
        mb.dummy = True
        yield mb
