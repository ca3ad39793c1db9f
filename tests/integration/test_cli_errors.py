"""Bad input to the `seekrl` command ends in one line, `seekrl: error: ...`, exit status 2, no traceback.

Each case is a real `python -m seekrl ...` process (two at a time, each bounded by a timeout that
kills it): a damaged model folder (config.json not JSON or without model_type, a truncated
safetensors file, a folder transformers cannot load) for `train`, `config`, `serve engine` and
`serve policy`; a data file with a byte that is not UTF-8 or a line that is not JSON; data slices
that select nothing or hold no integers; train.save_every < 0, a log.name that leaves log.dir, a
seed past numpy's range; a YAML key given twice. `config` is used where the check is in the
config validation (no model loads), `train` where it happens when the data or the model loads.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from seekrl.config import load_config
from seekrl.models import save_tiny

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120


def _write_config(path: Path, log_dir: Path) -> Path:
    path.write_text(load_config(None, [
        "model.path=tiny", "model.tiny_hidden=32", "model.max_context=64", "data.train=tiny:copy",
        "rollout.group_size=4", "rollout.batch_size=16", "rollout.max_new_tokens=4", "rollout.max_prompt_tokens=32",
        "reward.functions=[qa_f1]", "train.steps=1", f"log.dir={log_dir}", "log.name=cli", "log.progress=false",
    ]).to_yaml())
    return path


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": "1"}
    # run() kills the process when the timeout passes (e.g. a server that started after all)
    return subprocess.run([sys.executable, "-m", "seekrl", *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model, tiny_tokenizer):
    """The bad inputs on disk, every case run once (two processes at a time); {name: (process, needles)}."""
    tmp = tmp_path_factory.mktemp("cli_errors")
    good = tmp / "good"
    save_tiny(tiny_model, tiny_tokenizer, good)
    folders = {}
    for name in ("not_json", "no_model_type", "truncated", "no_tokenizer"):
        folder = tmp / name
        folder.mkdir()
        for f in good.iterdir():
            (folder / f.name).write_bytes(f.read_bytes())
        folders[name] = folder
    (folders["not_json"] / "config.json").write_text('{"model_type": "llama",')
    (folders["no_model_type"] / "config.json").write_text('{"hidden_size": 64}')
    weights = folders["truncated"] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    for f in folders["no_tokenizer"].glob("tokenizer*"):
        f.unlink()
    runs = tmp / "runs" / "a" / "b"
    config = str(_write_config(tmp / "tiny.yaml", runs))
    bad_utf8 = tmp / "latin1.jsonl"
    bad_utf8.write_bytes(b'{"question": "a", "answer": "x"}\n{"question": "b", "answer": "y"}\n{"question": "caf\xe9", "answer": "z"}\n')
    not_json = tmp / "broken.jsonl"
    not_json.write_text('{"question": "a", "answer": "x"}\n{"question": "b", "answer": }\n')
    dup = tmp / "dup.yaml"
    dup.write_text((tmp / "tiny.yaml").read_text() + "train:\n  seed: 3\n")
    dup_key = tmp / "dup_key.yaml"
    dup_key.write_text("model:\n  path: tiny\ntrain:\n  steps: 5\n  lr: 0.001\n  steps: 6\n")

    cases = {
        "config.json not JSON (config)": (["config", config, f"model.path={folders['not_json']}"],
                                          [f"model.path: {folders['not_json'] / 'config.json'} is not valid JSON"]),
        "config.json without model_type (config)": (["config", config, f"model.path={folders['no_model_type']}"],
                                                    [f"{folders['no_model_type'] / 'config.json'} has no \"model_type\""]),
        "truncated safetensors (train)": (["train", config, f"model.path={folders['truncated']}"],
                                          [f"model.path: {weights} is truncated:", "copy or save it again"]),
        "folder transformers cannot load (train)": (["train", config, f"model.path={folders['no_tokenizer']}"],
                                                    [f"model.path: cannot load '{folders['no_tokenizer']}':"]),
        "truncated safetensors (serve engine)": (["serve", "engine", "--model", str(folders["truncated"]), "--port", "0"],
                                                 [f"{weights} is truncated"]),
        "config.json not JSON (serve policy)": (["serve", "policy", "--model", str(folders["not_json"]), "--port", "0"],
                                                [f"{folders['not_json'] / 'config.json'} is not valid JSON"]),
        "data not UTF-8 (train)": (["train", config, f"data.train={bad_utf8}"],
                                   [f"{bad_utf8}:3: not valid UTF-8 (byte 0xe9 at column 18)", "re-save the file as UTF-8"]),
        "data line not JSON (train)": (["train", config, f"data.train={not_json}"],
                                       [f"{not_json}:2: row is not valid JSON"]),
        "empty slice (config)": (["config", config, "data.train=tiny:copy[5:2]"],
                                 ["data.train: 'tiny:copy[5:2]' selects no rows (tiny:copy has 512 rows)", "tiny:copy[2:5]"]),
        "slice not integers (config)": (["config", config, "data.eval=tiny:copy:test[a:b]"],
                                        ["data.eval: 'tiny:copy:test[a:b]' ends in a slice that is not [start:stop] with integers"]),
        "save_every negative (config)": (["config", config, "train.save_every=-1"], ["train.save_every: must be >= 0"]),
        "log.name leaves log.dir (train)": (["train", config, "log.name=../../.."],
                                            ["log.name: '../../..' would put the run folder outside log.dir"]),
        "seed too large (config)": (["config", config, f"train.seed={10**30}"], ["train.seed: must be in 0..4294967295", str(10**30)]),
        "duplicate section (config)": (["config", str(dup)], [f"{dup}:", "duplicate key 'train'"]),
        "duplicate key (config)": (["config", str(dup_key)], [f"{dup_key}:6: duplicate key 'train.steps' (first at line 4)"]),
    }
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = dict(zip(cases, pool.map(_run, [argv for argv, _ in cases.values()])))
    return {"results": {name: (done[name], needles) for name, (_, needles) in cases.items()}, "tmp": tmp}


CASES = [
    "config.json not JSON (config)", "config.json without model_type (config)", "truncated safetensors (train)",
    "folder transformers cannot load (train)", "truncated safetensors (serve engine)", "config.json not JSON (serve policy)",
    "data not UTF-8 (train)", "data line not JSON (train)", "empty slice (config)", "slice not integers (config)",
    "save_every negative (config)", "log.name leaves log.dir (train)", "seed too large (config)",
    "duplicate section (config)", "duplicate key (config)",
]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_and_exit_2(world, case):
    r, needles = world["results"][case]
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("seekrl: error: "), (r.returncode, r.stderr)
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_cases_cover_every_run(world):
    assert sorted(world["results"]) == sorted(CASES)


def test_log_name_outside_log_dir_wrote_nothing(world):
    tmp = world["tmp"]  # log.dir is tmp/runs/a/b, so log.name=../../.. would have written into tmp
    assert not [p.name for p in tmp.iterdir() if p.name in ("config.yaml", "metrics.jsonl", "checkpoints", "tensorboard")]
