"""Labels, group split, fitting, evaluation and promotion of quality models.

Labelled rows come from JSON lines, either

- ``{"prompt"?: str, "response": str, "label": 0|1|true|false|"good"|"bad"}`` or
- ``{"prompt"?: str, "response": str, "score": number, "scale": "1-10"}``
  (good = score >= 7, bad = score <= 4 on a 1-10 scale, other scales mapped
  linearly; scores in between are skipped and counted as ``ambiguous_score``).

Rows are split by a *group key* (``group``, else ``model``, else
``channel``): every group is wholly in train or wholly in test, so the
held-out metric is for models the head never saw. The L2 strength is tuned by
group-k-fold on the training groups only; the test groups are touched once, for
the reported metric.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from pipeline.quality.artifact import (
    ArtifactError,
    QualityModel,
    current_version,
    default_models_dir,
    load_model,
    next_version,
    promote,
    save_model,
)
from pipeline.quality.embedding import Embedder, EmbeddingCache, clean_text
from pipeline.quality.features import (
    FeatureInputs,
    Recipe,
    build_inputs,
    get_recipe,
    recipe_params,
)
from pipeline.quality.head import LogisticHead, fit_logistic, fit_platt, roc_auc

from pipeline.tools.quality.labels import (  # noqa: F401  (re-exported: the data team's entry points)
    BAD_MAX,
    DEFAULT_L2_GRID,
    DEFAULT_RECIPE,
    DEFAULT_SPLIT_SALT,
    GOOD_MIN,
    GROUP_KEYS,
    LABEL_RULE,
    LabelledRow,
    LoadedLabels,
    Split,
    default_cache_dir,
    default_labels_path,
    group_folds,
    label_from_score,
    load_rows,
    parse_lines,
    parse_row,
    repo_root,
    split_by_group,
)

log = logging.getLogger(__name__)


def embed_rows(
    embedder: Embedder,
    prompts: Sequence[Any] | None,
    responses: Sequence[Any],
    cache: EmbeddingCache | None = None,
    batch_size: int = 32,
    recipe: Recipe | None = None,
) -> FeatureInputs:
    """Embeddings + statistics for rows (through the disk cache when given)."""
    if cache is not None:

        def encode(texts: list[str]) -> np.ndarray:
            return cache.encode(embedder, texts, batch_size)

    else:

        def encode(texts: list[str]) -> np.ndarray:
            return embedder.encode_clean(texts, batch_size)

    out = build_inputs(
        prompts,
        responses,
        encode,
        lambda t: clean_text(t, embedder.max_chars)[0],
        embedder.dim,
        need_tail=True if recipe is None else recipe.uses_tail,
    )
    if cache is not None:
        cache.save()
    return out


def predict(model: QualityModel, inputs: FeatureInputs) -> np.ndarray:
    """P(good) per row (see :meth:`QualityModel.predict`)."""
    return model.predict(inputs)


# ---------------------------------------------------------------- fitting


@dataclass
class HeadFit:
    head: LogisticHead
    cv: dict[str, Any]


def fit_head_cv(
    X: np.ndarray,
    y: np.ndarray,
    folds: np.ndarray,
    l2_grid: Sequence[float] = DEFAULT_L2_GRID,
    calibrate: bool = True,
) -> HeadFit:
    """Pick L2 by pooled out-of-fold ROC-AUC over group folds; refit on all rows;
    fit a Platt step on the out-of-fold logits of the chosen L2."""
    grid = sorted(set(float(v) for v in l2_grid), reverse=True)
    usable = [f for f in np.unique(folds) if len(np.unique(y[folds != f])) == 2]
    oofs = {l2: np.full(len(y), np.nan) for l2 in grid}
    for f in usable:
        tr, te = folds != f, folds == f
        init: LogisticHead | None = None
        for l2 in grid:  # strongest first; each fit warm-starts the next
            h = fit_logistic(X[tr], y[tr], l2=l2, init=init)
            init = h
            oofs[l2][te] = ((X[te] - h.mean) / h.scale) @ h.coef + h.intercept
    results = []
    best: tuple[float, float, np.ndarray] | None = None
    for l2 in grid:
        oof = oofs[l2]
        ok = np.isfinite(oof)
        auc = roc_auc(y[ok], oof[ok]) if len(np.unique(y[ok])) == 2 else float("nan")
        fold_aucs = [
            roc_auc(y[folds == f], oof[folds == f])
            for f in usable
            if len(np.unique(y[folds == f])) == 2
        ]
        results.append(
            {
                "l2": l2,
                "oof_roc_auc": round(auc, 4),
                "fold_roc_auc_mean": round(float(np.mean(fold_aucs)), 4) if fold_aucs else None,
            }
        )
        if best is None or (np.isfinite(auc) and not auc <= best[0]):
            best = (auc, l2, oof)
    assert best is not None
    head = fit_logistic(X, y, l2=best[1])
    oof = best[2]
    ok = np.isfinite(oof)
    if calibrate and ok.sum() > 10 and len(np.unique(y[ok])) == 2:
        a, b = fit_platt(oof[ok], y[ok])
        if a > 0:
            head.calib_a, head.calib_b = a, b
    return HeadFit(
        head,
        {
            "folds": int(len(np.unique(folds))),
            "grid": results,
            "chosen_l2": best[1],
            "oof_roc_auc": round(best[0], 4),
            "calibration": [round(head.calib_a, 4), round(head.calib_b, 4)],
        },
    )


@dataclass
class TrainReport:
    model: QualityModel
    held_out: dict[str, Any]
    baselines: dict[str, Any] = field(default_factory=dict)


def _auc_block(y: np.ndarray, p: np.ndarray) -> dict[str, Any]:
    n_pos = int(y.sum())
    n_neg = int(len(y) - n_pos)
    auc = roc_auc(y, p) if n_pos and n_neg else None
    return {
        "roc_auc": round(auc, 4) if auc is not None else None,
        "n": int(len(y)),
        "n_good": n_pos,
        "n_bad": n_neg,
    }


def fit_model(
    rows: Sequence[LabelledRow],
    split: Split,
    embedder: Embedder,
    *,
    recipe: str = DEFAULT_RECIPE,
    version: str = "unsaved",
    l2_grid: Sequence[float] = DEFAULT_L2_GRID,
    k_folds: int = 5,
    cache: EmbeddingCache | None = None,
    inputs: FeatureInputs | None = None,
    baselines: Sequence[str] = ("plain-v1", "length-v1"),
    data_summary: dict[str, Any] | None = None,
) -> TrainReport:
    """Fit the with-prompt and response-only heads of ``recipe`` on the train
    side of ``split``; evaluate once on the held-out groups."""
    t0 = time.time()
    rec = get_recipe(recipe)
    noprompt = f"{recipe}-noprompt"
    get_recipe(noprompt)
    if inputs is None:
        inputs = embed_rows(
            embedder, [r.prompt for r in rows], [r.response for r in rows], cache=cache
        )
    y = np.array([r.label for r in rows], dtype=float)
    groups = split.groups(rows)
    tr, te = split.partition(rows)
    if len(tr) == 0 or len(np.unique(y[tr])) < 2:
        raise ValueError("training side of the split needs good and bad rows")
    folds = group_folds([groups[i] for i in tr], k_folds)
    in_tr = inputs.subset(tr)
    heads: dict[str, LogisticHead] = {}
    cv: dict[str, Any] = {}
    for name, r in (("with_prompt", rec), ("no_prompt", get_recipe(noprompt))):
        # The response-only head trains on every row (prompt features ignored);
        # the with-prompt head on rows that have a prompt (all rows if none do,
        # with zero prompt vectors).
        idx = np.arange(len(tr))
        if name == "with_prompt" and in_tr.has_prompt.any():
            idx = np.flatnonzero(in_tr.has_prompt)
        X = r(in_tr.subset(idx))
        fit = fit_head_cv(X, y[tr][idx], folds[idx], l2_grid)
        heads[name] = fit.head
        cv[name] = fit.cv
    model = QualityModel(
        version=version,
        recipe=rec,
        heads=heads,
        embedding=embedder.info,
        metadata={
            "recipe": {
                "name": rec.name,
                "description": rec.description,
                "noprompt": noprompt,
                "noprompt_description": get_recipe(noprompt).description,
                "params": recipe_params(),
                "selection": "L2 per head by group-k-fold CV on training groups only",
            },
        },
    )
    held: dict[str, Any] = {}
    base: dict[str, Any] = {}
    if len(te):
        in_te = inputs.subset(te)
        p = predict(model, in_te)
        held = _auc_block(y[te], p)
        # Same rows scored by the response-only head: what to expect without prompts.
        p_np = heads["no_prompt"].predict_proba(model.noprompt_recipe(in_te))
        held["roc_auc_response_only"] = _auc_block(y[te], p_np)["roc_auc"]
        for b in baselines:
            br = get_recipe(b)
            bfit = fit_head_cv(br(in_tr), y[tr], folds, l2_grid, calibrate=False)
            pb = bfit.head.predict_proba(br(in_te))
            base[b] = {
                "recipe": br.description,
                "chosen_l2": bfit.cv["chosen_l2"],
                **_auc_block(y[te], pb),
            }
    train_groups = sorted({groups[i] for i in tr})
    model.metadata.update(
        {
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "training_data": {
                **(data_summary or {}),
                "label_rule": LABEL_RULE,
                "n_rows": int(len(rows)),
                "n_train": int(len(tr)),
                "n_test": int(len(te)),
                "n_train_good": int(y[tr].sum()),
                "n_train_bad": int(len(tr) - y[tr].sum()),
                "n_rows_with_prompt": int(inputs.has_prompt.sum()),
                "split": split.to_json(),
                "train_groups": train_groups,
            },
            "metrics": {
                "held_out": held,
                "baselines_held_out": base,
                "cv_train_groups": cv,
                "fit_seconds": round(time.time() - t0, 1),
            },
        }
    )
    return TrainReport(model, held, base)


def evaluate(
    model: QualityModel,
    rows: Sequence[LabelledRow],
    embedder: Embedder,
    cache: EmbeddingCache | None = None,
    inputs: FeatureInputs | None = None,
) -> dict[str, Any]:
    """ROC-AUC (and counts) of ``model`` on labelled rows."""
    model.check_embedding(embedder.info)
    if inputs is None:
        inputs = embed_rows(
            embedder, [r.prompt for r in rows], [r.response for r in rows], cache=cache
        )
    y = np.array([r.label for r in rows], dtype=float)
    p = predict(model, inputs)
    out = _auc_block(y, p)
    out["model_version"] = model.version
    out["mean_score_good"] = round(float(p[y == 1].mean()), 4) if (y == 1).any() else None
    out["mean_score_bad"] = round(float(p[y == 0].mean()), 4) if (y == 0).any() else None
    return out


# ---------------------------------------------------------------- promotion


@dataclass
class PromotionResult:
    version: str
    promoted: bool
    reason: str
    new_roc_auc: float | None
    current_version: str | None
    current_roc_auc: float | None
    path: Path


def train_and_maybe_promote(
    rows: Sequence[LabelledRow],
    split: Split,
    force: bool = False,
    *,
    embedder: Embedder | None = None,
    models_dir: Path | None = None,
    recipe: str = DEFAULT_RECIPE,
    version: str | None = None,
    cache: EmbeddingCache | None = None,
    l2_grid: Sequence[float] = DEFAULT_L2_GRID,
    k_folds: int = 5,
    data_summary: dict[str, Any] | None = None,
    card_extra: dict[str, Any] | None = None,
    inputs: FeatureInputs | None = None,
    group_report: Callable[[QualityModel, np.ndarray], dict[str, Any]] | None = None,
) -> PromotionResult:
    """Train a new version, save it, and promote it only if its held-out ROC-AUC
    is >= the current model's on the same held-out rows (or ``force``)."""
    from pipeline.tools.quality.card import render_card

    root = Path(models_dir or default_models_dir())
    embedder = embedder or Embedder()
    version = version or next_version(root)
    if inputs is None:
        inputs = embed_rows(
            embedder, [r.prompt for r in rows], [r.response for r in rows], cache=cache
        )
    report = fit_model(
        rows,
        split,
        embedder,
        recipe=recipe,
        version=version,
        l2_grid=l2_grid,
        k_folds=k_folds,
        inputs=inputs,
        data_summary=data_summary,
    )
    new_auc = report.held_out.get("roc_auc")
    _, te = split.partition(rows)
    if group_report is not None and len(te):
        report.model.metadata["metrics"]["held_out_per_group"] = group_report(
            report.model, report.model.predict(inputs.subset(te))
        )
    cur = current_version(root)
    cur_auc: float | None = None
    reason = ""
    promote_it = False
    if cur is not None:
        try:
            cur_model = load_model(cur, root, embedding=embedder.info)
            if len(te):
                y = np.array([rows[i].label for i in te], dtype=float)
                cur_auc = _auc_block(y, predict(cur_model, inputs.subset(te)))["roc_auc"]
        except ArtifactError as exc:
            reason = f"current model {cur} unusable ({exc}); "
    if force:
        promote_it, reason = True, reason + "forced"
    elif new_auc is None:
        reason += "no held-out rows with both labels; not promoted (use force)"
    elif cur is None:
        promote_it, reason = True, reason + "no current model"
    elif cur_auc is None:
        reason += f"cannot compare with current {cur}; not promoted (use force)"
    elif new_auc >= cur_auc:
        promote_it, reason = True, f"held-out ROC-AUC {new_auc} >= current {cur} {cur_auc}"
    else:
        reason = f"held-out ROC-AUC {new_auc} < current {cur} {cur_auc}; not promoted"
    report.model.metadata["promotion"] = {
        "compared_with": cur,
        "compared_roc_auc": cur_auc,
        "promoted_at_training": promote_it,
        "reason": reason,
    }
    path = save_model(report.model, root, card=None)
    (path / "MODEL_CARD.md").write_text(render_card(report.model.metadata, card_extra or {}))
    if promote_it:
        promote(version, root)
    log.info("quality model %s: %s", version, reason)
    return PromotionResult(version, promote_it, reason, new_auc, cur, cur_auc, path)
