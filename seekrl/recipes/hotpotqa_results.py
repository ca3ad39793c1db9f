"""The HotpotQA recipe's results.md (recipes/hotpotqa.py `run` writes it): the held-out table, each
GRPO seed's gain over SFT and their mean, EM by question type, the questions with two possible
answers against chance, what the searches retrieved, the learning curve and the stage times; the
row builders are shared with report.html's tables."""

from __future__ import annotations

from seekrl.demo import markdown_table

__all__ = ["results_markdown", "type_rows", "two_way_rows", "support_rows"]


def _label(res: dict, name: str) -> str:
    """A model's row label: after SFT, or after GRPO with the seed of that run."""
    return "after SFT" if name == "sft" else f"after GRPO (train.seed={res['grpo_gains'][name]['seed']})"


def type_rows(res: dict) -> list[dict]:
    rows = []
    for name, by in res["em_by_type"].items():
        row = {"model": _label(res, name)}
        for kind, v in by.items():
            row[f"{kind} EM (n={v['n']})"] = v["em"]
        rows.append(row)
    return rows


def two_way_rows(res: dict) -> list[dict]:
    rows = []
    for name, by in res["two_way"].items():
        yn, eo = by["yes/no"], by["either-or"]
        rows.append({"model": _label(res, name),
                     f"yes/no EM (n={yn['n']})": yn["em"], "answered yes": yn["answered yes"], "gold yes": yn["gold yes"],
                     f"either-or EM (n={eo['n']})": eo["em"], "named an option": eo["named one"], "picked the first": eo["picked first"],
                     "gold the first": eo["gold first"], f"open EM (n={by['open']['n']})": by["open"]["em"]})
    return rows


def support_rows(res: dict) -> list[dict]:
    rows = []
    for name, s in res["search_support"].items():
        rows.append({"model": _label(res, name),
                     f"all needed paragraphs retrieved (n={s['episodes']})": s["all_retrieved"],
                     "searched again": s["searched_again"], "a later search found a new one": s["later_search_new"],
                     "EM then": s["em_later_new"], "EM otherwise (searched again)": s["em_later_nothing_new"]})
    return rows


def results_markdown(res: dict) -> str:
    lines = ["# seekrl recipe hotpotqa_smollm2: HotpotQA, BM25 search, greedy", "", markdown_table(res["table"]).rstrip()]
    gains = [(f"GRPO (train.seed={g['seed']}) over SFT", "held-out", g) for g in res.get("grpo_gains", {}).values()]
    for label, where, g in [*gains, ("SFT over the base model", "base", res.get("sft_gain"))]:
        if g:
            lines += ["", f"EM gain, {label} (the {where} questions, paired bootstrap, {g['resamples']:,} resamples of {g['n']} questions): "
                      f"**{100 * g['mean']:+.1f} points**, 95% CI [{100 * g['ci95'][0]:+.1f}, {100 * g['ci95'][1]:+.1f}]"]
    if len(gains) > 1:
        m = res.get("grpo_gain_mean_ci")
        ci = (f", 95% CI [{100 * m['ci95'][0]:+.1f}, {100 * m['ci95'][1]:+.1f}] (the seeds' mean EM of each question against SFT's, "
              "paired bootstrap)") if m else ""
        lines += ["", f"Mean EM gain of GRPO over SFT across the {len(gains)} seeds: **{100 * res['grpo_gain_mean']:+.1f} points**{ci}"]
    if res.get("em_by_type"):
        lines += ["", "EM by question type (held-out):", "", markdown_table(type_rows(res)).rstrip()]
    if res.get("two_way"):
        lines += ["", "Questions with two possible answers (held-out): EM, and how the answers split against the gold's split "
                  "(a policy that guesses sits near chance and moves the split):", "", markdown_table(two_way_rows(res)).rstrip()]
    if res.get("search_support"):
        lines += ["", "What the searches retrieved (held-out questions that name their gold paragraphs): the episodes that retrieved every "
                  "paragraph the question needs, and of those that searched again, the ones whose later search found a needed "
                  "paragraph the first had not:", "", markdown_table(support_rows(res)).rstrip()]
    for g in res.get("open_gains", {}).values():
        lines += ["", f"EM gain on the open questions (an answer to read, not pick), GRPO (train.seed={g['seed']}) over SFT "
                  f"({g['n']} questions, paired bootstrap): **{100 * g['mean']:+.1f} points**, "
                  f"95% CI [{100 * g['ci95'][0]:+.1f}, {100 * g['ci95'][1]:+.1f}]"]
    if res.get("ceiling_command"):
        lines += ["", "What GRPO could sharpen at most: the SFT policy's pass@k on the open check questions (8 samples each at the "
                  f"GRPO temperature; a question no sample solves has no reward spread to learn from): `{res['ceiling_command']}`"]
    if res.get("curve"):
        lines += ["", "Learning curve of the first seed (check questions, greedy; minutes: training time, evals not counted):", "",
                  markdown_table(res["curve"]).rstrip()]
    lines += ["", "| stage | wall time (s) |", "|---|---|"]
    lines += [f"| {k} | {v:.0f} |" for k, v in res["stage_seconds"].items()]
    lines += [f"| total | {sum(res['stage_seconds'].values()):.0f} |", ""]
    lines += ["Training time across resumes (sum of step times): "
              + ", ".join(f"{k} {v:.0f} s" for k, v in res["train_seconds"].items()), ""]
    c = res.get("curriculum")
    if c:
        lines.append(f"Curriculum: of the first {c['measured']} training questions, the SFT model solved {c['kept']} in some but not all "
                     f"of {c['k']} samples (GRPO trains on these), {c['solved_by_all']} in all, "
                     f"{c['measured'] - c['solved_by_some_sample']} in none.")
    split = res.get("split", {})
    if "train_rl" in split and res.get("grpo_share") == "all":
        lines.append(f"SFT's share (demo.sft_share): the teacher played {split['train_sft']} of the {split['train']} training questions; "
                     f"GRPO drew from all {split['train']} (demo.grpo_share=all), the {split['train_rl']} whose answers SFT never saw "
                     "and SFT's share.")
    elif "train_rl" in split:
        lines.append(f"SFT's share (demo.sft_share): the teacher played {split['train_sft']} of the {split['train']} training questions; "
                     f"GRPO drew only from the other {split['train_rl']}, whose answers SFT never saw.")
    if "train_retrievable" in split:
        lines.append(f"GRPO questions (demo.grpo_questions=retrievable): the {split['train_retrievable']} of the {split['train_open']} "
                     "open training questions whose own search brought back every needed paragraph.")
    t = res.get("teacher")
    if t:
        lines.append(f"Teacher: {t['kept']} SFT episodes kept of {t['episodes']} played ({t['gold']} with the gold answer, "
                     f"{t['kept']} of them supported by a retrieved passage), {t['searches_per_episode']:.2f} searches per kept episode.")
    return "\n".join(lines) + "\n"
