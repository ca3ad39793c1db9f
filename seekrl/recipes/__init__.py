"""Recipes: whole jobs on real models and data, one command each (`seekrl demo --recipe NAME`).

    seekrl demo --recipe hotpotqa_smollm2 --out runs/hotpotqa   # make demo-hotpotqa

A recipe runs its stages with the same code as the stand-alone commands, prints each stage's
command, and resumes: a stage whose output is complete is skipped on a rerun.
"""

from __future__ import annotations

__all__ = ["RECIPES", "run_recipe"]

# name -> (module, one-line description); the module has `run(out, config, overrides)` and DEFAULT_CONFIG
RECIPES: dict[str, tuple[str, str]] = {
    "hotpotqa_smollm2": ("seekrl.recipes.hotpotqa",
                         "SmolLM2-135M-Instruct learns to search HotpotQA (BM25 over 14,903 paragraphs): "
                         "teacher SFT -> eval -> 3 x 48 GRPO steps at once, each on a vLLM CPU server -> eval -> report, about 2-2.7 h on a 2-core CPU with avx512_bf16"),
}


def run_recipe(name: str, out: str | None = None, config: str | None = None, overrides=()) -> dict:
    """Run the recipe `name` into `out` (default runs/<name>); returns its results."""
    import importlib

    if name not in RECIPES:
        from seekrl.config import ConfigError

        raise ConfigError(f"unknown recipe '{name}'; recipes: {', '.join(RECIPES)} (seekrl demo --help)")
    module = importlib.import_module(RECIPES[name][0])
    return module.run(out or f"runs/{name}", config, list(overrides))
