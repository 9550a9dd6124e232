"""Feature recipes: how (prompt, response) pairs become a feature vector.

A recipe is named and versioned (``plain-v1``, ``rich-v1``); its name is
stored in the artifact metadata, and loading a model rebuilds exactly that
recipe. Changing what a recipe computes means adding a new name, never
editing an old one.

Inputs of every recipe (:class:`FeatureInputs`):

- ``resp``: embedding of the (cleaned, head-truncated) response, ``[n, d]``
- ``tail``: embedding of the response's last ``TAIL_CHARS`` characters
  (equal to ``resp`` for short answers) - the model reads only 256 word
  pieces, so a rambling or cut-off ending is otherwise invisible
- ``prompt``: embedding of the prompt, ``[n, d]`` (zeros where absent)
- ``has_prompt``: bool mask
- ``stats``: cheap text statistics (:func:`text_stats`), ``[n, k]``

Recipes:

``plain-v1``  response, prompt*response, cos(prompt, response), log length
              (the baseline the issue describes)
``rich-v1``   plain-v1 plus prompt embedding, |prompt - response|, the tail
              embedding, cos(tail, response), cos(tail, prompt) and the text
              statistics (length, lines, repetition, refusal phrases, code
              fences, cut-off ending, ...) and hinges on log length
``*-noprompt`` the same recipe restricted to response-only features; used
              for rows without a prompt
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from pipeline.quality.embedding import MAX_CHARS, TAIL_CHARS, clean_text

LENGTH_CAP = 8000
"""Lengths above this (characters) are clipped: a 1 MB body is not 'thorough'."""

_REFUSAL = re.compile(
    r"\b(i'?m sorry|i am sorry|i apologi[sz]e|as an ai|as a language model|"
    r"i (?:cannot|can't|can not|am unable to|am not able to|won't)|"
    r"unable to (?:help|assist|provide)|i don't have (?:access|the ability))",
    re.IGNORECASE,
)
_WORD = re.compile(r"\w+", re.UNICODE)

STAT_NAMES = (
    "log_chars",
    "log_words",
    "log_lines",
    "frac_digits",
    "frac_non_ascii",
    "frac_upper",
    "frac_punct",
    "unique_word_ratio",
    "dup_line_ratio",
    "refusal_hits",
    "has_code_fence",
    "ends_clean",
    "has_list",
    "log_prompt_chars",
    "log_len_ratio",
    "is_empty",
)


def _as_str(x: Any) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, (bytes, bytearray, memoryview)):
        return bytes(x)[: 16 * MAX_CHARS].decode("utf-8", errors="replace")
    return ""


def text_stats(prompt: Any, response: Any) -> np.ndarray:
    """Cheap, language-agnostic statistics of one response (and its prompt)."""
    r = _as_str(response)
    p = _as_str(prompt)
    n_raw = len(r)
    r = r[: 4 * MAX_CHARS]
    n = max(len(r), 1)
    words = _WORD.findall(r.lower())
    lines = [ln.strip() for ln in r.splitlines() if ln.strip()]
    stripped = r.rstrip()
    chars = min(n_raw, LENGTH_CAP)
    pchars = min(len(p), LENGTH_CAP)
    return np.array(
        [
            math.log1p(chars),
            math.log1p(min(len(words), LENGTH_CAP // 4)),
            math.log1p(min(len(lines), 400)),
            sum(c.isdigit() for c in r) / n,
            sum(ord(c) > 127 for c in r) / n,
            sum(c.isupper() for c in r) / n,
            sum((not c.isalnum()) and (not c.isspace()) for c in r) / n,
            len(set(words)) / len(words) if words else 0.0,
            1.0 - len(set(lines)) / len(lines) if lines else 0.0,
            min(len(_REFUSAL.findall(r[:2000])), 5),
            float("```" in r),
            float(bool(stripped) and stripped[-1] in ".!?)]}\"'`*:;>|"),
            float(bool(re.search(r"^\s*(?:\d+[.)]|[-*•])\s", r, re.MULTILINE))),
            math.log1p(pchars),
            math.log1p(chars) - math.log1p(pchars),
            float(not r.strip()),
        ],
        dtype=np.float64,
    )


def tail_of(response: Any, tail_chars: int = TAIL_CHARS) -> str:
    """Cleaned last ``tail_chars`` characters of a response (cheap for 1 MB bodies)."""
    if isinstance(response, str):
        response = response[-4 * tail_chars :]
    elif isinstance(response, (bytes, bytearray)):
        response = bytes(response)[-4 * tail_chars :]
    text, _ = clean_text(response, max_chars=4 * tail_chars)
    return text[-tail_chars:]


@dataclass
class FeatureInputs:
    """Per-row embeddings and statistics shared by all recipes."""

    resp: np.ndarray
    tail: np.ndarray
    prompt: np.ndarray
    has_prompt: np.ndarray
    stats: np.ndarray

    def __len__(self) -> int:
        return int(self.resp.shape[0])

    def subset(self, idx: np.ndarray) -> "FeatureInputs":
        return FeatureInputs(
            self.resp[idx], self.tail[idx], self.prompt[idx], self.has_prompt[idx], self.stats[idx]
        )


def _rowdot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", a.astype(np.float64), b.astype(np.float64))[:, None]


def _log_len(f: FeatureInputs) -> np.ndarray:
    return f.stats[:, [STAT_NAMES.index("log_chars")]]


LENGTH_KNOTS = (3.0, 4.0, 5.0, 6.0, 7.0, 8.0)
"""Hinge knots on log1p(characters) (about 20, 55, 150, 400, 1100, 3000 chars)."""


def _length_spline(f: FeatureInputs) -> np.ndarray:
    """Piecewise-linear basis on log length: very short and very long both look bad."""
    ll = _log_len(f)
    return np.hstack([np.maximum(ll - k, 0.0) for k in LENGTH_KNOTS])


def _plain(f: FeatureInputs) -> np.ndarray:
    return np.hstack([f.resp, f.prompt * f.resp, _rowdot(f.prompt, f.resp), _log_len(f)])


def _plain_noprompt(f: FeatureInputs) -> np.ndarray:
    return np.hstack([f.resp, _log_len(f)])


def _rich(f: FeatureInputs) -> np.ndarray:
    return np.hstack(
        [
            f.resp,
            f.prompt,
            f.prompt * f.resp,
            np.abs(f.prompt - f.resp),
            f.tail,
            _rowdot(f.prompt, f.resp),
            _rowdot(f.tail, f.resp),
            _rowdot(f.tail, f.prompt),
            f.stats,
            _length_spline(f),
        ]
    )


def _rich_noprompt(f: FeatureInputs) -> np.ndarray:
    return np.hstack([f.resp, f.tail, _rowdot(f.tail, f.resp), f.stats, _length_spline(f)])


def _length_only(f: FeatureInputs) -> np.ndarray:
    return _log_len(f)


@dataclass(frozen=True)
class Recipe:
    """A named, versioned feature recipe."""

    name: str
    build: Callable[[FeatureInputs], np.ndarray]
    uses_prompt: bool
    uses_tail: bool
    description: str

    def __call__(self, f: FeatureInputs) -> np.ndarray:
        return np.ascontiguousarray(self.build(f), dtype=np.float64)


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe("length-v1", _length_only, False, False, "log1p(response characters)"),
        Recipe(
            "plain-v1",
            _plain,
            True,
            False,
            "[resp, prompt*resp, cos(prompt,resp), log1p(chars)]",
        ),
        Recipe("plain-v1-noprompt", _plain_noprompt, False, False, "[resp, log1p(chars)]"),
        Recipe(
            "rich-v1",
            _rich,
            True,
            True,
            "[resp, prompt, prompt*resp, |prompt-resp|, tail, cos(prompt,resp), "
            "cos(tail,resp), cos(tail,prompt), text stats, log-length hinges]",
        ),
        Recipe(
            "rich-v1-noprompt",
            _rich_noprompt,
            False,
            True,
            "[resp, tail, cos(tail,resp), text stats, log-length hinges]",
        ),
    )
}


def recipe_params() -> dict[str, Any]:
    """Constants every recipe depends on; stored in the artifact, checked on load."""
    return {
        "max_chars": MAX_CHARS,
        "tail_chars": TAIL_CHARS,
        "length_cap": LENGTH_CAP,
        "length_knots": list(LENGTH_KNOTS),
        "stat_names": list(STAT_NAMES),
    }


def get_recipe(name: str) -> Recipe:
    """Look a recipe up by name; unknown names are a ``KeyError`` naming the known ones."""
    try:
        return RECIPES[name]
    except KeyError:
        raise KeyError(f"unknown feature recipe {name!r}; known: {sorted(RECIPES)}") from None


def noprompt_variant(name: str) -> str | None:
    """The response-only recipe paired with ``name`` (``None`` if it has none)."""
    cand = f"{name}-noprompt"
    return cand if cand in RECIPES else None


def build_inputs(
    prompts: Sequence[Any] | None,
    responses: Sequence[Any],
    encode: Callable[[list[str]], np.ndarray],
    clean: Callable[[Any], str],
    dim: int,
    need_tail: bool = True,
    need_prompt: bool = True,
) -> FeatureInputs:
    """Embed and measure rows. ``encode`` maps cleaned texts to embeddings.

    Distinct texts are encoded once (prompts repeat a lot; short answers'
    tails are the answers themselves).
    """
    n = len(responses)
    if prompts is None:
        prompts = [None] * n
    if len(prompts) != n:
        raise ValueError(f"{len(prompts)} prompts for {n} responses")
    resp_clean = [clean(r) for r in responses]
    prompt_clean = [clean(p) if need_prompt else "" for p in prompts]
    has_prompt = np.array([bool(p) for p in prompt_clean])
    tails = [tail_of(r) if need_tail else "" for r in responses]
    wanted: list[str] = list(resp_clean)
    if need_prompt:
        wanted += [p for p in prompt_clean if p]
    if need_tail:
        wanted += tails
    uniq = list(dict.fromkeys(wanted))
    vecs = encode(uniq) if uniq else np.zeros((0, dim), np.float32)
    index = {t: i for i, t in enumerate(uniq)}
    resp = vecs[[index[t] for t in resp_clean]] if n else np.zeros((0, dim), np.float32)
    prompt = np.zeros((n, dim), dtype=np.float32)
    for i, p in enumerate(prompt_clean):
        if p:
            prompt[i] = vecs[index[p]]
    tail = vecs[[index[t] for t in tails]] if (need_tail and n) else resp.copy()
    stats = (
        np.vstack([text_stats(p, r) for p, r in zip(prompts, responses)])
        if n
        else np.zeros((0, len(STAT_NAMES)))
    )
    return FeatureInputs(resp, tail, prompt, has_prompt, stats)
