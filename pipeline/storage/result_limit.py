"""The limits of analysts' queries as the user meets them: result size counted here, limit errors named.

ClickHouse enforces every limit of :class:`~pipeline.config.QueryLimits`
(``max_result_bytes`` with ``result_overflow_mode='throw'`` among them), but
it counts a constant column once per block, not once per row (``SELECT
repeat('x', 100000) FROM numbers(1000)`` passes a 10 MiB ``max_result_bytes``
and sends 95 MiB). So the rows are also counted here as they arrive, block by
block (:func:`take_rows`), and reading stops at the limit: what the client
holds stays within ``max_result_bytes`` plus one block.

:func:`limit_error` turns ClickHouse's limit errors (``TIMEOUT_EXCEEDED``,
``MEMORY_LIMIT_EXCEEDED``, ``TOO_MANY_ROWS_OR_BYTES``) into a
:class:`QueryLimitExceeded` that names the setting to raise.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any, Iterable

#: The variable of each limit (``pipeline.config`` reads them), by what ClickHouse's message says.
SETTING = {
    "bytes": "CHANNEL_HEALTH_QUERY_MAX_RESULT_BYTES",
    "rows": "CHANNEL_HEALTH_QUERY_MAX_RESULT_ROWS",
    "time": "CHANNEL_HEALTH_QUERY_MAX_EXECUTION_TIME_S",
    "memory": "CHANNEL_HEALTH_QUERY_MAX_MEMORY_BYTES",
}
_WHAT = {"bytes": "result size", "rows": "result rows", "time": "execution time", "memory": "query memory"}


class QueryLimitExceeded(RuntimeError):
    """A query was stopped by one of its limits; ``limit`` is ``"bytes"``, ``"rows"``, ``"time"`` or
    ``"memory"``, ``setting`` the environment variable that raises it. The message names both."""

    def __init__(self, limit: str, detail: str) -> None:
        self.limit, self.setting = limit, SETTING[limit]
        super().__init__(f"query stopped by its {_WHAT[limit]} limit ({detail}); narrow the query (fewer columns, "
                         f"a WHERE or LIMIT) or raise {self.setting}")


def value_bytes(value: Any) -> int:
    """Bytes ``value`` takes in a result, about as ClickHouse's Native format counts them, >= 1.

    Strings count their UTF-8 length, numbers and dates 8, arrays, tuples and
    maps the sum of their items.

    >>> value_bytes("héllo"), value_bytes(7), value_bytes([b"ab", None, {"k": 1.5}])
    (6, 8, 12)
    """
    if isinstance(value, str):
        return max(1, len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass")))
    if isinstance(value, (bytes, bytearray)):
        return max(1, len(value))
    if isinstance(value, (list, tuple, set, frozenset)):
        return max(1, sum(value_bytes(v) for v in value))
    if isinstance(value, dict):
        return max(1, sum(value_bytes(k) + value_bytes(v) for k, v in value.items()))
    if value is None:
        return 1
    if isinstance(value, (int, float, date, datetime)):
        return 8
    return 16  # UUID, Decimal, IP addresses


def take_rows(blocks: Iterable[Iterable[tuple]], max_result_bytes: int) -> list[tuple]:
    """The rows of ``blocks`` (blocks of row tuples, read lazily), counting :func:`value_bytes` as they come.

    ``max_result_bytes`` >= 1. Raises :class:`QueryLimitExceeded` (``"bytes"``)
    as soon as the rows read add up to more than it; the caller closes the
    stream (the rest is never read).
    """
    rows: list[tuple] = []
    total = 0
    for block in blocks:
        for row in block:
            total += sum(value_bytes(v) for v in row)
            rows.append(tuple(row))
        if total > max_result_bytes:
            raise QueryLimitExceeded("bytes", f"more than {max_result_bytes:,} bytes after {len(rows):,} rows")
    return rows


def limit_error(exc: BaseException) -> QueryLimitExceeded | None:
    """The :class:`QueryLimitExceeded` for a driver error that is one of ClickHouse's limits, else None.

    The detail keeps ClickHouse's own first line (its error name included).
    """
    text = str(exc)
    for name, limit in (("TOO_MANY_ROWS_OR_BYTES", "rows"), ("TIMEOUT_EXCEEDED", "time"),  # noqa: B007 (read after break)
                        ("MEMORY_LIMIT_EXCEEDED", "memory")):
        if name in text:
            break
    else:
        return None
    if limit == "rows" and "max bytes" in text:
        limit = "bytes"
    first = next((line.strip() for line in text.splitlines() if line.strip()), text)
    return QueryLimitExceeded(limit, f"ClickHouse {name}: {first[:400]}")
