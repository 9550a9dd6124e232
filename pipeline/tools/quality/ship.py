"""Build a model version from a labelled file, with the card's extra checks.

``train_from_file`` is what ``channel-health quality train`` runs. For the
shipped default it reads the MT-bench judgments, splits by model, fits the
shipped recipe and the baselines on the same split, adds an
unseen-models-and-unseen-questions check to the card, saves the version and
promotes it if it is at least as good as the current one on the same split.
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from pipeline.quality.embedding import Embedder, EmbeddingCache
from pipeline.quality.features import FeatureInputs, get_recipe
from pipeline.quality.head import roc_auc
from pipeline.tools.quality.train import (
    DEFAULT_L2_GRID,
    DEFAULT_RECIPE,
    LabelledRow,
    PromotionResult,
    Split,
    default_cache_dir,
    default_labels_path,
    embed_rows,
    fit_head_cv,
    group_folds,
    load_rows,
    repo_root,
    split_by_group,
    train_and_maybe_promote,
)

log = logging.getLogger(__name__)


def _display_path(p: Path) -> str:
    try:
        return "../" + p.resolve().relative_to(repo_root().parent).as_posix()
    except ValueError:
        return str(p)


def unseen_item_check(
    rows: Sequence[LabelledRow],
    split: Split,
    inputs: FeatureInputs,
    recipes: Sequence[str] = (DEFAULT_RECIPE, "plain-v1", "length-v1"),
    test_fraction: float = 0.25,
    l2_grid: Sequence[float] = DEFAULT_L2_GRID,
) -> dict[str, Any] | None:
    """Stricter check: train on training models x training questions, test on
    held-out models x held-out questions (needs ``item`` ids)."""
    if not all(r.item for r in rows):
        return None
    items = sorted({r.item for r in rows}, key=lambda g: hashlib.sha256(f"items-v1\0{g}".encode()).hexdigest())
    test_items = set(items[: max(1, int(round(test_fraction * len(items))))])
    tr_m, te_m = split.partition(rows)
    is_test_model = np.zeros(len(rows), bool)
    is_test_model[te_m] = True
    is_test_item = np.array([r.item in test_items for r in rows])
    tr = np.flatnonzero(~is_test_model & ~is_test_item)
    te = np.flatnonzero(is_test_model & is_test_item)
    y = np.array([r.label for r in rows], dtype=float)
    if len(np.unique(y[te])) < 2:
        return None
    groups = split.groups(rows)
    folds = group_folds([groups[i] for i in tr], 5)
    out: dict[str, Any] = {
        "n_train": int(len(tr)),
        "n_test": int(len(te)),
        "n_test_items": len(test_items),
        "roc_auc": {},
    }
    for name in recipes:
        r = get_recipe(name)
        fit = fit_head_cv(r(inputs.subset(tr)), y[tr], folds, l2_grid, calibrate=False)
        out["roc_auc"][name] = round(roc_auc(y[te], fit.head.predict_proba(r(inputs.subset(te)))), 4)
    return out


def per_group_auc(rows: Sequence[LabelledRow], split: Split, p: np.ndarray) -> dict[str, Any]:
    """ROC-AUC per held-out group (where it has both labels)."""
    _, te = split.partition(rows)
    groups = split.groups(rows)
    out: dict[str, Any] = {}
    for g in split.test_groups:
        idx = [j for j, i in enumerate(te) if groups[i] == g]
        y = np.array([rows[te[j]].label for j in idx])
        auc = round(roc_auc(y, p[idx]), 4) if len(idx) and 0 < y.sum() < len(y) else None
        out[g] = {"roc_auc": auc, "n_good": int(y.sum()), "n_bad": int(len(y) - y.sum())}
    return out


def train_from_file(
    labels: str | Path | None = None,
    *,
    force: bool = False,
    models_dir: Path | None = None,
    embedder: Embedder | None = None,
    recipe: str = DEFAULT_RECIPE,
    version: str | None = None,
    test_fraction: float = 0.25,
    use_cache: bool = True,
    extra_checks: bool = True,
) -> PromotionResult:
    path = Path(labels) if labels else default_labels_path()
    loaded = load_rows(path)
    rows = loaded.rows
    if not rows:
        raise ValueError(f"no labelled rows in {path} (skipped: {dict(loaded.skipped)})")
    embedder = embedder or Embedder()
    cache = EmbeddingCache(default_cache_dir(), embedder.info) if use_cache else None
    split = split_by_group(rows, test_fraction)
    t0 = time.time()
    inputs = embed_rows(embedder, [r.prompt for r in rows], [r.response for r in rows], cache=cache)
    log.info("embedded %d rows in %.1fs", len(rows), time.time() - t0)
    summary = {
        "source": _display_path(path),
        "source_name": path.stem,
        "source_sha256": loaded.sha256,
        "skipped": dict(loaded.skipped),
        "n_groups": len(set(split.groups(rows))),
    }
    extra: dict[str, Any] = {"extra_metric_rows": [], "metric_notes": [], "data_notes": []}
    if extra_checks:
        check = unseen_item_check(rows, split, inputs, (recipe, "plain-v1", "length-v1"))
        if check:
            summary["unseen_items_check"] = check
    cats: dict[str, int] = {}
    for r in rows:
        if r.category:
            cats[r.category] = cats.get(r.category, 0) + 1
    if cats:
        summary["categories"] = dict(sorted(cats.items()))
    res = train_and_maybe_promote(
        rows,
        split,
        force=force,
        embedder=embedder,
        models_dir=models_dir,
        recipe=recipe,
        version=version,
        cache=cache,
        data_summary=summary,
        card_extra=extra,
        inputs=inputs,
        group_report=lambda model, p: per_group_auc(rows, split, p),
    )
    return res
