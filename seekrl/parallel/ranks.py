"""The trainer's ranks: who this process is, and the few collectives the controller design needs.

    torchrun --nproc-per-node 2 -m seekrl train examples/tiny_grpo.yaml

torchrun (or `seekrl launch`, which sets the same variables in its Ray actors) starts one process
per rank with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT in the
environment. `init_ranks` joins the process group from them (gloo on CPU, NCCL on CUDA,
`train.dist_backend`), with `train.dist_timeout_s` as the timeout of every collective, so a rank
that died or hangs ends the job instead of hanging it. Without those variables, or with one
rank, it returns `Ranks()`: one process, no process group, today's behaviour.

Messages between ranks (the batch rank 0 rolled out, per-row results, metrics) travel as JSON
in uint8 tensors: nothing a rank receives is unpickled.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
import traceback
from dataclasses import dataclass, field

import torch

from seekrl.errors import ConfigError, SeekrlError

__all__ = ["Ranks", "init_ranks", "env_world", "rank_errors"]


@dataclass
class Ranks:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1
    backend: str | None = None  # None: no process group (one process)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    fsdp: str = "none"  # full | hybrid | none: how the policy is split over the ranks (parallel/fsdp.py)
    mesh: object = None  # the FSDP device mesh (1-D; 2-D (replicate, shard) for hybrid)

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        """Parameters and optimizer state are split over the ranks (FSDP2)."""
        return self.distributed and self.fsdp in ("full", "hybrid")

    def __str__(self) -> str:
        return f"rank {self.rank} of {self.world}"

    # ---- collectives (no-ops with one process) ------------------------------------------------
    def barrier(self) -> None:
        if self.distributed:
            torch.distributed.barrier()

    def broadcast_json(self, obj=None):
        """Rank 0's `obj` on every rank (the others pass None)."""
        if not self.distributed:
            return obj
        data = json.dumps(obj).encode() if self.is_main else b""
        size = torch.tensor([len(data)], dtype=torch.long, device=self._comm_device)
        torch.distributed.broadcast(size, 0)
        buf = torch.empty(int(size.item()), dtype=torch.uint8, device=self._comm_device)
        if self.is_main:
            buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        torch.distributed.broadcast(buf, 0)
        return obj if self.is_main else json.loads(buf.cpu().numpy().tobytes().decode())

    def all_gather_json(self, obj) -> list:
        """Every rank's `obj`, in rank order, on every rank."""
        if not self.distributed:
            return [obj]
        data = json.dumps(obj).encode()
        size = torch.tensor([len(data)], dtype=torch.long, device=self._comm_device)
        sizes = [torch.zeros_like(size) for _ in range(self.world)]
        torch.distributed.all_gather(sizes, size)
        longest = max(int(s.item()) for s in sizes)
        buf = torch.zeros(longest, dtype=torch.uint8, device=self._comm_device)
        if data:
            buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self._comm_device)
        bufs = [torch.empty_like(buf) for _ in range(self.world)]
        torch.distributed.all_gather(bufs, buf)
        return [json.loads(b[: int(s.item())].cpu().numpy().tobytes().decode()) for b, s in zip(bufs, sizes)]

    def all_true(self, flag: bool) -> bool:
        """True on every rank iff `flag` is true on every rank."""
        if not self.distributed:
            return flag
        t = torch.tensor([1 if flag else 0], dtype=torch.long, device=self._comm_device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
        return bool(t.item())

    @property
    def _comm_device(self) -> torch.device:
        return self.device if self.backend == "nccl" else torch.device("cpu")

    def close(self) -> None:
        if self.distributed and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def env_world() -> int:
    """WORLD_SIZE as torchrun sets it (1 when absent)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise ConfigError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not an integer; start ranks with torchrun or seekrl launch") from None


def init_ranks(backend: str = "auto", fsdp: str = "full", timeout_s: float = 1800.0, *, lora: bool = False,
               device: str = "auto") -> Ranks:
    """Join the process group torchrun's variables describe (module docstring); one process: Ranks().
    `backend`, `fsdp`, `timeout_s`: train.dist_backend, train.fsdp, train.dist_timeout_s; `lora`: the
    policy has LoRA adapters (model.lora_r > 0); `device`: model.device."""
    world = env_world()
    if world <= 1:
        return Ranks()
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise ConfigError(f"WORLD_SIZE={world} but {', '.join(missing)} unset; start the ranks with torchrun or seekrl launch")
    if lora and fsdp != "none":
        raise ConfigError("LoRA over several ranks needs train.fsdp=none (every rank holds the base model; the adapters are small)")
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    use_cuda = torch.cuda.is_available() and device != "cpu"
    backend = backend if backend != "auto" else ("nccl" if use_cuda else "gloo")
    if backend == "nccl" and not use_cuda:
        raise ConfigError("train.dist_backend=nccl needs CUDA; use train.dist_backend=gloo (or auto) on CPUs")
    dev = torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(
            backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s),
            device_id=dev if backend == "nccl" else None,
        )
    ranks = Ranks(rank=rank, world=world, local_rank=local_rank, local_world=local_world, backend=backend, device=dev, fsdp=fsdp)
    if ranks.sharded:
        from torch.distributed.device_mesh import init_device_mesh

        kind = dev.type
        if fsdp == "hybrid" and world % local_world == 0 and world > local_world:
            ranks.mesh = init_device_mesh(kind, (world // local_world, local_world), mesh_dim_names=("replicate", "shard"))
        else:  # hybrid on one node is full sharding
            ranks.mesh = init_device_mesh(kind, (world,), mesh_dim_names=("shard",))
    return ranks


@contextlib.contextmanager
def rank_errors():
    """Under torchrun: an error on this rank ends it with one line naming the rank and the cause
    (after the traceback, for errors that are not bad input); torchrun then stops the other ranks,
    and a rank waiting on a dead one fails within train.dist_timeout_s (or at once when the
    connection drops) with its own line. One process: errors pass through unchanged."""
    try:
        yield
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as e:
        if env_world() <= 1:
            raise
        status = e.exit_status if isinstance(e, SeekrlError) else 1
        if status != 2:  # bad input is its one line; anything else shows where it came from
            traceback.print_exc()
        cause = (str(e).strip().splitlines() or [""])[0]
        print(f"seekrl: error: rank {os.environ.get('RANK', '?')} of {env_world()} failed: {type(e).__name__}: {cause}",
              file=sys.stderr, flush=True)
        raise SystemExit(status) from None
