"""On-policy distillation's teacher: the log-probs another model gives the student's own tokens.

    teacher = LocalTeacher(model, teacher_plan(model, train, pad_id), temperature)   # algo.teacher.path
    teacher = RemoteTeacher(TeacherClient(url, api), temperature)                     # algo.teacher.url
    batch.teacher_logp_BC = teacher.logprobs(batch)     # (B, C), zero past each row's end   (train/rl.py)

The student samples; the teacher scores every completion token of the batch given the same
prompt and the tokens before it (inserted tool output included: the advantage masks those,
algo/distill.py). Both read the same token ids, so they must share a tokenizer: `tokenizer_problem`
compares the vocabularies, and the composition root (seekrl/build.py) refuses a teacher whose
tokenizer differs before training starts.

The teacher scores each row at the temperature the trainer scores the student's row at
(rollout.temperature; a row sampled at its own, rollout.branch_temperature, at that one): with
both distributions taken at one temperature, the student that minimises the reverse KL is
the teacher itself (taken at different ones, it would be a sharpened or flattened teacher).

- `LocalTeacher`: a model in the trainer's process, scored by `score_completions`, the trainer's
  own scoring pass (the micro-batch plan, layouts and chunked head of train/plan.py and
  train/batching.py), so a teacher equal to the student gives exactly the student's old
  log-probs: reverse KL 0. Under several trainer ranks the teacher is sharded as the reference
  model is, and each rank scores its share of the rows.
- `RemoteTeacher`: a server (`seekrl serve engine`'s /score, or vLLM's prompt log-probs) through
  engines/scoring.py `TeacherClient`; rank 0 asks and the other ranks receive its answer. A
  server that cannot answer stops the run with one line (`EngineUnavailable`): every trajectory
  of the step would lack its reward, so there is nothing honest to train on.
- `scoring_batch(seqs, starts)`: token sequences as a TokenBatch (the engine server's /score).
- `teacher_folder(path)`: a checkpoint folder (runs/NAME/checkpoints/step_N) means its model/.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from seekrl.engines.scoring import TeacherClient
from seekrl.errors import EngineUnavailable, SeekrlError
from seekrl.models import unwrap_peft
from seekrl.parallel.ranks import Ranks
from seekrl.train.batch import TokenBatch, pad_completion
from seekrl.train.batching import can_share_prefix, completion_logprobs, row_temperatures
from seekrl.train.checkpoint import model_folder
from seekrl.train.config import TrainConfig
from seekrl.train.packing import can_pack
from seekrl.train.plan import MicroBatchPlan

__all__ = ["Teacher", "LocalTeacher", "RemoteTeacher", "score_completions", "teacher_plan", "scoring_batch", "teacher_folder",
           "tokenizer_problem"]


@runtime_checkable
class Teacher(Protocol):
    """What the RL step asks of a distillation teacher."""

    def logprobs(self, batch: TokenBatch) -> torch.Tensor:
        """The teacher's log-probs `(B, C)` of each completion token of `batch` (sampled and inserted), float32, zero past each row's end."""
        ...

    def close(self) -> None:
        """Release what it holds (a server connection)."""
        ...


@torch.no_grad()
def score_completions(model, plan: MicroBatchPlan, batch: TokenBatch, temperature: float) -> torch.Tensor:
    """Per-token log-probs `(B, C)` of every completion of `batch` under `model` at `temperature`:
    the trainer's no-gradient scoring pass (PolicyTrainer.logprobs) over `plan`'s micro-batches."""
    was_training = model.training
    model.eval()
    owned: dict[int, torch.Tensor] = {}
    try:
        for mb in plan.micro_batches(batch, list(range(len(batch)))):
            logp_BC, _ = completion_logprobs(model, mb, temperature)
            if not mb.dummy:
                for b, i in enumerate(mb.index):
                    owned[i] = logp_BC[b, : len(batch.completion_ids[i])]
    finally:
        model.train(was_training)
    return plan.gather(owned, batch)


def teacher_plan(model, train: TrainConfig, pad_id: int, ranks: Ranks | None = None) -> MicroBatchPlan:
    """The micro-batches a teacher is scored in: the trainer's token budget and layouts
    (train.micro_batch_tokens, share_prefix, packing), as far as the teacher's model allows them."""
    return MicroBatchPlan(train.micro_batch_tokens, pad_id, next(model.parameters()).device,
                          share_prefix=train.share_prefix and can_share_prefix(model),
                          pack=train.packing and can_pack(unwrap_peft(model)), ranks=ranks or Ranks(),
                          buckets=train.length_buckets)


class LocalTeacher:
    """A teacher model in the trainer's process (module docstring); its weights never change."""

    def __init__(self, model: torch.nn.Module, plan: MicroBatchPlan, temperature: float):
        self.model, self.plan, self.temperature = model, plan, temperature

    def logprobs(self, batch: TokenBatch) -> torch.Tensor:
        return score_completions(self.model, self.plan, batch, self.temperature)

    def close(self) -> None:
        pass


class RemoteTeacher:
    """A teacher on a server (module docstring): one client on rank 0, its answers broadcast."""

    def __init__(self, client: TeacherClient | None, temperature: float, ranks: Ranks | None = None):
        self.client, self.temperature, self.ranks = client, temperature, ranks or Ranks()

    def logprobs(self, batch: TokenBatch) -> torch.Tensor:
        seqs = [list(p) + list(c) for p, c in zip(batch.prompt_ids, batch.completion_ids)]
        starts = [len(p) for p in batch.prompt_ids]
        answer: dict | None = None
        if self.ranks.is_main:
            try:
                t_B = row_temperatures(batch, self.temperature)  # rows sampled at their own (answer branches)
                answer = {"rows": self.client.score(seqs, starts, self.temperature if t_B is None else t_B.tolist())}
            except SeekrlError as e:
                if not self.ranks.distributed:
                    raise
                answer = {"error": str(e)}
        answer = self.ranks.broadcast_json(answer)
        if "error" in answer:  # rank 0 raised it; the others stop with the same line
            raise EngineUnavailable(answer["error"])
        return pad_completion(answer["rows"], batch.width)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


def scoring_batch(seqs: list[list[int]], starts: list[int], temperatures: list[float] | None = None) -> TokenBatch:
    """Sequences as a TokenBatch whose completions are the tokens from `start` on (each start >= 1):
    what `score_completions` scores; `temperatures` (one a sequence), when they differ, become the
    rows' own (`TokenBatch.temperature_B`), so each row is scored at its own."""
    prompts = [list(s[:st]) for s, st in zip(seqs, starts)]
    comps = [list(s[st:]) for s, st in zip(seqs, starts)]
    C = max(1, max((len(c) for c in comps), default=0))
    lengths = torch.tensor([len(c) for c in comps])
    token_mask = torch.arange(C)[None, :] < lengths[:, None]
    return TokenBatch(
        prompt_ids=prompts, completion_ids=comps, loss_mask_BC=token_mask.float(), token_mask_BC=token_mask,
        behav_logp_BC=torch.zeros(len(seqs), C), versions_BC=torch.full((len(seqs), C), -1, dtype=torch.long),
        rewards_B=torch.zeros(len(seqs)), group_ids_B=torch.arange(len(seqs)), truncated_B=torch.zeros(len(seqs), dtype=torch.bool),
        temperature_B=(torch.tensor(temperatures, dtype=torch.float32) if temperatures is not None and len(set(temperatures)) > 1
                       else None),
    )


def teacher_folder(path: str) -> str:
    """`path`, or its model/ folder when `path` is a checkpoint folder (runs/NAME/checkpoints/step_N)."""
    return str(model_folder(path))


def tokenizer_problem(student, teacher) -> str | None:
    """Why `teacher`'s token ids would not mean what `student`'s do (None: the same vocabulary)."""
    a, b = student.get_vocab(), teacher.get_vocab()
    if a == b:
        return None
    differ = sum(1 for tok, i in a.items() if b.get(tok) != i) + sum(1 for tok in b if tok not in a)
    return f"its vocabulary has {len(b)} tokens, the policy's {len(a)}, and {differ} token -> id entries differ"
