"""Compact samples of the real traces, shipped in the package (SPEC §6).

Used by the loaders of :mod:`pipeline.tools.simulate.traces` when the full sets
(``../shared/data``) are absent, so the demo and the simulator run from a
plain clone. Each file is derived from one full set by :mod:`.derive`
(deterministic; ``python -m pipeline.tools.simulate.samples.derive``) and keeps
exactly what the simulator reads, so a scenario built on the samples yields
the same events as on the full sets. ``README.md`` beside this file says
what each sample holds; each source's licence and attribution lie in the
sample's folder.

``azure-llm-inference-2023/AzureLLMInferenceTrace_{conv,code}.csv.gz``
    Every request of the trace, in arrival order: ``second_step`` (whole
    seconds since the previous request's whole second of arrival, counted
    from the first arrival, floor; their running sum is the arrival second),
    ``ContextTokens``, ``GeneratedTokens``.
``llmperf-leaderboard/llmperf.jsonl.gz``
    Every request of the 19 files, one JSON object a line: ``file`` (stem)
    and the seven fields the simulator reads (:data:`LLMPERF_FIELDS`).
``function-call-outputs/bfcl_outputs.jsonl.gz``
    The 770 rows the answer bank uses (healthy native tool calls), with
    ``line`` (0-based line in the full file), attribution (``source``,
    ``license``, ``model``, ``id``) and the fields the bank reads; prompts
    cut to 300 characters (what an event carries).
``llm-answers-judged/mt_bench_judged.jsonl.gz``
    The :data:`CHAT_POOL_SIZE` answers the chat pool picks first, with
    attribution (``source``, ``license``, ``model``, ``id``).

The readers raise ``ValueError`` naming the file for a malformed sample and
:class:`FileNotFoundError` if one is missing (a broken install).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path

import numpy as np

#: This folder: the shipped samples (package data).
SAMPLES_DIR: Path = Path(__file__).resolve().parent

AZURE_SAMPLE = "azure-llm-inference-2023/AzureLLMInferenceTrace_{kind}.csv.gz"
AZURE_HEADER = ["second_step", "ContextTokens", "GeneratedTokens"]
LLMPERF_SAMPLE = "llmperf-leaderboard/llmperf.jsonl.gz"
#: The llmperf fields the simulator reads (:func:`pipeline.tools.simulate.traces.load_llmperf`).
LLMPERF_FIELDS: tuple[str, ...] = (
    "end_to_end_latency_s", "ttft_s", "inter_token_latency_s", "number_input_tokens",
    "number_output_tokens", "error_code", "error_msg",
)
BFCL_SAMPLE = "function-call-outputs/bfcl_outputs.jsonl.gz"
#: The BFCL fields kept per row (attribution first, then what the answer bank reads).
BFCL_FIELDS: tuple[str, ...] = (
    "source", "license", "model", "id", "prompt", "expected_fields", "output", "output_format", "error_class",
)
CHAT_SAMPLE = "llm-answers-judged/mt_bench_judged.jsonl.gz"
#: The MT-bench fields kept per answer (attribution first, then what the chat pool reads).
CHAT_FIELDS: tuple[str, ...] = (
    "source", "license", "model", "id", "dataset", "question_id", "turn", "category", "score", "prompt", "response",
)
#: Answers (questions) in the shipped chat pool: twice the simulator's default pool of 32.
CHAT_POOL_SIZE = 64


def _read_text(name: str) -> str:
    path = SAMPLES_DIR / name
    if not path.is_file():
        raise FileNotFoundError(f"shipped sample missing: {path} (a broken install of the package?)")
    return gzip.decompress(path.read_bytes()).decode("utf-8")


def _read_jsonl(name: str) -> list[dict]:
    out = []
    for n, line in enumerate(_read_text(name).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{SAMPLES_DIR / name}: line {n} is not JSON ({exc})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{SAMPLES_DIR / name}: line {n} is not a JSON object")
        out.append(row)
    return out


def read_azure(kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The Azure sample of ``kind`` (``conv`` or ``code``) as three arrays of shape (n,).

    Returns ``(arrival_s, context_tokens, generated_tokens)``: float64 whole
    seconds since the first arrival (non-decreasing, starting at 0), and two
    int64 token counts >= 0. Raises ``ValueError`` for a malformed file.
    """
    name = AZURE_SAMPLE.format(kind=kind)
    reader = csv.reader(io.StringIO(_read_text(name)))
    if next(reader, None) != AZURE_HEADER:
        raise ValueError(f"{SAMPLES_DIR / name}: header is not {','.join(AZURE_HEADER)}")
    try:
        rows = np.array([[int(v) for v in row] for row in reader if row], dtype=np.int64)
    except ValueError as exc:
        raise ValueError(f"{SAMPLES_DIR / name}: {exc}") from None
    if rows.ndim != 2 or rows.shape[1] != 3 or len(rows) < 2:
        raise ValueError(f"{SAMPLES_DIR / name}: expected >= 2 rows of 3 integers")
    if rows[0, 0] != 0 or np.any(rows < 0):
        raise ValueError(f"{SAMPLES_DIR / name}: the first second_step must be 0, all values >= 0")
    return np.cumsum(rows[:, 0]).astype(np.float64), rows[:, 1].copy(), rows[:, 2].copy()


def read_llmperf() -> dict[str, list[dict]]:
    """The llmperf sample: request records by file stem (e.g. ``groq_70b``), in file order.

    Each record holds :data:`LLMPERF_FIELDS` as in the full files.
    Raises ``ValueError`` for a malformed file.
    """
    out: dict[str, list[dict]] = {}
    for row in _read_jsonl(LLMPERF_SAMPLE):
        stem = row.get("file")
        if not isinstance(stem, str) or not stem:
            raise ValueError(f"{SAMPLES_DIR / LLMPERF_SAMPLE}: a record without its 'file'")
        out.setdefault(stem, []).append(row)
    return out


def read_bfcl() -> list[dict]:
    """The BFCL sample rows (:data:`BFCL_FIELDS` plus ``line``), in full-file order."""
    return _read_jsonl(BFCL_SAMPLE)


def read_chat() -> list[dict]:
    """The MT-bench sample rows (:data:`CHAT_FIELDS`), :data:`CHAT_POOL_SIZE` answers."""
    return _read_jsonl(CHAT_SAMPLE)
