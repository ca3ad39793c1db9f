"""`seekrl cache list | prune`: the dequantized-GGUF cache keeps only what a load reads.

Every checkout of an older seekrl added a 0.5 GB entry (the key held the file's path), and an
entry of another transformers version is never read again; prune deletes those and keeps the
entry a load of the kept GGUF files reads, and a temp folder a load may be writing now.
"""

from __future__ import annotations

import os
import time

from seekrl.cli import main
from seekrl.gguf_cache import _gguf_key, cache_entries


def _entry(root, name: str, size: int, *, config: bool = True, age_s: float = 0.0):
    d = root / name
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"x" * size)
    if config:
        (d / "config.json").write_text("{}")
    if age_s:
        t = time.time() - age_s
        os.utime(d, (t, t))
    return d


def test_cache_list_and_prune_keep_only_what_a_load_reads(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SEEKRL_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "models" / "m.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF not really weights")
    root = tmp_path / "cache" / "gguf"
    current = f"m-{_gguf_key(gguf)}"  # what load_gguf(gguf) reads under this transformers version
    _entry(root, current, 3000)
    _entry(root, "m-0123456789ab", 2000)  # another transformers version, or an old path-keyed entry
    _entry(root, "SmolLM2-135M-Instruct.Q4_1-aaaaaaaaaaaa", 1000)  # a GGUF file not kept
    _entry(root, ".tmp-crashed", 500, config=False, age_s=7200)  # a load that died mid-write
    _entry(root, ".tmp-writing", 400, config=False)  # a load writing its entry now
    _entry(root, f"{current}-half", 100, config=False)

    got = {e.path.name: (e.bytes, e.current) for e in cache_entries([gguf])}
    assert got == {current: (3002, True), "m-0123456789ab": (2002, False), "SmolLM2-135M-Instruct.Q4_1-aaaaaaaaaaaa": (1002, False),
                   ".tmp-crashed": (500, False), ".tmp-writing": (400, False), f"{current}-half": (100, False)}

    assert main(["cache", "list", "--keep", str(gguf)]) == 0
    out = capsys.readouterr().out
    assert f"current  {root / current}\n" in out and f"unused   {root / 'm-0123456789ab'}\n" in out
    assert out.rstrip().endswith("in 6 folders, 0.0 MB unused (seekrl cache prune)")

    before = sorted(os.listdir(root))
    assert main(["cache", "prune", "--keep", str(gguf), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("would delete") == 4 and ".tmp-writing" not in out and f"{root / current}\n" not in out
    assert sorted(os.listdir(root)) == before  # a dry run deletes nothing

    assert main(["cache", "prune", "--keep", str(gguf)]) == 0
    assert capsys.readouterr().out.rstrip().endswith("(4 folders)")
    assert sorted(os.listdir(root)) == [".tmp-writing", current]
    assert main(["cache", "prune", "--keep", str(gguf), "--all"]) == 0
    assert sorted(os.listdir(root)) == [".tmp-writing"]


def test_cache_keep_names_a_missing_file_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SEEKRL_CACHE", str(tmp_path / "cache"))
    assert main(["cache", "prune", "--keep", str(tmp_path / "gone.gguf")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"seekrl: error: --keep: no such GGUF file: {tmp_path / 'gone.gguf'}"
    assert cache_entries([]) == []  # no cache folder: nothing listed, nothing created
    assert not (tmp_path / "cache").exists()
