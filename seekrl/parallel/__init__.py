"""Trainer ranks: torch.distributed + FSDP2 under torchrun or `seekrl launch` (docs/ARCHITECTURE.md §11b).

ranks.py (who this process is; JSON collectives), fsdp.py (shard / gather the model),
controller.py (rank 0 rolls out, the others receive the batch). Which rows and micro-batches
each rank computes is the trainer's micro-batch plan (train/plan.py); checkpoints over ranks
(gathered HF model + sharded optimizer state) are train/checkpoint.py's.
"""
