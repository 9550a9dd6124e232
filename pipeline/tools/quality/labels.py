"""Labelled quality data: the label rule, row parsing and loading (jsonl),
and the deterministic split by group (model) used for held-out evaluation.

Rows are ``{"prompt"?, "response", "label": 0|1}`` or ``{"response", "score",
"scale"}``; the MT-bench rule is good = score >= 7, bad = score <= 4 (1-10).
"""

from __future__ import annotations
import hashlib
import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence
import numpy as np

GOOD_MIN = 7.0
BAD_MAX = 4.0
LABEL_RULE = "good = score >= 7, bad = score <= 4 (1-10 scale); 5-6 dropped"
DEFAULT_RECIPE = "rich-v1"
DEFAULT_L2_GRID = (1.0, 0.3, 0.1, 3e-2, 1e-2, 3e-3)
DEFAULT_SPLIT_SALT = "quality-split-v1"
GROUP_KEYS = ("group", "model", "channel")


def repo_root() -> Path:
    """The repository holding this package (``pipeline/tools/quality/labels.py`` is three levels down)."""
    return Path(__file__).resolve().parents[3]


def default_cache_dir() -> Path:
    """Git-ignored embedding cache (``<repo>/.cache/quality``)."""
    return repo_root() / ".cache" / "quality"


def default_labels_path() -> Path:
    """The shared MT-bench judgments (``../shared/data/llm-answers-judged``)."""
    return repo_root().parent / "shared" / "data" / "llm-answers-judged" / "mt_bench_judged.jsonl"


# ---------------------------------------------------------------- labels


@dataclass(frozen=True)
class LabelledRow:
    response: Any
    label: int
    prompt: str | None = None
    group: str | None = None
    category: str | None = None
    score: float | None = None
    item: str | None = None
    """Question/item id (``question_id`` or ``item``), for prompt-level splits."""


def label_from_score(score: Any, scale: Any = "1-10") -> int | None:
    """1 (good), 0 (bad) or ``None`` (in between / unusable).

    >>> label_from_score(8), label_from_score("4"), label_from_score(5.5)
    (1, 0, None)
    >>> label_from_score(4, "0-5")
    1
    """
    try:
        s = float(score)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(s):
        return None
    lo, hi = 1.0, 10.0
    if scale not in (None, "", "1-10"):
        try:
            a, b = str(scale).split("-", 1)
            lo, hi = float(a), float(b)
        except ValueError:
            return None
        if hi <= lo:
            return None
    frac = (s - lo) / (hi - lo)  # map onto the 1-10 rule
    s10 = 1.0 + 9.0 * frac
    if s10 >= GOOD_MIN - 1e-9:
        return 1
    if s10 <= BAD_MAX + 1e-9:
        return 0
    return None


def _label_value(v: Any) -> int | None:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)) and v in (0, 1):
        return int(v)
    if isinstance(v, str) and v.strip().lower() in ("good", "1", "true", "bad", "0", "false"):
        return int(v.strip().lower() in ("good", "1", "true"))
    return None


def parse_row(obj: Any) -> tuple[LabelledRow | None, str | None]:
    """One JSON object -> a labelled row, or ``(None, reason)``."""
    if not isinstance(obj, dict):
        return None, "not_object"
    if "response" not in obj:
        return None, "no_response"
    if "label" in obj and obj["label"] is not None:
        label = _label_value(obj["label"])
        if label is None:
            return None, "bad_label"
    elif "score" in obj:
        label = label_from_score(obj["score"], obj.get("scale", "1-10"))
        if label is None:
            return None, "ambiguous_score"
    else:
        return None, "no_label"
    group = next((str(obj[k]) for k in GROUP_KEYS if obj.get(k) is not None), None)
    prompt = obj.get("prompt")
    score = obj.get("score")
    try:
        score = float(score) if score is not None else None
    except (TypeError, ValueError):
        score = None
    return (
        LabelledRow(
            response=obj["response"],
            label=label,
            prompt=prompt if isinstance(prompt, str) else None,
            group=group,
            category=obj.get("category") if isinstance(obj.get("category"), str) else None,
            score=score,
            item=next(
                (str(obj[k]) for k in ("item", "question_id") if obj.get(k) is not None), None
            ),
        ),
        None,
    )


@dataclass
class LoadedLabels:
    rows: list[LabelledRow]
    skipped: Counter
    source: str
    sha256: str | None = None


def parse_lines(lines: Iterable[str | bytes], source: str = "<lines>") -> LoadedLabels:
    rows: list[LabelledRow] = []
    skipped: Counter = Counter()
    for line in lines:
        if isinstance(line, bytes):
            line = line.decode("utf-8", errors="replace")
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            skipped["bad_json"] += 1
            continue
        row, why = parse_row(obj)
        if row is None:
            skipped[why or "unknown"] += 1
        else:
            rows.append(row)
    return LoadedLabels(rows, skipped, source)


def load_rows(path: str | Path) -> LoadedLabels:
    """Read labelled rows from a JSON-lines file (skips counted by reason)."""
    p = Path(path)
    data = p.read_bytes()
    out = parse_lines(data.splitlines(), source=str(p))
    out.sha256 = hashlib.sha256(data).hexdigest()
    return out


# ---------------------------------------------------------------- split


def _group_of(row: LabelledRow, i: int) -> str:
    if row.group is not None:
        return row.group
    return f"prompt:{row.prompt}" if row.prompt else f"row:{i}"


def _rank(salt: str, g: str) -> str:
    return hashlib.sha256(f"{salt}\0{g}".encode()).hexdigest()


@dataclass(frozen=True)
class Split:
    """Which groups are held out. Rows of other groups are for training."""

    test_groups: tuple[str, ...]
    key: str = "model"
    rule: str = ""

    def groups(self, rows: Sequence[LabelledRow]) -> list[str]:
        return [_group_of(r, i) for i, r in enumerate(rows)]

    def partition(self, rows: Sequence[LabelledRow]) -> tuple[np.ndarray, np.ndarray]:
        test = set(self.test_groups)
        is_test = np.array([g in test for g in self.groups(rows)], dtype=bool)
        return np.flatnonzero(~is_test), np.flatnonzero(is_test)

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "rule": self.rule, "test_groups": list(self.test_groups)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Split":
        return cls(tuple(d["test_groups"]), d.get("key", "model"), d.get("rule", ""))


def split_by_group(
    rows: Sequence[LabelledRow],
    test_fraction: float = 0.25,
    salt: str = DEFAULT_SPLIT_SALT,
) -> Split:
    """Deterministic group split: order groups by sha256(salt, group) and take
    groups into the test side until it holds ``test_fraction`` of the rows."""
    groups = [_group_of(r, i) for i, r in enumerate(rows)]
    sizes = Counter(groups)
    order = sorted(sizes, key=lambda g: _rank(salt, g))
    target = test_fraction * len(rows)
    test: list[str] = []
    n = 0
    for g in order:
        if n >= target or len(test) >= len(order) - 1:
            break
        test.append(g)
        n += sizes[g]
    rule = (
        f"groups ordered by sha256('{salt}', group); first groups taken until "
        f">= {test_fraction:.0%} of rows are held out"
    )
    return Split(tuple(sorted(test)), key="group/model/channel", rule=rule)


def group_folds(groups: Sequence[str], k: int, salt: str = DEFAULT_SPLIT_SALT) -> np.ndarray:
    """Fold id per row; groups dealt round-robin in hash order (each group in one fold)."""
    uniq = sorted(set(groups), key=lambda g: _rank(salt + ":folds", g))
    k = max(2, min(k, len(uniq)))
    fold_of = {g: i % k for i, g in enumerate(uniq)}
    return np.array([fold_of[g] for g in groups], dtype=int)


# ---------------------------------------------------------------- features
