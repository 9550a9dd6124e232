"""Loaders for the real traces in ``../shared/data`` (SPEC §6).

Three sources feed the simulator:

``azure-llm-inference-2023/AzureLLMInferenceTrace_{conv,code}.csv``
    Columns ``TIMESTAMP, ContextTokens, GeneratedTokens`` (1 h each, Azure
    LLM inference, Nov 2023, CC-BY-4.0). Arrival timestamps give the
    inter-arrival / burst pattern; the token columns give input and output
    token counts. :func:`load_azure_trace`.
``llmperf-leaderboard/<provider>_<size>.json``
    150 per-request measurements per provider x model size (Apache-2.0):
    ``end_to_end_latency_s``, ``ttft_s``, ``inter_token_latency_s``,
    ``number_input_tokens``, ``number_output_tokens``, ``error_code``
    (``429`` -> ``rate_limited``; ``-100``, ``-1`` or any other code ->
    ``error``; ``null`` -> ``ok``, see :func:`status_for_error_code`).
    :func:`load_llmperf`, :func:`list_llmperf`.
``function-call-outputs/bfcl_outputs.jsonl``
    Real LLM function-call outputs (BFCL, Apache-2.0 rows) with
    ``expected_fields`` ``[{function, required[]}]``, ``output``,
    ``output_format``, ``error_class``. :func:`load_bfcl_rows`.

The data folder defaults to ``<repo>/../shared/data`` when that folder
exists, else to the compact samples shipped in the package
(:data:`SAMPLES_DIR`, :mod:`pipeline.tools.simulate.samples`: the same requests,
so a scenario gives the same events on either). A ``data_dir`` argument,
accepted everywhere, names a folder holding the full sets (or
:data:`SAMPLES_DIR`); a named folder that does not exist, or a missing file,
raises :class:`DataNotFoundError` naming the path (no fallback to the
samples). :func:`describe_data_source` says in one line which is in use.
Loaded traces are cached per resolved path (they are read-only).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np

from . import samples
from .samples import SAMPLES_DIR

#: ``<repo>/../shared/data``: the shared data folder beside the repository.
DEFAULT_DATA_DIR: Path = Path(__file__).resolve().parents[3].parent / "shared" / "data"

AZURE_DIR = "azure-llm-inference-2023"
LLMPERF_DIR = "llmperf-leaderboard"
BFCL_FILE = "function-call-outputs/bfcl_outputs.jsonl"

AzureKind = Literal["conv", "code"]
AZURE_FILES: dict[str, str] = {
    "conv": "AzureLLMInferenceTrace_conv.csv",
    "code": "AzureLLMInferenceTrace_code.csv",
}


class DataNotFoundError(FileNotFoundError):
    """The shared data folder or one of its files is missing."""


def resolve_data_dir(data_dir: str | Path | None = None) -> Path:
    """Return the data folder: ``data_dir`` if given, else :data:`DEFAULT_DATA_DIR`
    if it exists, else :data:`SAMPLES_DIR` (the shipped samples).

    Raises :class:`DataNotFoundError` if a given ``data_dir`` does not exist.
    """
    if data_dir is None:
        return DEFAULT_DATA_DIR.resolve() if DEFAULT_DATA_DIR.is_dir() else SAMPLES_DIR
    path = Path(data_dir).expanduser().resolve()
    if not path.is_dir():
        raise DataNotFoundError(
            f"shared data folder not found: {path} (expected the full sets as in ../shared/data; "
            f"omit the folder to use the samples shipped in {SAMPLES_DIR})"
        )
    return path


def is_samples(folder: Path) -> bool:
    """Whether the resolved data folder ``folder`` is the shipped samples (:data:`SAMPLES_DIR`)."""
    return folder == SAMPLES_DIR


def describe_data_source(data_dir: str | Path | None = None) -> str:
    """One line naming the trace source :func:`resolve_data_dir` picks, e.g. for the demo.

    ``"traces: full sets (/x/shared/data)"`` or ``"traces: shipped samples
    (pipeline/tools/simulate/samples; full sets not found at /x/shared/data)"``.
    Raises :class:`DataNotFoundError` as :func:`resolve_data_dir`.
    """
    folder = resolve_data_dir(data_dir)
    if not is_samples(folder):
        return f"traces: full sets ({folder})"
    why = "" if data_dir is not None else f"; full sets not found at {DEFAULT_DATA_DIR}"
    return f"traces: shipped samples (pipeline/tools/simulate/samples{why})"


def _require_file(path: Path) -> Path:
    if not path.is_file():
        raise DataNotFoundError(f"data file not found: {path}")
    return path


# --------------------------------------------------------------------------- azure


@dataclass(frozen=True, eq=False)
class AzureTrace:
    """One Azure LLM inference trace (1 h of a production service).

    ``arrival_s``: float64, shape (n,), seconds since the first arrival,
    non-decreasing, range [0, ~3500] (whole seconds, floor, when read from the
    shipped samples). ``context_tokens`` / ``generated_tokens``:
    int64, shape (n,), >= 0 (input and output tokens per request).
    """

    kind: str
    arrival_s: np.ndarray
    context_tokens: np.ndarray
    generated_tokens: np.ndarray

    @property
    def span_s(self) -> float:
        """Seconds from the first to the last arrival."""
        return float(self.arrival_s[-1] - self.arrival_s[0])

    @property
    def mean_rate_rps(self) -> float:
        """Mean arrival rate over the trace, requests per second."""
        return len(self.arrival_s) / max(self.span_s, 1.0)

    def counts_per_second(self) -> np.ndarray:
        """Arrivals per whole second of the trace, int64, shape (ceil(span_s),)."""
        return np.bincount(self.arrival_s.astype(np.int64))

    def burst_envelope(self, smooth_s: int = 15) -> np.ndarray:
        """Relative arrival-rate envelope of the trace, one value per second.

        The per-second arrival counts are smoothed with a centred moving
        average of ``smooth_s`` seconds (removing the trace's own Poisson
        noise, which the simulator adds back) and divided by their mean, so
        the result has mean 1.0. Shape (ceil(span_s),), values >= 0.
        Raises ``ValueError`` if ``smooth_s < 1``.
        """
        if smooth_s < 1:
            raise ValueError(f"smooth_s must be >= 1, got {smooth_s}")
        counts = self.counts_per_second().astype(np.float64)
        kernel = np.ones(smooth_s) / smooth_s
        # Pad by wrapping so the envelope can be cycled without an edge dip.
        padded = np.concatenate([counts[-smooth_s:], counts, counts[:smooth_s]])
        smooth = np.convolve(padded, kernel, mode="same")[smooth_s:-smooth_s]
        return smooth / smooth.mean()


def _parse_azure_ts(text: str) -> float:
    # "2023-11-16 18:15:46.6805900": 7 fractional digits; Python wants <= 6.
    head, _, frac = text.partition(".")
    stamp = datetime.fromisoformat(head).replace(tzinfo=timezone.utc)
    return stamp.timestamp() + (float("0." + frac) if frac else 0.0)


@lru_cache(maxsize=8)
def _load_azure_cached(path: Path, kind: str) -> AzureTrace:
    ts: list[float] = []
    ctx: list[int] = []
    gen: list[int] = []
    with _require_file(path).open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:3]] != [
            "TIMESTAMP",
            "ContextTokens",
            "GeneratedTokens",
        ]:
            raise ValueError(f"{path}: unexpected header {header!r}")
        for row in reader:
            if not row:
                continue
            ts.append(_parse_azure_ts(row[0]))
            ctx.append(int(row[1]))
            gen.append(int(row[2]))
    if len(ts) < 2:
        raise ValueError(f"{path}: fewer than 2 rows")
    arr = np.asarray(ts, dtype=np.float64)
    order = np.argsort(arr, kind="stable")
    arr = arr[order]
    arr.flags.writeable = False
    c = np.asarray(ctx, dtype=np.int64)[order]
    g = np.asarray(gen, dtype=np.int64)[order]
    c.flags.writeable = False
    g.flags.writeable = False
    rel = arr - arr[0]
    rel.flags.writeable = False
    return AzureTrace(kind=kind, arrival_s=rel, context_tokens=c, generated_tokens=g)


def load_azure_trace(kind: AzureKind = "conv", data_dir: str | Path | None = None) -> AzureTrace:
    """Load ``AzureLLMInferenceTrace_<kind>.csv`` (``kind`` in ``conv``, ``code``).

    ``conv``: 19,365 requests in ~3,500 s (mean 5.5 req/s, mild bursts);
    ``code``: 8,818 requests (mean 2.6 req/s, very bursty). Raises
    ``ValueError`` for an unknown kind, :class:`DataNotFoundError` if missing.
    """
    if kind not in AZURE_FILES:
        raise ValueError(f"unknown Azure trace kind {kind!r}; valid: {sorted(AZURE_FILES)}")
    folder = resolve_data_dir(data_dir)
    if is_samples(folder):
        return _load_azure_sample(kind)
    return _load_azure_cached(folder / AZURE_DIR / AZURE_FILES[kind], kind)


@lru_cache(maxsize=2)
def _load_azure_sample(kind: str) -> AzureTrace:
    arrival, ctx, gen = samples.read_azure(kind)
    for a in (arrival, ctx, gen):
        a.flags.writeable = False
    return AzureTrace(kind=kind, arrival_s=arrival, context_tokens=ctx, generated_tokens=gen)


# --------------------------------------------------------------------------- llmperf


def status_for_error_code(code: int | None) -> str:
    """Map an llmperf ``error_code`` to a RequestEvent ``status``.

    ``None`` -> ``"ok"``; ``429`` -> ``"rate_limited"``; anything else
    (``-100`` "output too few tokens", ``-1``, other HTTP codes) -> ``"error"``.

    >>> [status_for_error_code(c) for c in (None, 429, -100, -1, 500)]
    ['ok', 'rate_limited', 'error', 'error', 'error']
    """
    if code is None:
        return "ok"
    if int(code) == 429:
        return "rate_limited"
    return "error"


@dataclass(frozen=True, eq=False)
class LlmperfTrace:
    """The per-request measurements of one llmperf-leaderboard file, in file order.

    Arrays have shape (n,), n = number of requests (150, 145 for
    ``replicate_70b``). Seconds: ``e2e_latency_s``, ``ttft_s``,
    ``inter_token_latency_s`` (all >= 0; failed requests often have 0).
    Tokens: ``input_tokens``, ``output_tokens`` (int64 >= 0).
    ``error_code``: list of ``int | None``; ``status``: list of
    ``ok``/``rate_limited``/``error`` (:func:`status_for_error_code`);
    ``error_msg``: list of str.
    """

    name: str
    provider: str
    size: str
    e2e_latency_s: np.ndarray
    ttft_s: np.ndarray
    inter_token_latency_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    error_code: tuple[int | None, ...]
    status: tuple[str, ...]
    error_msg: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.status)

    @property
    def ok_mask(self) -> np.ndarray:
        """Boolean mask (n,) of successful requests with a positive latency."""
        return np.array([s == "ok" for s in self.status]) & (self.e2e_latency_s > 0)

    @property
    def failure_share(self) -> float:
        """Share of requests whose status is not ``ok`` (0..1)."""
        return sum(s != "ok" for s in self.status) / max(len(self.status), 1)


def _num(value: object) -> float:
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0
    return out if np.isfinite(out) and out >= 0 else 0.0


@lru_cache(maxsize=64)
def _load_llmperf_cached(path: Path) -> LlmperfTrace:
    with _require_file(path).open() as fh:
        rows = json.load(fh)
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{path}: expected a non-empty JSON list of request records")
    return _llmperf_from_rows(path.stem, rows)


@lru_cache(maxsize=64)
def _load_llmperf_sample(stem: str) -> LlmperfTrace:
    rows = samples.read_llmperf().get(stem)
    if not rows:
        raise DataNotFoundError(f"no llmperf file {stem!r} in the shipped samples ({SAMPLES_DIR})")
    return _llmperf_from_rows(stem, rows)


def _llmperf_from_rows(stem: str, rows: list[dict]) -> LlmperfTrace:
    provider, _, size = stem.rpartition("_")
    codes: list[int | None] = []
    for r in rows:
        code = r.get("error_code")
        codes.append(None if code is None else int(code))

    def arr(key: str) -> np.ndarray:
        a = np.array([_num(r.get(key)) for r in rows], dtype=np.float64)
        a.flags.writeable = False
        return a

    def iarr(key: str) -> np.ndarray:
        a = np.array([int(_num(r.get(key))) for r in rows], dtype=np.int64)
        a.flags.writeable = False
        return a

    return LlmperfTrace(
        name=stem,
        provider=provider or stem,
        size=size,
        e2e_latency_s=arr("end_to_end_latency_s"),
        ttft_s=arr("ttft_s"),
        inter_token_latency_s=arr("inter_token_latency_s"),
        input_tokens=iarr("number_input_tokens"),
        output_tokens=iarr("number_output_tokens"),
        error_code=tuple(codes),
        status=tuple(status_for_error_code(c) for c in codes),
        error_msg=tuple(str(r.get("error_msg") or "") for r in rows),
    )


def list_llmperf(data_dir: str | Path | None = None) -> list[str]:
    """Names (file stems, e.g. ``groq_70b``) of all llmperf files, sorted.

    Raises :class:`DataNotFoundError` if the folder is missing or empty.
    """
    root = resolve_data_dir(data_dir)
    if is_samples(root):
        return sorted(samples.read_llmperf())
    folder = root / LLMPERF_DIR
    names = sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []
    if not names:
        raise DataNotFoundError(f"no llmperf files (*.json) in {folder}")
    return names


def load_llmperf(name: str, data_dir: str | Path | None = None) -> LlmperfTrace:
    """Load ``llmperf-leaderboard/<name>.json`` (``name`` e.g. ``"groq_70b"``).

    Raises :class:`DataNotFoundError` if the file is missing, ``ValueError``
    if it is not a JSON list.
    """
    folder = resolve_data_dir(data_dir)
    if is_samples(folder):
        return _load_llmperf_sample(name)
    return _load_llmperf_cached(folder / LLMPERF_DIR / f"{name}.json")


# --------------------------------------------------------------------------- bfcl


@lru_cache(maxsize=4)
def _load_bfcl_cached(path: Path) -> tuple[dict, ...]:
    out = []
    with _require_file(path).open() as fh:
        for line in fh:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return tuple(out)


def load_bfcl_rows(data_dir: str | Path | None = None) -> tuple[dict, ...]:
    """All rows of ``function-call-outputs/bfcl_outputs.jsonl`` (1,673 dicts).

    From the shipped samples: the 770 rows the answer bank uses, each with
    its ``line`` in the full file. Rows are shared (cached); do not mutate
    them. Raises :class:`DataNotFoundError` if the file is missing.
    """
    folder = resolve_data_dir(data_dir)
    if is_samples(folder):
        return _load_bfcl_sample()
    return _load_bfcl_cached(folder / BFCL_FILE)


@lru_cache(maxsize=1)
def _load_bfcl_sample() -> tuple[dict, ...]:
    return tuple(samples.read_bfcl())
