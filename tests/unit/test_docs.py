"""The tables docs/ARCHITECTURE.md and README.md generate from the code are current, and every
module states its public names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import arch_figures  # noqa: E402
import docs_tables  # noqa: E402


def test_generated_tables_are_current():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "docs_tables.py"), "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_every_module_declares_its_public_names():
    import ast

    missing = []
    for name, path in arch_figures.modules(ROOT / "seekrl").items():
        body = ast.parse(path.read_text()).body
        docstring_only = all(isinstance(node, ast.Expr) for node in body)  # a package marker
        if docs_tables.module_all(path) is None and not name.endswith("__main__") and not docstring_only:
            missing.append(name)
    assert not missing, f"these modules declare no __all__: {missing}"


def test_public_names_are_defined():
    """Every name in an `__all__` exists in its module (an import of it would fail otherwise)."""
    import importlib

    for name, path in arch_figures.modules(ROOT / "seekrl").items():
        names = docs_tables.module_all(path) or []
        if not names:
            continue
        module = importlib.import_module(name)
        absent = [n for n in names if not hasattr(module, n)]
        assert not absent, f"{name}.__all__ names what it does not define: {absent}"
