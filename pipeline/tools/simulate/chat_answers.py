"""Free-text chat answers for ``response_text`` / ``prompt_text``, from MT-bench (SPEC §5.4, §6).

Source: ``llm-answers-judged/mt_bench_judged.jsonl`` (MT-bench and Vicuna
bench answers of many models with GPT-4 ratings 1-10; see that folder's
``SOURCES_AND_LICENSES.txt``). The pool holds *good* answers only: first
turns rated >= :data:`GOOD_SCORE`, 200-1,200 characters (one read of the
embedding model, no tail), one answer per question (chosen by a stable
hash of the row id), the first ``size`` questions in that hash order.

A channel with ``chat_share > 0`` sends these as healthy answers. Under a
``quality_drift`` fault an answer turns *useless* while the event keeps its
``ok`` status, latency and fields (SPEC §5.4), in one of three ways:

``refusal``    a canned refusal (:data:`REFUSALS`) instead of an answer;
``truncated``  the answer cut off after its first ~10 % (60-150 characters,
               mid-sentence), as when a provider stops generating;
``off_topic``  a good answer to *another* question of the pool (a mixed-up
               or cached response), :data:`OFF_TOPIC_SHIFT` questions away.

Variants are deterministic per (answer, kind), so a scenario uses a small,
fixed set of distinct texts (the scorer's caches then encode each once).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from . import samples
from .traces import DataNotFoundError, is_samples, resolve_data_dir

ANSWERS_FILE = "llm-answers-judged/mt_bench_judged.jsonl"
#: Rating (1-10) from which an answer counts as good.
GOOD_SCORE = 8.0
#: Answer length range kept in the pool, characters.
MIN_CHARS, MAX_CHARS = 200, 1200
#: Default number of questions (answers) in the pool.
DEFAULT_POOL_SIZE = 32
#: Longest ``prompt_text`` sent, characters (gateways truncate prompts, SPEC §3).
PROMPT_MAX_CHARS = 300
#: An ``off_topic`` answer is the pool answer this many questions further on.
OFF_TOPIC_SHIFT = 7

USELESS_KINDS: tuple[str, ...] = ("refusal", "truncated", "off_topic")

#: Canned refusals of the kind deployed models give when a safety filter or a
#: broken system prompt trips (written for the simulator).
REFUSALS: tuple[str, ...] = (
    "I'm sorry, but as an AI language model I cannot help with that request.",
    "I'm sorry, but I can't assist with that.",
    "As an AI language model, I am unable to provide an answer to this question.",
    "I apologize, but I am not able to help with this request.",
    "I'm unable to help with that. Is there anything else I can do for you?",
    "As a language model, I don't have the ability to answer that.",
)


@dataclass(frozen=True)
class ChatAnswer:
    """One good answer and its useless variants (``useless[kind]``)."""

    question: str
    prompt: str
    text: str
    score: float
    useless: dict[str, str]


def _truncate(text: str) -> str:
    cut = min(150, max(60, len(text) // 10))
    return text[:cut].rstrip()


def pick_rows(rows: list[dict], size: int) -> list[tuple[str, dict]]:
    """The pool's ``(question, row)`` pairs: the first ``size`` questions in hash order (module doc).

    Any superset of the picked rows picks the same pairs, which is what lets
    the shipped sample (:mod:`pipeline.tools.simulate.samples`) hold only those.
    """
    good = [
        r for r in rows
        if r.get("turn") == 1 and isinstance(r.get("score"), (int, float)) and r["score"] >= GOOD_SCORE
        and isinstance(r.get("response"), str) and MIN_CHARS <= len(r["response"].strip()) <= MAX_CHARS
        and isinstance(r.get("prompt"), str) and r["prompt"].strip()
    ]
    by_q: dict[str, dict] = {}
    for r in sorted(good, key=lambda r: hashlib.sha256(str(r["id"]).encode()).hexdigest()):
        by_q.setdefault(f"{r.get('dataset')}:{r.get('question_id')}", r)
    return list(by_q.items())[:size]


def _build(rows: list[dict], size: int) -> tuple[ChatAnswer, ...]:
    picked = pick_rows(rows, size)
    if len(picked) < 2:
        raise ValueError(f"{ANSWERS_FILE}: fewer than 2 usable good answers")
    texts = [r["response"].strip() for _, r in picked]
    out = []
    for i, (q, r) in enumerate(picked):
        out.append(ChatAnswer(
            question=q,
            prompt=r["prompt"].strip()[:PROMPT_MAX_CHARS],
            text=texts[i],
            score=float(r["score"]),
            useless={
                "refusal": REFUSALS[i % len(REFUSALS)],
                "truncated": _truncate(texts[i]),
                "off_topic": texts[(i + OFF_TOPIC_SHIFT) % len(texts)],
            },
        ))
    return tuple(out)


@lru_cache(maxsize=4)
def _pool_cached(path: Path, size: int) -> tuple[ChatAnswer, ...]:
    if not path.is_file():
        raise DataNotFoundError(f"data file not found: {path}")
    with path.open(encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return _build(rows, size)


@lru_cache(maxsize=4)
def _pool_sample(size: int) -> tuple[ChatAnswer, ...]:
    if size > samples.CHAT_POOL_SIZE:
        raise ValueError(
            f"the shipped samples hold {samples.CHAT_POOL_SIZE} answers, {size} asked; "
            "pass data_dir with the full set (../shared/data)"
        )
    return _build(samples.read_chat(), size)


def load_chat_pool(data_dir: str | Path | None = None, size: int = DEFAULT_POOL_SIZE) -> tuple[ChatAnswer, ...]:
    """The pool of good chat answers (cached per data folder and size).

    From the shipped samples (:mod:`pipeline.tools.simulate.samples`) the pool is
    the same as from the full set for ``size`` up to
    :data:`~pipeline.tools.simulate.samples.CHAT_POOL_SIZE`. Raises
    :class:`~pipeline.tools.simulate.traces.DataNotFoundError` if the file is
    missing, ``ValueError`` if fewer than 2 answers qualify or (samples) if
    ``size`` exceeds the sample.
    """
    folder = resolve_data_dir(data_dir)
    if is_samples(folder):
        return _pool_sample(int(size))
    return _pool_cached(folder / ANSWERS_FILE, int(size))
