"""Checkpoints of a run over several trainer ranks (the format is train/checkpoint.py's).

One folder per checkpoint, as in one process. Rank 0 writes everything that is whole: the model
as a Hugging Face folder (`model/`, from its full copy, which `publish` keeps equal to the
sharded policy), the critic's gathered weights, scheduler, RNG and loop state. When the
optimizer state is sharded (train.fsdp=full|hybrid) every rank writes its shard with
torch.distributed.checkpoint into `optimizer_dcp/` (and `critic_optimizer_dcp/`) before rank 0
writes state.json, which marks the folder complete. With train.fsdp=none rank 0 writes the
one-process layout. Loading reshards: a checkpoint of N ranks resumes on M ranks or on one.
"""

from __future__ import annotations

from pathlib import Path

from seekrl.parallel.fsdp import full_state_dict
from seekrl.parallel.ranks import Ranks
from seekrl.parallel.dcp import save_sharded_optimizer
from seekrl.train.checkpoint import save_checkpoint


def save_ranks_checkpoint(ranks: Ranks, ckpt_root: Path, step: int, *, model, full_model, tokenizer, optimizer, scheduler,
                          critic=None, critic_optimizer=None, state: dict, keep_last: int | None) -> Path | None:
    """Every rank calls this; returns the folder on rank 0 (None on the others)."""
    if not ranks.sharded:
        path = None
        if ranks.is_main:
            path = save_checkpoint(ckpt_root, step, model=full_model, tokenizer=tokenizer, optimizer=optimizer, scheduler=scheduler,
                                   critic=critic, critic_optimizer=critic_optimizer, state=state, keep_last=keep_last)
        ranks.barrier()
        return path
    critic_weights = full_state_dict(critic, ranks) if critic is not None else None

    def write_shards(tmp: Path) -> None:
        save_sharded_optimizer(tmp, "optimizer", model, optimizer, ranks.is_main)
        if critic is not None:
            save_sharded_optimizer(tmp, "critic_optimizer", critic, critic_optimizer, ranks.is_main)

    def rank0_shards(tmp: Path) -> None:  # inside save_checkpoint, before state.json: the others join here
        ranks.broadcast_json(str(tmp))
        write_shards(tmp)

    path = None
    if ranks.is_main:
        path = save_checkpoint(ckpt_root, step, model=full_model, tokenizer=tokenizer, scheduler=scheduler, critic=critic_weights,
                               state=state, keep_last=keep_last, before_state=rank0_shards)
    else:
        write_shards(Path(ranks.broadcast_json(None)))
    ranks.barrier()  # no rank goes on before the checkpoint is complete
    return path
