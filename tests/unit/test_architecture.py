"""The architecture holds: the import-linter contract (.importlinter: layers that point one way, no
cycles in any package), no module imports another module's private names, modules stay small,
and `seekrl --help` stays free of torch. scripts/arch_figures.py measures the same things."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import arch_figures  # noqa: E402

MAX_LINES = 600  # a module that grows past this is split


def test_import_linter_contracts_are_kept():
    lint = Path(sys.executable).parent / "lint-imports"
    proc = subprocess.run([str(lint), "--config", str(ROOT / ".importlinter")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_no_cycles_no_private_names_no_upward_imports():
    mods = arch_figures.modules(ROOT / "seekrl")
    edges, private = arch_figures.imports(mods)
    assert arch_figures.cycles(edges) == []
    assert private == [], f"{private[0][0]} imports {private[0][1]}.{private[0][2]}: make it public or keep it in its module"
    assert arch_figures.upward(edges, arch_figures.read_layers(ROOT / ".importlinter", "seekrl")) == []


def test_the_figures_see_what_they_count(tmp_path):
    """The counter finds a cycle, a private import and an upward import in a package that has them."""
    pkg = tmp_path / "seekrl"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "low" / "a.py").write_text("from seekrl.high import thing\n_hidden = 1\n")
    (pkg / "high.py").write_text("from seekrl.low.a import _hidden\nthing = 2\n")
    (tmp_path / "layers.ini").write_text("[c]\ntype = layers\ncontainers = seekrl\nlayers =\n    high\n    low\n")
    mods = arch_figures.modules(pkg)
    edges, private = arch_figures.imports(mods)
    assert arch_figures.cycles(edges) == [["seekrl.high", "seekrl.low.a"]]
    assert private == [("seekrl.high", "seekrl.low.a", "_hidden")]
    assert arch_figures.upward(edges, arch_figures.read_layers(tmp_path / "layers.ini", "seekrl")) == [("seekrl.low.a", "seekrl.high")]


def test_modules_stay_small():
    long = {m: n for m, p in arch_figures.modules(ROOT / "seekrl").items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these modules (over {MAX_LINES} lines): {long}"


def test_help_imports_no_torch():
    probe = ("import sys, io, contextlib\nfrom seekrl.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n    main([])\nprint(sorted(m for m in ('torch', 'transformers', 'fastapi') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout
