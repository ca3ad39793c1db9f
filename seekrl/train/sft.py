"""Supervised fine-tuning on chat data, with the loss on assistant tokens only.

    seekrl sft examples/x.yaml data.train=chats.jsonl train.steps=200

Rows are conversations, `{"messages": [{"role": ..., "content": ...}, ...]}` (open-r1 / TRL's
conversational form), or `{"prompt": [...messages], "completion": [...assistant messages]}`
(TRL's prompt-completion form; the two lists are joined, and strings become one user /
assistant message), or agent episodes `{"prompt": [...messages], "segments": [{"text",
"masked"}, ...]}` as `seekrl generate` (and RL's trajectories files) write them: the prompt is
rendered with the generation prompt and each segment is encoded on its own, trained unless
`masked` (`tokenize_segments`) — exactly the token layout of the tool workflow in RL, tool
outputs masked. Only assistant turns are trained on: their content and the end-of-turn
token get mask 1; system, user and tool messages (tool outputs), role headers and any other
template text get mask 0 — the same tokens RL masks as inserted.

Masking without re-tokenizing pieces (`tokenize_chat`): the conversation is rendered with the
chat template one prefix at a time, `apply_chat_template(messages[:k+1])`, and message k's
tokens are the suffix of prefix k+1's ids after prefix k's ids. Every prefix's ids must be a
prefix of the next one's; a template that rewrites earlier turns (e.g. one that drops the
reasoning of past assistant turns) breaks this, and `ChatTemplateError` says so rather than
training on misaligned masks. Within an assistant turn, the role header is the part shared
with `apply_chat_template(messages[:k], add_generation_prompt=True)` (what the model is given at
generation time); mask 1 runs from there up to and including the turn's last eos token
(`<|im_end|>` for ChatML; the whole rest of the turn if the template emits no eos).

The loss of an optimizer step is the summed token cross-entropy over the assistant tokens of
its sequences divided by their number, whatever the micro-batching. The examples become a
`TokenBatch` (train/batch.py; token 0 the prompt, the rest the completion) and take the RL
update's path: micro-batches from a `MicroBatchPlan` (train/plan.py: token budget, varlen
packing), hidden states from its scoring pass (train/batching.py); each micro-batch adds its sum
/ the step's total (tested against one batch). The LM head runs only at positions that predict
assistant tokens.

Config keys used (seekrl/build.py `build_sft` reads them): model.* (`model.path=tiny` trains the
tokenizer on the rows' texts), model.max_context (longer conversations are dropped and counted), data.train (chat
file), data.eval (optional chat file: `eval/loss` before training, every eval.every steps and
at the end), data.max_train / data.max_eval / data.shuffle, rollout.batch_size (conversations
per optimizer step — the key that counts sequences per step in RL too; keep it a multiple of
rollout.group_size, which config validation asks for), train.steps (optimizer steps),
train.lr / weight_decay / warmup_steps / schedule / min_lr_ratio / max_grad_norm /
micro_batch_tokens / seed / save_every / keep_last / resume / max_steps_this_run /
max_nonfinite, log.*. Checkpoints are the RL format (`checkpoints/step_N/model` is a standalone
HF folder with the tokenizer, usable as `model.path` of `seekrl train`); `train.resume=auto`
continues a run (damaged checkpoints are skipped, as in RL). A step whose loss or gradient norm
is nan/inf is skipped as in RL (`NonFiniteGuard`): metrics train/nonfinite_skipped(_total),
and `train.max_nonfinite` such steps in a row stop the run.
"""

from __future__ import annotations

import string
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from seekrl.algo.head_logprob import head_logprob_entropy, worth_chunking
from seekrl.data.iterator import TaskIterator
from seekrl.data.loaders import read_rows
from seekrl.errors import DataError
from seekrl.memory import release as release_memory
from seekrl.models import encode_chat, unwrap_peft
from seekrl.observe.config import LogConfig
from seekrl.observe.loggers import RunLogger
from seekrl.observe.progress import Progress
from seekrl.train.batch import TokenBatch
from seekrl.train.batching import MicroBatch, trained_hidden
from seekrl.train.checkpoint import resume_checkpoint, save_checkpoint
from seekrl.train.config import TrainConfig
from seekrl.train.optim import NonFiniteGuard, make_optimizer, step_scheduler
from seekrl.train.packing import can_pack
from seekrl.train.plan import MicroBatchPlan

__all__ = ["ChatTemplateError", "tokenize_chat", "tokenize_segments", "tokenize_text", "tokenize_examples", "load_sft_rows",
           "tiny_texts", "sft_loss_sums", "step_loss", "eval_loss", "SFTRun", "run"]


class ChatTemplateError(ValueError):
    """The chat template renders a conversation's prefixes inconsistently (see the module docstring)."""


# ---- tokenization ---------------------------------------------------------------------------
def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def tokenize_chat(tokenizer, messages: list[dict]) -> tuple[list[int], list[int]]:
    """`(ids, labels_mask)` of a conversation: mask 1 on assistant content + end-of-turn token.

    Raises ChatTemplateError when the template's rendering of `messages[:k]` is not a prefix of
    its rendering of `messages[:k+1]`.
    """
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    mask: list[int] = []
    for k, message in enumerate(messages):
        full = encode_chat(tokenizer, messages[: k + 1], add_generation_prompt=False)
        if full[: len(ids)] != ids:
            at = _common_prefix(full, ids)
            raise ChatTemplateError(
                f"the chat template renders messages[:{k}] as token ids that are not a prefix of the rendering of "
                f"messages[:{k + 1}] (they differ at token {at}: {tokenizer.decode(ids[at:at + 8])!r} vs "
                f"{tokenizer.decode(full[at:at + 8])!r}); it rewrites earlier turns, so assistant spans cannot be "
                f"located exactly — use a template that renders each turn independently"
            )
        delta = full[len(ids):]
        turn_mask = [0] * len(delta)
        if message["role"] == "assistant":
            header = encode_chat(tokenizer, messages[:k], add_generation_prompt=True) if k else []
            start = max(0, _common_prefix(header, full) - len(ids))
            positions = [i for i, t in enumerate(delta) if t == eos and i >= start]
            end = positions[-1] + 1 if positions else len(delta)
            turn_mask[start:end] = [1] * (end - start)
        ids += delta
        mask += turn_mask
    return ids, mask


# ---- data -----------------------------------------------------------------------------------
def _as_messages(value, role: str, where: str, name: str) -> list[dict]:
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: field '{name}' must be a non-empty list of messages, got {type(value).__name__}")
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise DataError(f"{where}: {name}[{i}] is a {type(m).__name__}, expected {{'role': ..., 'content': ...}}")
        for key in ("role", "content"):
            if key not in m:
                raise DataError(f"{where}: {name}[{i}] has no '{key}' field")
        if not isinstance(m["role"], str) or not (m["content"] is None or isinstance(m["content"], str)):
            raise DataError(f"{where}: {name}[{i}]: 'role' must be a string and 'content' a string")
    return value


def tokenize_segments(tokenizer, prompt: list[dict], segments: list[dict]) -> tuple[list[int], list[int]]:
    """`(ids, labels_mask)` of an agent episode: the chat prompt (mask 0, with the generation
    prompt), then each segment encoded on its own, mask 1 unless `masked` — the layout the tool
    workflow builds in RL (sampled turns, then inserted observations)."""
    ids = encode_chat(tokenizer, prompt, add_generation_prompt=True)
    mask = [0] * len(ids)
    for seg in segments:
        seg_ids = list(tokenizer.encode(seg["text"], add_special_tokens=False))
        ids += seg_ids
        mask += [0 if seg["masked"] else 1] * len(seg_ids)
    return ids, mask


def tokenize_text(tokenizer, text: str) -> tuple[list[int], list[int]]:
    """`(ids, labels_mask)` of a plain-text row: its tokens and an eos, all trained."""
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return ids, [1] * len(ids)


def _as_segments(value, where: str) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: field 'segments' must be a non-empty list of {{'text': str, 'masked': bool}}")
    for i, seg in enumerate(value):
        if not isinstance(seg, dict) or not isinstance(seg.get("text"), str) or not isinstance(seg.get("masked"), bool):
            raise DataError(f"{where}: segments[{i}] must be {{'text': str, 'masked': bool}}, got {str(seg)[:80]}")
    if not any(not seg["masked"] and seg["text"] for seg in value):
        raise DataError(f"{where}: every segment is masked, so nothing to train on")
    return value


def load_sft_rows(path: str | Path, limit: int | None = None) -> list:
    """Examples from a chat file: conversations (rows with `messages`, or `prompt` + `completion`)
    as lists of messages, agent episodes (rows with `prompt` + `segments`, as `seekrl
    generate` writes them) as `{"prompt": [...], "segments": [...]}` dicts, and plain-text
    rows (`text`) as strings.

    Raises DataError naming `file:line` (row number for non-jsonl files) and the missing field.
    """
    convs: list = []
    for number, row in read_rows(path):
        where = f"{path}:{number}"
        if "text" in row and not ("messages" in row or "prompt" in row):
            if not isinstance(row["text"], str) or not row["text"].strip():
                raise DataError(f"{where}: field 'text' must be a non-empty string")
            convs.append(row["text"])
            if limit is not None and len(convs) >= limit:
                break
            continue
        if "segments" in row:
            if "prompt" not in row:
                raise DataError(f"{where}: a row with 'segments' needs the 'prompt' messages too")
            convs.append({"prompt": _as_messages(row["prompt"], "user", where, "prompt"),
                          "segments": _as_segments(row["segments"], where)})
            if limit is not None and len(convs) >= limit:
                break
            continue
        if "messages" in row:
            conv = _as_messages(row["messages"], "user", where, "messages")
        elif "prompt" in row and "completion" in row:
            conv = _as_messages(row["prompt"], "user", where, "prompt") + _as_messages(
                row["completion"], "assistant", where, "completion"
            )
        else:
            missing = "'completion'" if "prompt" in row else "'messages' (or 'prompt' and 'completion', or 'text')"
            raise DataError(f"{where}: row has no {missing} field; fields: {', '.join(map(str, row)) or 'none'}")
        if not any(m["role"] == "assistant" for m in conv):
            raise DataError(f"{where}: conversation has no assistant message, so nothing to train on")
        convs.append(conv)
        if limit is not None and len(convs) >= limit:
            break
    if not convs:
        raise DataError(f"{path}: no rows")
    return convs


def _tokenize_one(tokenizer, c) -> tuple[list[int], list[int]]:
    if isinstance(c, str):
        return tokenize_text(tokenizer, c)
    if isinstance(c, dict):
        return tokenize_segments(tokenizer, c["prompt"], c["segments"])
    return tokenize_chat(tokenizer, c)


def tokenize_examples(tokenizer, convs: list, max_len: int, what: str) -> list[tuple[list[int], list[int]]]:
    out = [_tokenize_one(tokenizer, c) for c in convs]
    keep = [ex for ex in out if len(ex[0]) <= max_len and sum(ex[1]) > 0]
    if not keep:
        raise ValueError(f"{what}: every conversation is longer than model.max_context={max_len} tokens (or has no assistant tokens)")
    if len(keep) < len(out):
        Console(stderr=True).print(f"{what}: dropped {len(out) - len(keep)} conversations longer than {max_len} tokens")
    return keep


# ---- loss -----------------------------------------------------------------------------------
def sft_loss_sums(model, mb: MicroBatch) -> tuple[torch.Tensor, int]:
    """(summed cross-entropy over the micro-batch's trained tokens, their count). The hidden
    states come from the trainer's scoring pass (train/batching.py `trained_hidden`: padded or
    varlen-packed, the head only where a trained token is predicted); the LM head runs chunked
    (algo/head_logprob.py) when the `(tokens, vocabulary)` logits would be large, so they never
    exist whole."""
    hidden_NH, target_N, _ = trained_hidden(model, mb, mb.loss_mask_BC)
    head = unwrap_peft(model).get_output_embeddings()
    if isinstance(head, torch.nn.Linear) and worth_chunking(len(target_N), head.weight.shape[0]):
        logp_N, _ = head_logprob_entropy(hidden_NH, head.weight, head.bias, target_N, entropy=False)
        loss = -logp_N.sum()
    else:  # small logits, or a wrapped head (LoRA on the head): the plain path
        loss = torch.nn.functional.cross_entropy(head(hidden_NH).float(), target_N, reduction="sum")
    return loss, int(target_N.numel())


def step_loss(model, examples, budget: int, pad_id: int, device, backward: bool, pack: bool = False,
              scale: float = 1.0, buckets: int = TrainConfig.length_buckets) -> tuple[float, int, int]:
    """Loss per assistant token over `examples` (`(ids, labels_mask)` pairs), micro-batched by
    `budget` padded tokens (train/plan.py, as the RL updates; `pack`: varlen-packed rows; `buckets`:
    train.length_buckets).

    With `backward`, each micro-batch's sum × `scale` / the total count is back-propagated, so the
    accumulated gradient is that of `scale` × the whole batch's token-mean (PPO-ptx weighs it by
    algo.ptx_coef, train/ptx.py). Returns (loss, n_label, n_tokens), the loss unscaled.
    """
    batch = TokenBatch.from_sequences(examples)
    plan = MicroBatchPlan(budget, pad_id, torch.device(device), pack=pack, buckets=buckets)
    n_label = sum(sum(m[1:]) for _, m in examples)
    total = 0.0
    for mb in plan.micro_batches(batch, list(range(len(examples)))):
        loss_sum, _ = sft_loss_sums(model, mb)
        if backward:
            (loss_sum * (scale / n_label)).backward()
        total += float(loss_sum.detach())
    return total / max(1, n_label), n_label, sum(len(ids) for ids, _ in examples)


@torch.no_grad()
def eval_loss(model, examples, budget: int, pad_id: int, device, pack: bool = False, buckets: int = TrainConfig.length_buckets) -> float:
    """Mean cross-entropy per assistant token over `examples` (eval mode, no gradient)."""
    was_training = model.training
    model.eval()
    try:
        return step_loss(model, examples, budget, pad_id, device, backward=False, pack=pack, buckets=buckets)[0]
    finally:
        model.train(was_training)


# ---- loop -----------------------------------------------------------------------------------
@dataclass
class SFTRun:
    """What the SFT loop runs on, assembled by seekrl.build.build_sft (the composition root)."""

    train: TrainConfig
    log: LogConfig
    eval_every: int  # eval.every (0: only before and after training)
    batch_size: int  # conversations per optimizer step (rollout.batch_size)
    shuffle: bool  # data.shuffle
    config: dict  # the resolved config, for the loggers
    run_dir: Path
    model: torch.nn.Module
    tokenizer: Any
    train_examples: list[tuple[list[int], list[int]]]
    eval_examples: list[tuple[list[int], list[int]]]


def tiny_texts(convs: list) -> list[str]:
    """The texts the tiny model's tokenizer is trained on: every message, role header and segment."""
    msgs = [x for c in convs if not isinstance(c, str) for x in (c["prompt"] if isinstance(c, dict) else c)]
    texts = [x["content"] or "" for x in msgs] + sorted({x["role"] + "\n" for x in msgs})
    texts += [seg["text"] for c in convs if isinstance(c, dict) for seg in c["segments"]]
    texts += [c for c in convs if isinstance(c, str)]
    texts.append(string.printable)  # RL inserts tool output that may hold any printable character
    return texts


def run(s: SFTRun) -> Path:
    """Run (or resume) supervised fine-tuning; return the run folder."""
    t, model = s.train, s.model
    device = next(model.parameters()).device
    pad_id = s.tokenizer.pad_token_id
    pack = t.packing and can_pack(unwrap_peft(model))  # varlen rows instead of padding (train/packing.py)
    batches = TaskIterator(list(range(len(s.train_examples))), s.batch_size, seed=t.seed, shuffle=s.shuffle)
    optimizer, scheduler = make_optimizer(model.parameters(), t.lr, t, t.steps)
    guard = NonFiniteGuard(t.max_nonfinite, hint="lower train.lr or check the data")  # nan/inf steps are skipped

    start = _resume(s, optimizer, scheduler, batches, guard)
    logger = RunLogger.for_run(s.log, s.run_dir, s.config, resume_step=start if start > 0 else None)
    stop_at = t.steps if not t.max_steps_this_run else min(t.steps, start + t.max_steps_this_run)
    progress = Progress(t.steps, start_step=start, enabled=s.log.progress, fields=("loss", "eval/loss"))
    progress.start()
    model.train()
    try:
        if start == 0 and s.eval_examples:
            logger.log({"eval/loss": eval_loss(model, s.eval_examples, t.micro_batch_tokens, pad_id, device, pack, t.length_buckets)}, step=0)
        for step in range(start + 1, stop_at + 1):
            t0 = time.perf_counter()
            examples = [s.train_examples[i] for i in batches.next_batch()]
            loss, n_label, n_tok = step_loss(model, examples, t.micro_batch_tokens, pad_id, device, backward=True, pack=pack,
                                             buckets=t.length_buckets)
            grad_norm = float(torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], t.max_grad_norm))
            lr = optimizer.param_groups[0]["lr"]
            if guard.finite({"loss": loss, "grad_norm": grad_norm}):
                optimizer.step()  # else skipped: weights and optimizer state untouched; the schedule still advances
            step_scheduler(scheduler)
            optimizer.zero_grad(set_to_none=True)
            dt = time.perf_counter() - t0
            metrics = {
                "loss": loss, "lr": lr, "grad_norm": grad_norm, "tokens/assistant": n_label,
                "tokens/s": n_tok / dt, "time/step_s": dt, "epoch": batches.epoch, **guard.end_step(),
                **release_memory(),  # the step's freed pages back to the system (seekrl/memory.py)
            }
            if s.eval_examples and (step == t.steps or (s.eval_every and step % s.eval_every == 0)):
                metrics["eval/loss"] = eval_loss(model, s.eval_examples, t.micro_batch_tokens, pad_id, device, pack, t.length_buckets)
            logger.log(metrics, step=step)
            progress.update(step, metrics)
            guard.raise_if_stuck(step)  # train.max_nonfinite skipped steps in a row: stop, no checkpoint
            if step == stop_at or (t.save_every and step % t.save_every == 0):
                save_checkpoint(
                    s.run_dir / "checkpoints", step, model=model, tokenizer=s.tokenizer, optimizer=optimizer, scheduler=scheduler,
                    state={"step": step, "data": batches.state_dict(), "kind": "sft", "nonfinite": guard.state_dict()},
                    keep_last=t.keep_last,
                )
    finally:
        progress.close()
        logger.close()
    return s.run_dir


def _resume(s: SFTRun, optimizer, scheduler, batches: TaskIterator, guard: NonFiniteGuard) -> int:
    """Restore the checkpoint `train.resume` names, verified first (as the RL loop's resume: damaged
    ones skipped with a warning); return its step (0: fresh run)."""
    found = resume_checkpoint(
        s.train.resume, s.run_dir / "checkpoints", model=s.model, optimizer=optimizer, scheduler=scheduler, kind="sft"
    )
    if found is None:
        return 0
    _, state = found
    batches.load_state_dict(state["data"])
    guard.load_state_dict(state.get("nonfinite") or {})
    return int(state["step"])
