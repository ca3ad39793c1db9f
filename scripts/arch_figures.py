"""Architecture figures of the seekrl package: import cycles, imports that point up the layers,
private names imported across modules, the largest module, the widest function, `seekrl --help` time.

    python scripts/arch_figures.py [--root DIR] [--layers .importlinter] [--json]

Every import counts, as import-linter counts them: module level, inside functions and under
`if TYPE_CHECKING:`. "Up" is judged against the layers of the import-linter contract (the file
given by --layers, read from its `layers =` list), so the figure before a change can be measured
against the contract after it. docs/ARCHITECTURE.md reports these figures.
"""

from __future__ import annotations

import argparse
import ast
import configparser
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def modules(pkg_dir: Path) -> dict[str, Path]:
    out = {}
    for path in sorted(pkg_dir.rglob("*.py")):
        name = ".".join(path.relative_to(pkg_dir.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def imports(mods: dict[str, Path]) -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """Module -> the package modules it imports; and (importer, module, name) for private names."""

    def resolve(name: str) -> str:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    edges: dict[str, set[str]] = {m: set() for m in mods}
    private = []
    root = next(iter(mods)).split(".")[0]
    for m, path in mods.items():
        package = m if path.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
                names: list[tuple[str, str]] = []
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package
                    for _ in range(node.level - 1):
                        up = up.rpartition(".")[0]
                    base = up + ("." + node.module if node.module else "")
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
                names = [(base, a.name) for a in node.names if f"{base}.{a.name}" not in mods]
            else:
                continue
            for t in targets:
                if t.split(".")[0] == root and (r := resolve(t)) and r != m:
                    edges[m].add(r)
            for base, name in names:
                if base.split(".")[0] == root and name.startswith("_") and not name.startswith("__"):
                    private.append((m, base, name))
    return edges, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    counter = 0
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def read_layers(path: Path, root: str) -> list[list[str]]:
    """The `layers` of the first layers contract in an import-linter INI file, top first."""
    cp = configparser.ConfigParser()
    cp.read(path)
    for section in cp.sections():
        if cp[section].get("type") == "layers":
            container = cp[section].get("containers", root).strip()
            rows = [line.strip() for line in cp[section]["layers"].splitlines() if line.strip()]
            return [[f"{container}.{x.strip()}" for x in row.replace(":", "|").split("|")] for row in rows]
    raise SystemExit(f"{path}: no layers contract")


def upward(edges: dict[str, set[str]], layers: list[list[str]]) -> list[tuple[str, str]]:
    """Imports from a module to one of a higher layer (layers top first; unlisted modules are skipped)."""

    def level(m: str) -> int | None:
        for i, row in enumerate(layers):
            if any(m == x or m.startswith(x + ".") for x in row):
                return len(layers) - i  # higher number = higher layer
        return None

    out = []
    for m, targets in edges.items():
        for t in targets:
            lm, lt = level(m), level(t)
            if lm is not None and lt is not None and lt > lm:
                out.append((m, t))
    return sorted(out)


def widest_function(mods: dict[str, Path]) -> tuple[int, str]:
    best = (0, "")
    for m, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params = [p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs] if p.arg not in ("self", "cls")]
                params += [p.arg for p in (a.vararg, a.kwarg) if p is not None]
                if len(params) > best[0]:
                    best = (len(params), f"{m}.{node.name}")
    return best


def help_seconds(python: str, repeats: int = 5) -> tuple[float, bool]:
    """Median wall time of `python -m seekrl --help`, and whether it imported torch."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([python, "-m", "seekrl", "--help"], check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    probe = ("import sys, io, contextlib\nfrom seekrl.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n    main([])\nprint('torch' in sys.modules)")
    torch = subprocess.run([python, "-c", probe], check=True, capture_output=True, text=True).stdout.strip() == "True"
    return statistics.median(times), torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=".", help="repository root (holds seekrl/)")
    p.add_argument("--layers", default=None, help="import-linter file with the layers contract (default: ROOT/.importlinter)")
    p.add_argument("--python", default=sys.executable, help="interpreter that runs `-m seekrl --help` (with ROOT importable)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    root = Path(args.root).resolve()
    mods = modules(root / "seekrl")
    edges, private = imports(mods)
    layers_file = Path(args.layers) if args.layers else root / ".importlinter"
    up = upward(edges, read_layers(layers_file, "seekrl")) if layers_file.is_file() else []
    largest = max(mods.items(), key=lambda kv: len(kv[1].read_text(encoding="utf-8").splitlines()))
    width, widest = widest_function(mods)
    env = {**os.environ, "PYTHONPATH": str(root)}
    os.environ.update(env)
    help_s, torch = help_seconds(args.python)
    figures = {
        "modules": len(mods), "imports": sum(len(v) for v in edges.values()),
        "cycles": len(cycles(edges)), "cycle_modules": cycles(edges),
        "imports_up": len(up), "imports_up_list": [f"{a} -> {b}" for a, b in up],
        "private_imports": len(private), "private_list": [f"{m} <- {b}.{n}" for m, b, n in private],
        "private_importers": len({m for m, _, _ in private}),
        "largest_module": f"{largest[0]} ({len(largest[1].read_text(encoding='utf-8').splitlines())} lines)",
        "widest_function": f"{widest} ({width} parameters)",
        "help_s": round(help_s, 3), "help_imports_torch": torch,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for k, v in figures.items():
        if isinstance(v, list):
            for x in v:
                print(f"  {x}")
        else:
            print(f"{k}: {v}")


if __name__ == "__main__":
    main()
