"""Regenerate the shipped samples from the full sets (deterministic).

Usage::

    python -m pipeline.tools.simulate.samples.derive [--data-dir ../shared/data] [--check]

Reads the full sets with the loaders of :mod:`pipeline.tools.simulate.traces`,
writes the files named in :mod:`pipeline.tools.simulate.samples` (gzip, mtime 0)
and copies each source's licence and attribution file beside its sample.
``--check`` writes nothing and exits 1 if a shipped sample's content differs
from its derivation (the gzip bytes may differ between zlib builds; the
comparison is on the decompressed text).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import sys
from pathlib import Path

from . import (
    AZURE_HEADER,
    AZURE_SAMPLE,
    BFCL_FIELDS,
    BFCL_SAMPLE,
    CHAT_FIELDS,
    CHAT_POOL_SIZE,
    CHAT_SAMPLE,
    LLMPERF_FIELDS,
    LLMPERF_SAMPLE,
    SAMPLES_DIR,
)

#: Licence and attribution files copied beside the samples (path in the full sets).
LICENCE_FILES: tuple[str, ...] = (
    "azure-llm-inference-2023/LICENSE",
    "llmperf-leaderboard/LICENSE",
    "function-call-outputs/SOURCES_AND_LICENSES.txt",
    "llm-answers-judged/SOURCES_AND_LICENSES.txt",
)


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in rows)


def azure_text(kind: str, data_dir: Path) -> str:
    """CSV of every request of the ``kind`` trace: step of the whole arrival second, tokens."""
    import numpy as np

    from ..traces import load_azure_trace

    tr = load_azure_trace(kind, data_dir)  # type: ignore[arg-type]
    steps = np.diff(tr.arrival_s.astype(np.int64), prepend=0)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(AZURE_HEADER)
    for step, c, g in zip(steps.tolist(), tr.context_tokens.tolist(), tr.generated_tokens.tolist()):
        w.writerow((step, c, g))
    return buf.getvalue()


def llmperf_text(data_dir: Path) -> str:
    """JSON lines of every llmperf request: ``file`` + :data:`LLMPERF_FIELDS`, raw values."""
    from ..traces import LLMPERF_DIR, list_llmperf

    rows = []
    for stem in list_llmperf(data_dir):
        for r in json.loads((data_dir / LLMPERF_DIR / f"{stem}.json").read_text()):
            rows.append({"file": stem, **{k: r.get(k) for k in LLMPERF_FIELDS}})
    return _jsonl(rows)


def bfcl_text(data_dir: Path) -> str:
    """JSON lines of the BFCL rows the answer bank uses, with ``line`` and prompts cut to 300 chars."""
    from ..answers import PROMPT_MAX_CHARS, row_answers
    from ..traces import load_bfcl_rows

    rows = []
    for i, r in enumerate(load_bfcl_rows(data_dir)):
        if row_answers(i, r) is None:
            continue
        row = {"line": i, **{k: r.get(k) for k in BFCL_FIELDS}}
        row["prompt"] = str(row.get("prompt") or "")[:PROMPT_MAX_CHARS]
        rows.append(row)
    return _jsonl(rows)


def chat_text(data_dir: Path) -> str:
    """JSON lines of the first :data:`CHAT_POOL_SIZE` chat-pool answers (hash order)."""
    from ..chat_answers import ANSWERS_FILE, pick_rows

    path = data_dir / ANSWERS_FILE
    with path.open(encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return _jsonl([{k: r.get(k) for k in CHAT_FIELDS} for _, r in pick_rows(rows, CHAT_POOL_SIZE)])


def derive_all(data_dir: Path) -> dict[str, str]:
    """Sample file name (relative to :data:`SAMPLES_DIR`) -> its text, from the full sets in ``data_dir``."""
    out = {AZURE_SAMPLE.format(kind=k): azure_text(k, data_dir) for k in ("conv", "code")}
    out[LLMPERF_SAMPLE] = llmperf_text(data_dir)
    out[BFCL_SAMPLE] = bfcl_text(data_dir)
    out[CHAT_SAMPLE] = chat_text(data_dir)
    return out


def main(argv: list[str] | None = None) -> int:
    """Command line: write (or ``--check``) the samples; returns an exit code."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=None, help="The full sets (default ../shared/data).")
    ap.add_argument("--check", action="store_true", help="Compare with the shipped samples; write nothing.")
    args = ap.parse_args(argv)
    from ..traces import DEFAULT_DATA_DIR, DataNotFoundError, resolve_data_dir

    try:
        data_dir = resolve_data_dir(args.data_dir if args.data_dir is not None else DEFAULT_DATA_DIR)
        texts = derive_all(data_dir)
    except DataNotFoundError as exc:
        print(f"derive: {exc}", file=sys.stderr)
        return 2
    differ = []
    for name, text in texts.items():
        path = SAMPLES_DIR / name
        if args.check:
            if not path.is_file() or gzip.decompress(path.read_bytes()).decode("utf-8") != text:
                differ.append(name)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0))
        print(f"{path.relative_to(SAMPLES_DIR)}: {len(text.splitlines()):,} lines, {path.stat().st_size:,} bytes")
    for name in LICENCE_FILES:
        src, dst = data_dir / name, SAMPLES_DIR / name
        if args.check:
            if not dst.is_file() or dst.read_bytes() != src.read_bytes():
                differ.append(name)
        else:
            dst.write_bytes(src.read_bytes())
    if differ:
        print(f"derive --check: differs from its derivation: {', '.join(differ)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
