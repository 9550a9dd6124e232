"""Render ``MODEL_CARD.md`` from an artifact's metadata."""

from __future__ import annotations

from typing import Any

_MTBENCH_LICENCE = """\
Rows come from `../shared/data/llm-answers-judged/mt_bench_judged.jsonl`
(MT-bench and the original Vicuna bench; questions, judge prompts and code from
lm-sys/FastChat, Apache-2.0; GPT-4 / GPT-4-Turbo single-answer 1-10 ratings
and model answers copied from public FastChat forks, each with an Apache-2.0
LICENSE at the commit used; see `SOURCES_AND_LICENSES.txt` there). The answers
were produced by third-party models (OpenAI, Anthropic, Google, Meta, Mistral,
...) whose terms of use may restrict using their outputs to train competing
models. This head is a small quality classifier for monitoring, not a
generative model, but check those terms before shipping it outside the team."""


def _cell(v: Any) -> str:
    """Text safe inside a Markdown table cell."""
    return str(v).replace("|", "\\|")


def _fmt(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)


def render_card(meta: dict[str, Any], extra: dict[str, Any] | None = None) -> str:
    extra = extra or {}
    td = meta.get("training_data", {})
    mt = meta.get("metrics", {})
    held = mt.get("held_out", {})
    base = mt.get("baselines_held_out", {})
    cv = mt.get("cv_train_groups", {})
    emb = meta.get("embedding", {})
    rec = meta.get("recipe", {})
    split = td.get("split", {})
    lines: list[str] = []
    add = lines.append
    add(f"# Quality model `{meta.get('version')}`")
    add("")
    add(
        "Scores an LLM answer with P(good answer) in [0, 1] from sentence embeddings "
        "of the answer (and the prompt, when the gateway sends one) plus cheap text "
        "statistics, through an L2-regularised logistic head (numpy/scipy)."
    )
    add("")
    add("| | |")
    add("|---|---|")
    add(f"| created (UTC) | {meta.get('created_utc')} |")
    add(
        f"| embedding model | `{emb.get('name')}` ({emb.get('dim')}-d, max "
        f"{emb.get('max_seq_length')} word pieces, fingerprint `{str(emb.get('fingerprint'))[:16]}`) |"
    )
    add(f"| feature recipe | `{rec.get('name')}`: {_cell(rec.get('description'))} |")
    add(f"| response-only recipe | `{rec.get('noprompt')}`: {_cell(rec.get('noprompt_description'))} |")
    l2 = meta.get("head", {}).get("l2", {})
    nf = meta.get("head", {}).get("n_features", {})
    add(f"| heads | with prompt: {nf.get('with_prompt')} features, L2 {l2.get('with_prompt')}; "
        f"response only: {nf.get('no_prompt')} features, L2 {l2.get('no_prompt')} |")
    add(f"| weights checksum | sha256 `{meta.get('checksum', {}).get('head.npz')}` |")
    add("")
    add("## Data")
    add("")
    if td.get("source_name") == "mt_bench_judged":
        add(_MTBENCH_LICENCE)
        add("")
    add(f"- source: `{td.get('source', 'n/a')}` (sha256 `{str(td.get('source_sha256'))[:16]}`)")
    add(f"- label rule: {td.get('label_rule')}")
    if td.get("skipped"):
        add(f"- rows skipped when loading: {td.get('skipped')}")
    add(
        f"- labelled rows: {td.get('n_rows')} (train {td.get('n_train')}: "
        f"{td.get('n_train_good')} good / {td.get('n_train_bad')} bad; "
        f"held out {td.get('n_test')})"
    )
    add(f"- split: by `{split.get('key')}`; {split.get('rule')}")
    tg = split.get("test_groups", [])
    add(f"- held-out groups ({len(tg)}), never seen in training or in L2 tuning: "
        + ", ".join(f"`{g}`" for g in tg))
    add(f"- training groups: {len(td.get('train_groups', []))}")
    if extra.get("data_notes"):
        for n in extra["data_notes"]:
            add(f"- {n}")
    add("")
    add("## Metrics (held-out groups)")
    add("")
    add("ROC-AUC of good (1) vs bad (0) on the held-out groups only; every model "
        "below was fit on the same training groups and scored on the same rows.")
    add("")
    add("| model | features | ROC-AUC | n (good/bad) |")
    add("|---|---|---|---|")
    add(
        f"| **shipped `{meta.get('version')}`** | `{rec.get('name')}` | **{_fmt(held.get('roc_auc'))}** | "
        f"{held.get('n')} ({held.get('n_good')}/{held.get('n_bad')}) |"
    )
    add(
        f"| shipped, response-only head | `{rec.get('noprompt')}` | "
        f"{_fmt(held.get('roc_auc_response_only'))} | same rows, prompt ignored |"
    )
    for name, b in base.items():
        add(
            f"| baseline | `{name}`: {_cell(b.get('recipe'))} | {_fmt(b.get('roc_auc'))} | "
            f"{b.get('n')} ({b.get('n_good')}/{b.get('n_bad')}) |"
        )
    for row in extra.get("extra_metric_rows", []):
        add(row)
    add("")
    pg = mt.get("held_out_per_group") or {}
    if pg:
        add("Shipped model, ROC-AUC within each held-out group (few good or few bad "
            "answers make a group's figure noisy):")
        add("")
        add("| held-out group | ROC-AUC | good / bad |")
        add("|---|---|---|")
        for g, v in pg.items():
            if isinstance(v, dict):
                add(f"| `{g}` | {_fmt(v.get('roc_auc'))} | {v.get('n_good')} / {v.get('n_bad')} |")
            else:
                add(f"| `{g}` | {_fmt(v)} | |")
        add("")
    if cv:
        add("L2 chosen by group-5-fold cross-validation on the training groups only "
            "(pooled out-of-fold ROC-AUC):")
        add("")
        for name, c in cv.items():
            grid = ", ".join(f"{g['l2']}: {g['oof_roc_auc']}" for g in c.get("grid", []))
            add(f"- {name}: chosen L2 {c.get('chosen_l2')} (CV {c.get('oof_roc_auc')}); grid {grid}; "
                f"Platt calibration a, b = {c.get('calibration')}")
        add("")
    check = td.get("unseen_items_check")
    if check:
        a = check.get("roc_auc", {})
        names = list(a)
        add(
            "Stricter check (not the shipped weights): the same recipes refit on the "
            f"training models x 75% of the questions, scored on the held-out models x the "
            f"other {check.get('n_test_items')} questions ({check.get('n_test')} rows; "
            f"{check.get('n_train')} training rows): ROC-AUC "
            + ", ".join(f"`{n}` {a[n]}" for n in names)
            + ". This is closer to production, where prompts are new."
        )
        add("")
    for para in extra.get("metric_notes", []):
        add(para)
        add("")
    add("## Intended use")
    add("")
    add(
        "- Channel-health monitoring (SPEC §4.5): score a *sample* of `ok` responses "
        "per channel and compare the channel's rolling mean with its own baseline; a "
        "sustained drop is a `quality` reason. It detects answers that are useless in "
        "ways visible in the text: refusals, empty or cut-off answers, boilerplate, "
        "off-topic or degenerate (repetitive) text."
    )
    add(
        "- Use the with-prompt head when `prompt_text` is present; the scorer falls "
        "back to the response-only head otherwise (lower ROC-AUC, see table)."
    )
    add("- Comparisons are meaningful within one model version; re-baseline channels "
        "when `CURRENT` changes.")
    add("")
    add("## Limits")
    add("")
    add(
        "- It is not a correctness judge. MT-bench's low scores are often wrong maths or "
        "code that reads fluently; the embedding cannot check that. Do not use the "
        "score to rank providers or to gate single requests."
    )
    add(
        "- Trained on English single- and multi-turn chat answers (MT-bench / Vicuna "
        "bench, 2023-2024 open and API models). Other languages (e.g. Chinese) are "
        "scored but are out of distribution; the scorer counts them as `non_latin`. "
        "Structured/JSON or tool-call outputs are out of scope (the structure check "
        "covers those)."
    )
    add(
        "- Held-out groups are *models*; they answer the same benchmark questions as "
        "the training models, so the held-out ROC-AUC measures generalisation to new "
        "models, not to new prompts (see the unseen-question check above, if listed)."
    )
    add(
        "- The embedding reads the first 256 word pieces; a tail embedding of the last "
        "1,200 characters covers endings. Inputs are cut to 4,096 characters before "
        "tokenising; lengths above 8,000 characters are clipped in the features."
    )
    add(
        "- Turn-2 rows are scored from the turn-2 question only (the first turn is not "
        "given to the model), as in production where `prompt_text` may be truncated."
    )
    add("- Labels are GPT-4 ratings, themselves noisy and biased towards long answers.")
    add(
        "- Very short answers that restate the question or stop mid-sentence can still "
        "score mid-range: MT-bench has few such rows. Within-group ROC-AUC is much lower "
        "than the pooled figure for models whose answers are almost all bad (see the "
        "per-group table): part of the pooled figure is telling weak models from strong ones."
    )
    for n in extra.get("limits", []):
        add(f"- {n}")
    add("")
    return "\n".join(lines)
