"""An HTML report with PNG plots for a run folder: `seekrl report RUN_DIR [--out PATH]`.

    from seekrl.report import write_report, table_html
    path = write_report("runs/demo", sections=[("Before / after", table_html(rows))])

Writes `report.html` (default: in the run folder), its plots as PNG files in a folder named like
the page without `.html` (`report/`), and `trajectories.html` (`<stem>_trajectories.html` for
another page name) with the sample trajectories of the first and the latest
`trajectories/step_<N>.jsonl`, masked segments (inserted tool output) marked apart from the
trained ones. The pages are self-contained: inline CSS, no scripts, no network. A plot whose
metrics the run did not log is skipped.

The report reads top-down: title, one line of context (run folder, steps, trajectories link), the
caller's `sections` (e.g. the before/after table), the plots, the first/last summary, the config,
`eval/eval.json`, then the per-step metrics, collapsed (<details>): one row per logged step, a
column per metric that changes, and the metrics that never change listed once.
"""

from __future__ import annotations

import html
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable, Sequence

from seekrl.observe.loggers import METRICS_FILE, read_metrics

__all__ = ["write_report", "write_trajectories_page", "table_html", "markdown_table_to_html", "segments_html", "NotARunFolder"]

MAX_SAMPLES = 20  # trajectories shown per step file
MASKED_LABEL = "tool output — masked from loss"

CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
.plots img{width:540px;max-width:100%;margin:.3em}code{background:#f3f3f3;padding:0 .2em}
.traj{border:1px solid #ddd;border-radius:4px;margin:1em 0;padding:.5em 1em}.meta{color:#555;font-size:.9em}
.text{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:.85em;background:#fafafa;padding:.5em}
.trained{background:#e8f4e8}.masked{background:#ddd;color:#444;border-left:3px solid #888}
details{margin:1em 0 2em}summary{cursor:pointer;font-weight:600}.wide{overflow-x:auto}
.tag{font-family:system-ui,sans-serif;font-size:.75em;color:#fff;background:#888;padding:0 .3em;margin-right:.3em}"""

# (file stem, title, [(label, metric keys tried in order, "line" or "points")]); keys in the eval
# per-kind pattern are added to the "em" plot. A plot is drawn when any of its series exists.
PLOTS: list[tuple[str, str, list[tuple[str, tuple[str, ...], str]]]] = [
    ("reward", "Reward", [("train reward (mean)", ("reward/mean",), "line"), ("eval reward", ("eval/reward",), "points"),
                          ("eval EM", ("eval/em", "eval/qa_em"), "points")]),
    ("em", "Exact match", [("eval EM", ("eval/em", "eval/qa_em"), "points"), ("train EM (reward part)", ("reward/qa_em",), "line")]),
    ("response_len", "Response length (tokens)", [("train", ("response_len/mean", "rollout/response_len"), "line"),
                                                  ("eval", ("eval/response_len",), "points")]),
    ("searches", "Searches (tool calls) per episode", [("train", ("rollout/tool_calls/search", "rollout/tool_calls"), "line"),
                                                      ("eval", ("eval/tool_calls",), "points")]),
    ("loss", "Loss", [("policy loss", ("loss/policy",), "line"), ("value loss", ("loss/value",), "line"),
                      ("SFT loss", ("loss",), "line"), ("eval loss", ("eval/loss",), "points")]),
    ("kl", "KL / entropy", [("KL", ("kl",), "line"), ("entropy", ("entropy", "actor/entropy"), "line")]),
]
# every eval logs eval/tool_calls (0 without tools): draw searches only for runs that used tools in training
NEEDS_TRAIN = {"searches": "rollout/tool_calls"}
KIND_EM = re.compile(r"^eval/([^/]+)/em$")  # per-kind eval EM, e.g. eval/2hop/em
TRAIN_EM = re.compile(r"^reward/[^/]+/em$")  # the EM part of a composite reward, e.g. reward/search_r1/em
# training metrics in the first/last table (the first key of each tuple that exists), then every eval/* key
SUMMARY_KEYS = (("reward/mean",), ("reward/qa_em",), ("response_len/mean", "rollout/response_len"),
                ("rollout/tool_calls/search", "rollout/tool_calls"), ("loss/policy", "loss"), ("kl",))


class NotARunFolder(FileNotFoundError):
    """The folder has no metrics.jsonl (the CLI reports it in one line, exit status 2)."""


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _is_num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def table_html(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
    """An HTML table of `rows` (dicts); `columns` defaults to the keys in first-seen order. Escaped."""
    columns = list(columns) if columns is not None else list(dict.fromkeys(k for r in rows for k in r))
    head = "".join(f"<th>{_esc(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(
            f'<td class="num">{_fmt(r.get(c))}</td>' if _is_num(r.get(c)) else f"<td>{_esc(_fmt(r.get(c)))}</td>" for c in columns
        ) + "</tr>\n"
        for r in rows
    )
    return f"<table><tr>{head}</tr>\n{body}</table>"


def markdown_table_to_html(md: str) -> str:
    """A GitHub-style markdown table (`| a | b |` lines, a `|---|` separator) as escaped HTML;
    `code` spans become <code>."""
    lines = [ln.strip() for ln in md.strip().splitlines() if ln.strip().startswith("|")]
    cells = [[c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", ln.strip("|"))] for ln in lines]
    cells = [row for row in cells if not all(re.fullmatch(r":?-+:?", c) for c in row)]
    if not cells:
        return ""

    def cell(text: str, tag: str) -> str:
        return f"<{tag}>" + re.sub(r"`([^`]+)`", r"<code>\1</code>", _esc(text)) + f"</{tag}>"

    out = ["<tr>" + "".join(cell(c, "th") for c in cells[0]) + "</tr>"]
    out += ["<tr>" + "".join(cell(c, "td") for c in row) + "</tr>" for row in cells[1:]]
    return "<table>" + "\n".join(out) + "</table>"


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], float(r[key])) for r in rows if _is_num(r.get(key)) and r.get("step") is not None]
    return [s for s, _ in pts], [v for _, v in pts]


def _matplotlib():
    """Import matplotlib with the Agg backend and a writable config/cache folder."""
    if "MPLCONFIGDIR" not in os.environ:
        home = Path.home()
        cfg = Path(os.environ.get("XDG_CONFIG_HOME", home / ".config"))
        cache = Path(os.environ.get("XDG_CACHE_HOME", home / ".cache"))
        if not all(os.access(d if d.exists() else home, os.W_OK) for d in (cfg, cache)):
            os.environ["MPLCONFIGDIR"] = tempfile.mkdtemp(prefix="seekrl-mpl-")
    import matplotlib

    if "matplotlib.pyplot" not in sys.modules:  # leave an interactive session's backend alone
        matplotlib.use("Agg")
    from matplotlib.figure import Figure  # no pyplot: no global figure state

    return Figure


def _plot_specs(rows: list[dict]) -> list[tuple[str, str, list[tuple[str, str, str]]]]:
    """The plots this run's metrics can fill: (stem, title, [(label, key, style)])."""
    keys = set().union(*rows) if rows else set()
    specs = []
    for stem, title, series in PLOTS:
        chosen = [(label, next(k for k in cand if k in keys), style) for label, cand, style in series if any(k in keys for k in cand)]
        if stem == "em":
            chosen += [(f"eval EM: {KIND_EM.match(k).group(1)}", k, "points") for k in sorted(keys) if KIND_EM.match(k)]
            if not any(k == "reward/qa_em" for _, k, _ in chosen):
                chosen += [("train EM (reward part)", k, "line") for k in sorted(keys) if TRAIN_EM.match(k)][:1]
        chosen = [c for c in chosen if _series(rows, c[1])[0]]
        if chosen and (stem not in NEEDS_TRAIN or any(k.startswith(NEEDS_TRAIN[stem]) for _, k, _ in chosen)):
            specs.append((stem, title, chosen))
    return specs


def _write_plots(rows: list[dict], folder: Path) -> list[tuple[str, Path]]:
    folder.mkdir(parents=True, exist_ok=True)
    for stem, _, _ in PLOTS:  # a re-run must not keep a plot whose metrics are gone
        (folder / f"{stem}.png").unlink(missing_ok=True)
    specs = _plot_specs(rows)
    if not specs:
        return []
    Figure = _matplotlib()
    from matplotlib.ticker import MaxNLocator
    written = []
    for stem, title, series in specs:
        fig = Figure(figsize=(5.4, 3.2), dpi=100)
        ax = fig.add_subplot()
        for label, key, style in series:
            x, y = _series(rows, key)
            if style == "line" and len(x) > 1:
                ax.plot(x, y, label=f"{label} [{key}]", linewidth=1.3)
            else:
                ax.plot(x, y, "o--", label=f"{label} [{key}]", markersize=4, linewidth=0.8)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step", fontsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = folder / f"{stem}.png"
        fig.savefig(path)
        written.append((title, path))
    return written


def _summary_rows(rows: list[dict]) -> list[dict]:
    keys = set().union(*rows) if rows else set()
    chosen = [next(k for k in cand if k in keys) for cand in SUMMARY_KEYS if any(k in keys for k in cand)]
    chosen += sorted(k for k in keys if k.startswith("eval/"))
    out = []
    for key in chosen:
        x, y = _series(rows, key)
        if x:
            out.append({"metric": key, "first": y[0], "first step": x[0], "last": y[-1], "last step": x[-1], "change": y[-1] - y[0]})
    return out


def _per_step(rows: list[dict]) -> tuple[list[dict], list[dict], list[str]]:
    """(constant metrics [{metric, value (every step), logged at}], one merged row per step, the
    columns that vary). Rows of the same step (a train row and an eval row) are merged. A metric is
    constant when it has one value at every step where it was logged (and, in a run of more than
    one step, was logged at more than one)."""
    by_step: dict[Any, dict] = {}
    for r in rows:
        if r.get("step") is not None:
            by_step.setdefault(r["step"], {}).update(r)
    steps = [by_step[s] for s in sorted(by_step, key=lambda s: (not _is_num(s), s if _is_num(s) else str(s)))]
    keys = list(dict.fromkeys(k for r in steps for k in r if k != "step"))
    constant, varying = [], []
    for key in keys:
        values = [r[key] for r in steps if key in r]
        distinct = {json.dumps(v, sort_keys=True, default=str) for v in values}
        if len(distinct) == 1 and (len(values) > 1 or len(steps) == 1):
            constant.append({"metric": key, "value (every step)": values[0], "logged at": f"{len(values)} of {len(steps)} steps"})
        else:
            varying.append(key)
    return constant, steps, varying


def _per_step_html(rows: list[dict]) -> str:
    constant, steps, varying = _per_step(rows)
    if not steps:
        return ""
    summary = (f"Per-step metrics: {len(steps)} step{'s' * (len(steps) != 1)}, {len(varying)} metrics that change, "
               f"{len(constant)} that do not")
    parts = [f"<details><summary>{_esc(summary)}</summary>"]
    if constant:
        parts += ["<h3>Same value at every step where logged</h3>", table_html(constant)]
    if varying:
        parts += ["<h3>One row per step</h3>", '<div class="wide">', table_html(steps, ["step", *varying]), "</div>"]
    parts.append("</details>")
    return "\n".join(parts)


def _config_summary(run_dir: Path) -> list[dict]:
    import yaml

    path = run_dir / "config.yaml"
    cfg = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
    get = lambda section, key: (cfg.get(section) or {}).get(key) if isinstance(cfg.get(section), dict) else None  # noqa: E731
    return [{"setting": f"{s}.{k}", "value": get(s, k)}
            for s, k in (("model", "path"), ("algo", "name"), ("data", "train"), ("data", "eval"), ("tools", "format"), ("train", "steps"))
            if get(s, k) is not None]


def _page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}</title>'
            f"<style>{CSS}</style></head><body>\n{body}\n</body></html>\n")


def _step_files(run_dir: Path) -> list[Path]:
    numbered = [(re.fullmatch(r"step_(\d+)\.jsonl", p.name), p) for p in (run_dir / "trajectories").glob("step_*.jsonl")]
    files = [p for _, p in sorted((int(m.group(1)), p) for m, p in numbered if m)]
    return list(dict.fromkeys(files[:1] + files[-1:]))  # the first and the latest


def _records(path: Path, limit: int) -> list[dict]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a half-written last line
        if isinstance(rec, dict):
            out.append(rec)
        if len(out) >= limit:
            break
    return out


def segments_html(segments: Iterable[dict]) -> str:
    """The completion's segments as spans: `masked` ones (inserted tool output) labelled apart."""
    parts = []
    for seg in segments:
        text = _esc(seg.get("text", ""))
        if seg.get("masked"):
            parts.append(f'<span class="masked" title="{MASKED_LABEL}"><span class="tag">{MASKED_LABEL}</span>{text}</span>')
        else:
            parts.append(f'<span class="trained">{text}</span>')
    return "".join(parts)


def _trajectory_html(rec: dict) -> str:
    segments = rec.get("segments") or [{"text": rec.get("completion", ""), "masked": False}]
    parts = ", ".join(f"{_esc(k)} {_fmt(v)}" for k, v in (rec.get("reward_parts") or {}).items())
    meta = (f"task <code>{_esc(rec.get('task_id'))}</code> ({_esc(rec.get('source'))}), group {_esc(rec.get('group'))} "
            f"sample {_esc(rec.get('sample'))} · reward <b>{_esc(_fmt(rec.get('reward')))}</b> ({parts}) · "
            f"finish <code>{_esc(rec.get('finish_reason'))}</code> · answer <code>{_esc(rec.get('answer'))}</code>")
    return (f'<div class="traj"><div class="meta">{meta}</div><h4>Prompt</h4><div class="text">{_esc(rec.get("prompt", ""))}</div>'
            f'<h4>Completion</h4><div class="text">{segments_html(segments)}</div></div>')


def write_trajectories_page(run_dir: str | os.PathLike, out: str | os.PathLike, *, limit: int = MAX_SAMPLES) -> Path:
    """Write the trajectories page for `run_dir` to `out` (see the module docstring)."""
    run_dir, out = Path(run_dir), Path(out)
    body = [f"<h1>Trajectories: {_esc(run_dir.resolve().name)}</h1>",
            '<p>Completion text: <span class="trained">sampled by the policy (trained)</span> · '
            f'<span class="masked"><span class="tag">{MASKED_LABEL}</span>inserted text, excluded from the loss</span></p>']
    files = _step_files(run_dir)
    if not files:
        body.append("<p>No <code>trajectories/step_N.jsonl</code> files in this run folder.</p>")
    for path in files:
        recs = _records(path, limit)
        body.append(f"<h2>{_esc(path.stem)} ({len(recs)} shown, at most {limit})</h2>")
        body += [_trajectory_html(r) for r in recs]
    out.write_text(_page(f"{run_dir.name} trajectories", "\n".join(body)), encoding="utf-8")
    return out


def write_report(
    run_dir: str | os.PathLike,
    out: str | os.PathLike | None = None,
    *,
    title: str | None = None,
    sections: Sequence[tuple[str, str]] = (),
) -> Path:
    """Write the HTML report of `run_dir` (default `run_dir/report.html`) and return its path.

    `sections` are (heading, HTML fragment) pairs placed right after the one-line run summary,
    before the plots, e.g. `("Before / after", table_html(rows))`; fragments are inserted as given
    (escape your text).
    Raises NotARunFolder when `run_dir` has no metrics.jsonl.
    """
    run_dir = Path(run_dir)
    if not (run_dir / METRICS_FILE).is_file():
        what = "does not exist" if not run_dir.exists() else f"has no {METRICS_FILE}"
        raise NotARunFolder(f"{run_dir} {what}, so it is not a run folder; pass the folder that "
                            "`seekrl train` or `seekrl sft` wrote (runs/<log.name>)")
    out = Path(out) if out is not None else run_dir / "report.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = read_metrics(run_dir)
    name = run_dir.resolve().name
    traj_page = out.parent / ("trajectories.html" if out.stem == "report" else f"{out.stem}_trajectories.html")
    write_trajectories_page(run_dir, traj_page)

    steps = [r["step"] for r in rows if r.get("step") is not None]
    body = [f"<h1>{_esc(title or f'Run report: {name}')}</h1>",
            f"<p>Run folder <code>{_esc(run_dir.resolve())}</code> · {len(rows)} logged rows, steps "
            f"{_fmt(min(steps)) if steps else '–'} to {_fmt(max(steps)) if steps else '–'} · "
            f'<a href="{_esc(traj_page.name)}">sample trajectories</a></p>']
    for heading, fragment in sections:  # the caller's results (a before/after table) come first
        body += [f"<h2>{_esc(heading)}</h2>", fragment]
    plots = _write_plots(rows, out.with_suffix("") if out.suffix else out.with_name(out.name + "_plots"))
    if plots:
        rel = lambda p: p.relative_to(out.parent).as_posix()  # noqa: E731
        body += ["<h2>Plots</h2>", '<div class="plots">']
        body += [f'<img src="{_esc(rel(p))}" alt="{_esc(t)}" title="{_esc(t)}">' for t, p in plots]
        body.append("</div>")
    summary = _summary_rows(rows)
    body += ["<h2>Metrics: first and last</h2>",
             table_html(summary) if summary else "<p>No numeric metrics logged yet.</p>"]
    config = _config_summary(run_dir)
    if config:
        body += ["<h2>Config</h2>", table_html(config)]
    eval_json = run_dir / "eval" / "eval.json"
    data = json.loads(eval_json.read_text()) if eval_json.is_file() else None
    if isinstance(data, dict):
        body += ["<h2>Evaluation (<code>eval/eval.json</code>)</h2>", table_html([{"metric": k, "value": v} for k, v in data.items()])]
    per_step = _per_step_html(rows)
    if per_step:
        body += ["<h2>Per-step metrics</h2>", per_step]
    out.write_text(_page(title or f"{name} report", "\n".join(body)), encoding="utf-8")
    return out
