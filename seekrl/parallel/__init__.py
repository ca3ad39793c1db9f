"""Trainer ranks: torch.distributed + FSDP2 under torchrun or `seekrl launch` (docs/ARCHITECTURE.md §10b).

ranks.py (who this process is; JSON collectives), fsdp.py (shard / gather the model), shards.py
(each rank's rows and micro-batches), controller.py (rank 0 rolls out, the others receive the
batch), checkpoint.py (gathered HF model + sharded optimizer state).
"""
