"""Result output of ``channel-health query`` (issue #35 part 4): ``--format table|csv|tsv|json``.

- ``table``: :func:`pipeline.storage.query.format_table` (numbers right-aligned, long values folded, columns
  that cannot fit named, never cut silently), as wide as the terminal, or unbounded when piped.
- ``csv`` / ``tsv``: RFC 4180 via the standard :mod:`csv` module (a header row; NULL is an empty field;
  TSV is the same dialect with a tab delimiter, so a tab or newline inside a value is quoted, not lost).
- ``json``: JSON Lines, one object per row (``--json`` is the same), non-JSON values (dates, decimals) as text.

Datetimes are ISO 8601 in every format.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import sys
from datetime import date, datetime
from typing import Any, Sequence

FORMATS = ("table", "csv", "tsv", "json")
#: Table width when stdout is not a terminal: a pipe or a file gets every column, never wrapped at 80.
PIPE_WIDTH = 100_000


def _plain(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    return value


def table_width() -> int:
    """The terminal's width (``COLUMNS`` wins), or :data:`PIPE_WIDTH` when stdout is not a terminal."""
    import os

    if "COLUMNS" in os.environ or sys.stdout.isatty():
        return max(40, shutil.get_terminal_size().columns)
    return PIPE_WIDTH


def format_rows(columns: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str, width: int | None = None) -> str:
    """``rows`` (tuples in ``columns`` order) as text in ``fmt`` (one of :data:`FORMATS`), ending in a newline.

    Raises ``ValueError`` for an unknown format. ``width``: the table's width (default :func:`table_width`).
    """
    if fmt == "table":
        from pipeline.storage.query import format_table

        return format_table(columns, rows, width=width or table_width())
    if fmt in ("csv", "tsv"):
        out = io.StringIO()
        writer = csv.writer(out, delimiter="," if fmt == "csv" else "\t", lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow(["" if v is None else _plain(v) for v in row])
        return out.getvalue()
    if fmt == "json":
        return "".join(json.dumps({c: _plain(v) for c, v in zip(columns, row)}, default=str) + "\n" for row in rows)
    raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
