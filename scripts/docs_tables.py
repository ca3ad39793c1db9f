"""The tables of docs/ARCHITECTURE.md and README.md that describe the code, generated from it.

    python scripts/docs_tables.py            # rewrite the generated blocks
    python scripts/docs_tables.py --check    # exit 1 naming each block that is stale (the tests run this)

A generated block sits between `<!-- generated: NAME -->` and `<!-- end: NAME -->`:

- `public-names`: every module's `__all__` (read from the source, nothing imported), by layer
  of the import-linter contract (.importlinter);
- `cli`: every command of `seekrl` with its arguments (seekrl/cli.py `parser()`);
- `config-sections`: each config section, the module that declares it, and its keys;
- `config-reference`: every key with its default and meaning (README.md; `seekrl config --reference`);
- `metrics`: every metric a run logs (seekrl/observe/metrics.py `METRICS`).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import arch_figures  # noqa: E402

DOCS = {"public-names": "docs/ARCHITECTURE.md", "cli": "docs/ARCHITECTURE.md", "config-sections": "docs/ARCHITECTURE.md",
        "metrics": "docs/ARCHITECTURE.md", "config-reference": "README.md"}


def module_all(path: Path) -> list[str] | None:
    """A module's `__all__`, read from its source (None: it declares none)."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return None


def public_names() -> str:
    mods = arch_figures.modules(ROOT / "seekrl")
    layers = arch_figures.read_layers(ROOT / ".importlinter", "seekrl")
    lines = ["| layer | module | public names (`__all__`) |", "|---|---|---|"]
    for i, row in enumerate(layers):
        label = " \\| ".join(m.removeprefix("seekrl.") for m in row)
        for name in sorted(m for m in mods if any(m == x or m.startswith(x + ".") for x in row)):
            names = module_all(mods[name])
            if names:
                lines.append(f"| {i + 1}. {label} | `{name}` | {', '.join(f'`{n}`' for n in names)} |")
    return "\n".join(lines)


def cli_table() -> str:
    from seekrl.cli import parser

    lines = ["| command | arguments | what it does |", "|---|---|---|"]
    for name, sub, help_text in _commands(parser(), "seekrl"):
        lines.append(_leaf(sub, name, help_text))
    return "\n".join(lines)


def _commands(p: argparse.ArgumentParser, prefix: str):
    """(name, parser, help) of every command that takes no further subcommand, in the parser's order."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {ch.dest: ch.help or "" for ch in action._choices_actions}
            for choice, sub in action.choices.items():
                if any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
                    yield from _commands(sub, f"{prefix} {choice}")
                else:
                    yield f"{prefix} {choice}", sub, helps.get(choice, "")


def _leaf(p: argparse.ArgumentParser, name: str, help_text: str) -> str:
    args = []
    for a in p._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        if not a.option_strings:
            d = a.dest.upper()
            args.append({"*": f"[{d} ...]", "?": f"[{d}]", "+": f"{d} [{d} ...]"}.get(a.nargs, d))
        else:
            flag = a.option_strings[-1]
            value = "" if a.nargs == 0 else " " + ("\\|".join(map(str, a.choices)) if a.choices else a.metavar or a.dest.upper())
            args.append(f"{flag}{value}" if a.required else f"[{flag}{value}]")
    text = help_text.replace("%%", "%")  # argparse's escape
    return f"| `{name}` | `{' '.join(args)}` | {text.replace('|', chr(92) + '|')} |"


def config_sections() -> str:
    from seekrl.config import SECTIONS
    from seekrl.schema import field_docs

    lines = ["| section | declared in | keys |", "|---|---|---|"]
    for name, cls in SECTIONS.items():
        module = inspect.getmodule(cls).__name__
        keys = ", ".join(f"`{k}`" for k in field_docs(cls))
        lines.append(f"| `{name}` | `{module}.{cls.__name__}` | {keys} |")
    return "\n".join(lines)


def config_reference() -> str:
    from seekrl.config import reference_markdown

    return reference_markdown()


def metrics_table() -> str:
    from seekrl.observe.metrics import METRICS

    lines = ["| metric | written by | meaning |", "|---|---|---|"]
    for name, (who, meaning) in METRICS.items():
        lines.append(f"| `{name}` | {who} | {meaning.replace('|', chr(92) + '|')} |")
    return "\n".join(lines)


TABLES = {"public-names": public_names, "cli": cli_table, "config-sections": config_sections, "config-reference": config_reference,
          "metrics": metrics_table}


def block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- generated: {name} -->\n)(.*?)(<!-- end: {name} -->)", re.S)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 when a generated block differs from the code")
    args = p.parse_args()
    stale = []
    texts: dict[str, str] = {}
    for name, doc in DOCS.items():
        path = ROOT / doc
        text = texts.get(doc, path.read_text(encoding="utf-8"))
        pattern = block(name)
        m = pattern.search(text)
        if m is None:
            print(f"{doc}: no <!-- generated: {name} --> block", file=sys.stderr)
            return 1
        fresh = TABLES[name]() + "\n"
        if m.group(2) != fresh:
            stale.append(f"{doc}: {name}")
            text = text[: m.start(2)] + fresh + text[m.end(2):]
        texts[doc] = text
    if args.check:
        if stale:
            print("stale generated blocks (run python scripts/docs_tables.py): " + "; ".join(stale), file=sys.stderr)
            return 1
        return 0
    for doc, text in texts.items():
        (ROOT / doc).write_text(text, encoding="utf-8")
    print("updated: " + ("; ".join(stale) if stale else "nothing (all current)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
