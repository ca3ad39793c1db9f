"""`seekrl report`: an HTML page with PNG plots for a real tiny run and for a search-style run
folder (synthetic metrics with per-kind EM and tool calls, trajectories with masked tool output)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from html.parser import HTMLParser

import pytest

from seekrl.cli import main
from seekrl.observe.loggers import read_metrics
from seekrl.report import markdown_table_to_html, table_html, write_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _pngs(page):
    """The plots `page` references, checked to be real PNG files next to it."""
    srcs = re.findall(r'<img src="([^"]+)"', page.read_text())
    names = []
    for src in srcs:
        path = page.parent / src
        data = path.read_bytes()
        assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", src
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert width > 100 and height > 100 and len(data) > 1000, (src, width, height, len(data))
        names.append(path.name)
    return names


class _Spans(HTMLParser):
    """Text inside span.masked (minus its label) and inside span.trained."""

    def __init__(self):
        super().__init__()
        self.stack, self.masked, self.trained = [], [], []

    def handle_starttag(self, tag, attrs):
        self.stack.append(dict(attrs).get("class", "") if tag == "span" else "")

    def handle_endtag(self, tag):
        self.stack.pop()

    def handle_data(self, data):
        if "tag" in self.stack:
            return
        if "masked" in self.stack:
            self.masked.append(data)
        elif "trained" in self.stack:
            self.trained.append(data)


def _search_run(run_dir, with_search=True):
    """A run folder shaped like a search GRPO run: eval EM per question kind, tool calls, no KL."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text("model:\n  path: tiny\nalgo:\n  name: grpo\ndata:\n  train: synthetic:qa\ntrain:\n  steps: 4\n")
    rows = [{"step": 0, "eval/reward": 0.1, "eval/em": 0.1, "eval/1hop/em": 0.2, "eval/2hop/em": 0.0, "eval/comparison/em": 0.1}]
    for s in range(1, 5):
        row = {"step": s, "reward/mean": 0.1 * s, "rollout/response_len": 40.0 + s, "loss/policy": 0.5 / s, "entropy": None}
        if with_search:
            row |= {"rollout/tool_calls/search": 0.5 * s, "rollout/tool_calls": 0.5 * s}
        rows.append(row)
    rows[-1] |= {"eval/reward": 0.6, "eval/em": 0.5, "eval/1hop/em": 0.7, "eval/2hop/em": 0.4, "eval/comparison/em": 0.4}
    if with_search:
        rows[-1]["eval/tool_calls"] = 1.5
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 5, "rew')  # torn last line
    traj = run_dir / "trajectories"
    traj.mkdir(exist_ok=True)
    segments = [
        {"text": "<search> alba </search>", "masked": False},
        {"text": "\n<information>Doc 1 the code of alba is 42 & more</information>\n", "masked": True},
        {"text": "<answer> 42 </answer>", "masked": False},
    ]
    rec = {"task_id": "alba", "source": "synthetic", "group": 0, "sample": 0, "reward": 1.0, "reward_parts": {"qa_em": 1.0},
           "finish_reason": "answer", "metrics": {"tool_calls": 1.0}, "answer": "['42']", "prompt": "Question: <b>code</b> of alba?",
           "completion": "".join(s["text"] for s in segments), "segments": segments}
    for step, count in ((1, 3), (2, 3), (4, 30)):
        (traj / f"step_{step}.jsonl").write_text("".join(json.dumps(rec | {"step": step, "sample": i}) + "\n" for i in range(count)))
    (run_dir / "eval").mkdir(exist_ok=True)
    (run_dir / "eval" / "eval.json").write_text(json.dumps({"eval/em": 0.55, "eval/answer_rate": 0.9}))
    return run_dir


def test_search_run_report_plots_trajectories_and_sections(tmp_path):
    run = _search_run(tmp_path / "search")
    md = "| model | EM before | EM after |\n|---|---|---|\n| `tiny` | 0.10 | 0.50 |"
    page = write_report(run, sections=[("Before / after", markdown_table_to_html(md))])
    assert page == run / "report.html"
    html = page.read_text()
    # plots for the logged metrics, none for the absent KL; plots live in report/ next to the page
    assert sorted(_pngs(page)) == ["em.png", "loss.png", "response_len.png", "reward.png", "searches.png"]
    assert sorted(p.name for p in (run / "report").iterdir()) == sorted(_pngs(page))
    assert 'src="report/em.png"' in html and "kl.png" not in html
    # config summary, the caller's section before the metrics table, first/last values, eval.json
    assert "<td>synthetic:qa</td>" in html and "<td>grpo</td>" in html
    assert html.index("Before / after") < html.index("Metrics: first and last")
    # reading order: title, context line, the caller's section, plots, summary, config, eval, per-step
    order = ["<h1>", 'href="trajectories.html"', "<h2>Before / after</h2>", "<h2>Plots</h2>", 'src="report/em.png"',
             "<h2>Metrics: first and last</h2>", "<h2>Config</h2>", "<h2>Evaluation", "<h2>Per-step metrics</h2>"]
    assert [html.index(s) for s in order] == sorted(html.index(s) for s in order)
    assert "<details><summary>" in html and "<details open" not in html
    assert "<th>EM after</th>" in html and "<td><code>tiny</code></td>" in html
    row = re.search(r"<tr><td>rollout/tool_calls/search</td>(.*?)</tr>", html).group(1)
    assert re.findall(r">([^<]+)</td>", row) == ["0.5", "1", "2", "4", "1.5"]  # first, step, last, step, change
    assert "<td>eval/2hop/em</td>" in html and "<td>eval/answer_rate</td>" in html
    assert "<script" not in html and "http" not in html.replace("http-equiv", "")
    # the trajectories page: first and latest step files only, capped at 20 each
    assert 'href="trajectories.html"' in html
    traj = (run / "trajectories.html").read_text()
    assert "step_1" in traj and "step_4" in traj and "step_2" not in traj
    assert traj.count('<div class="traj">') == 3 + 20
    spans = _Spans()
    spans.feed(traj)
    masked, trained = "".join(spans.masked), "".join(spans.trained)
    assert "<information>Doc 1 the code of alba is 42 & more</information>" in masked
    assert "<search> alba </search>" in trained and "<answer> 42 </answer>" in trained
    assert "information" not in trained and "<answer>" not in masked
    # escaped in the markup, never raw
    assert "&lt;information&gt;Doc 1 the code of alba is 42 &amp; more&lt;/information&gt;" in traj
    assert "<information>" not in traj and "<b>code</b>" not in traj and "&lt;b&gt;code&lt;/b&gt;" in traj
    assert traj.count("tool output — masked from loss") >= 23

    # a re-run for a run without tool calls drops the stale searches plot
    _search_run(run, with_search=False)
    write_report(run)
    assert "searches.png" not in _pngs(page) and not (run / "report" / "searches.png").exists()


def test_per_step_metrics_collapsed_with_constants_listed_once(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": 0, "eval/em": 0.1, "eval/answer_rate": 1.0}]
    for s in (1, 2, 3):
        rows.append({"step": s, "reward/mean": 0.2 * s, "lr": 1e-6, "algo": "grpo", "kl": 0.01 * s, "entropy": 1.5 - 0.1 * s})
    rows.append({"step": 3, "eval/em": 0.4, "eval/answer_rate": 1.0})  # an eval row at a train step: merged
    rows.append({"step": 3, "eval/once": 0.3})  # logged at one step only: a column, not "every step"
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = write_report(run)
    html = page.read_text()
    assert "kl.png" in _pngs(page) and 'alt="KL / entropy"' in html
    details = re.search(r"<details><summary>(.*?)</summary>(.*?)</details>", html, re.S)
    assert details.group(1) == "Per-step metrics: 4 steps, 5 metrics that change, 3 that do not"
    constant_table, step_table = re.findall(r"<table>.*?</table>", details.group(2), re.S)
    # constants once, with their value: not a column repeating it
    assert re.findall(r"<tr><td>([^<]+)</td>", constant_table) == ["eval/answer_rate", "lr", "algo"]
    assert '<td class="num">1e-06</td><td>3 of 4 steps</td>' in constant_table
    assert "<td>grpo</td>" in constant_table and "<td>grpo</td>" not in step_table and "<th>lr</th>" not in step_table
    # one row per step, a column per changing metric, "–" where a step did not log it
    assert re.findall(r"<th>([^<]+)</th>", step_table) == ["step", "eval/em", "reward/mean", "kl", "entropy", "eval/once"]
    body_rows = re.findall(r"<tr>(<td.*?)</tr>", step_table)
    assert len(body_rows) == 4
    assert re.findall(r">([^<]*)</td>", body_rows[-1]) == ["3", "0.4", "0.6", "0.03", "1.2", "0.3"]
    assert re.findall(r">([^<]*)</td>", body_rows[0]) == ["0", "0.1", "–", "–", "–", "–"]


CHROMIUM_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,800", "--no-first-run",
                  "--no-default-browser-check", "--disable-extensions", "--disable-dev-shm-usage", "--hide-scrollbars"]

# Loads the report in a 1280x800 iframe (same origin under --allow-file-access-from-files) and writes
# what a reader would see into <pre id="result">: every image decoded, the before/after table and the
# first plot on the first screen, the per-step metrics collapsed.
CHECK_PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>check</title></head>
<body style="margin:0"><iframe id="f" src="report.html" style="width:1280px;height:800px;border:0"></iframe>
<pre id="result">pending</pre><script>
document.getElementById("f").addEventListener("load", function () {
  var out = {};
  try {
    var doc = this.contentDocument;
    var imgs = Array.prototype.slice.call(doc.images);
    out.images = imgs.length;
    out.broken = imgs.filter(function (i) { return !(i.complete && i.naturalWidth > 0); }).map(function (i) { return i.src; });
    var h2 = Array.prototype.slice.call(doc.querySelectorAll("h2"));
    var heading = h2.filter(function (h) { return h.textContent.indexOf("before and after") >= 0; })[0];
    var table = heading && heading.nextElementSibling;
    out.table_tag = table ? table.tagName : null;
    out.table_top = table ? table.getBoundingClientRect().top : null;
    out.first_plot_top = imgs.length ? imgs[0].getBoundingClientRect().top : null;
    var details = doc.querySelector("details");
    out.details_open = details ? details.open : null;
    out.details_height = details ? details.getBoundingClientRect().height : null;
    out.summary_height = details ? details.querySelector("summary").getBoundingClientRect().height : null;
    out.tables_visible = details ? Array.prototype.slice.call(details.querySelectorAll("table")).map(function (t) { return t.checkVisibility(); }) : null;
  } catch (e) { out.error = String(e); }
  document.getElementById("result").textContent = JSON.stringify(out);
});
</script></body></html>
"""


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.skip("chromium not installed (Debian package chromium): the report is not checked in a real browser")


def _run_browser(args, timeout=60):
    """Run chromium in its own process group; the whole group is killed afterwards, even on timeout."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # helpers (zygote, renderer, gpu) left behind, if any
        except ProcessLookupError:
            pass
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, (args, proc.returncode, err.decode(errors="replace")[-2000:])
    return out.decode(errors="replace")


def test_report_in_a_real_browser(tmp_path):
    browser = _chromium()
    run = _search_run(tmp_path / "search")
    table_md = ("| questions | EM SFT | EM RL |\n|---|---|---|\n| all | 0.10 | 0.50 |\n| 1-hop | 0.20 | 0.70 |\n"
                "| 2-hop | 0.00 | 0.40 |\n| comparison | 0.10 | 0.40 |")
    page = write_report(run, sections=[("Test split before and after GRPO (greedy)", markdown_table_to_html(table_md))])
    (run / "check.html").write_text(CHECK_PAGE)
    base = [browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]

    t0 = time.perf_counter()
    dom = _run_browser([*base, "--allow-file-access-from-files", "--run-all-compositor-stages-before-draw",
                        "--virtual-time-budget=5000", "--dump-dom", (run / "check.html").as_uri()])
    t_dom = time.perf_counter() - t0
    found = re.search(r'<pre id="result">(.*?)</pre>', dom, re.S)
    assert found and found.group(1) != "pending", dom[-2000:]
    result = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert "error" not in result, result
    assert result["images"] == len(_pngs(page)) == 5 and result["broken"] == [], result
    assert result["table_tag"] == "TABLE" and 0 <= result["table_top"] < 800, result  # the results on the first screen
    assert 0 <= result["first_plot_top"] < 800, result  # and the plots start there too
    # the per-step metrics collapsed: only the summary line takes room, its tables are not shown
    assert result["details_open"] is False and result["tables_visible"] == [False, False], result
    assert 0 < result["summary_height"] <= result["details_height"] < result["summary_height"] + 5, result

    shot = tmp_path / "report.png"
    t0 = time.perf_counter()
    _run_browser([*base, f"--screenshot={shot}", page.as_uri()])
    t_shot = time.perf_counter() - t0
    data = shot.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    assert (int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")) == (1280, 800)
    print(f"chromium: dump-dom {t_dom:.1f} s, screenshot {t_shot:.1f} s")


def test_tiny_grpo_run_report_via_cli(tmp_path, capsys):
    overrides = [
        "train.steps=3", "rollout.batch_size=32", "eval.every=2", "data.max_eval=16", "log.samples_every=1",
        f"log.dir={tmp_path}", "log.name=tiny", "log.tensorboard=false", "log.progress=false", "train.save_every=0",
    ]
    assert main(["train", "examples/tiny_grpo.yaml", *overrides]) == 0
    run = tmp_path / "tiny"
    capsys.readouterr()
    out = tmp_path / "site" / "tiny.html"
    assert main(["report", str(run), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    names = _pngs(out)
    assert (out.parent / "tiny").is_dir() and all((out.parent / "tiny" / n).is_file() for n in names)
    # a run without tools: reward, length, loss and KL plots, EM only if eval logs it; no searches
    # (eval logs eval/tool_calls = 0 for any run; only training tool calls make the plot)
    keys = set().union(*read_metrics(run))
    assert {"reward.png", "response_len.png", "loss.png", "kl.png"} <= set(names)
    assert "searches.png" not in names
    assert ("em.png" in names) == bool(keys & {"eval/em", "eval/qa_em"})
    html = out.read_text()
    assert "<td>reward/mean</td>" in html and "<td>eval/reward</td>" in html and "<td>tiny:copy</td>" in html
    traj = (tmp_path / "site" / "tiny_trajectories.html").read_text()
    assert 'href="tiny_trajectories.html"' in html
    assert "step_1" in traj and "step_3" in traj and 'class="trained"' in traj and "copy: " in traj


@pytest.mark.parametrize("make", ["empty", "missing"])
def test_cli_rejects_a_folder_that_is_not_a_run(tmp_path, capsys, make):
    folder = tmp_path / "notarun"
    if make == "empty":
        folder.mkdir()
        (folder / "config.yaml").write_text("model: {}\n")
    assert main(["report", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("seekrl: error: ") and "\n" not in err
    assert ("has no metrics.jsonl" if make == "empty" else "does not exist") in err
    assert "seekrl train" in err and not (folder / "report.html").exists()


def test_table_helpers_escape():
    t = table_html([{"name": "<x>", "value": 0.123456}, {"name": "y"}], ["name", "value"])
    assert "<td>&lt;x&gt;</td>" in t and '<td class="num">0.1235</td>' in t and "<td>–</td>" in t
    m = markdown_table_to_html("| a | b \\| c |\n|:--|--:|\n| <i> | `k=v` |")
    assert "<th>a</th><th>b | c</th>" in m and "<td>&lt;i&gt;</td><td><code>k=v</code></td>" in m and "--" not in m
