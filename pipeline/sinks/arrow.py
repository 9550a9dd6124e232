"""Arrow blocks for ClickHouse inserts: type mapping and row/column conversion.

:class:`~pipeline.sinks.table.TableSink` (the verdict and quality tables)
buffers and writes pyarrow tables (``client.insert_arrow``): the Python cost
per value is one list element handed to ``pyarrow.array`` (C++), and
ClickHouse parses the Arrow stream natively, instead of clickhouse-connect
serialising every value in Python; pyarrow also checks every value against
its column's type when the rows are added, not at the insert.
(``request_events`` rows go as JSON, :mod:`pipeline.sinks.json_table`.) Types follow the
ClickHouse ↔ Arrow table of the ClickHouse docs (Formats → Arrow):
``DateTime64(3, 'UTC')`` is an Arrow ``timestamp('ms', 'UTC')`` built from
UTC epoch milliseconds, so no value is ever read as local time.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

import pyarrow as pa

_SIMPLE = {
    "String": pa.string(),
    "Float64": pa.float64(),
    "Float32": pa.float32(),
    "UInt8": pa.uint8(),
    "UInt16": pa.uint16(),
    "UInt32": pa.uint32(),
    "UInt64": pa.uint64(),
    "Int8": pa.int8(),
    "Int16": pa.int16(),
    "Int32": pa.int32(),
    "Int64": pa.int64(),
    "Bool": pa.bool_(),
}
_WRAPPED = re.compile(r"^(LowCardinality|Nullable|Array)\((.*)\)$")
_DATETIME64 = re.compile(r"^DateTime64\((\d)(?:\s*,\s*'([^']*)')?\)$")
_UNITS = {0: "s", 3: "ms", 6: "us", 9: "ns"}


def arrow_type(ch_type: str) -> pa.DataType:
    """The Arrow type that carries values of the ClickHouse type ``ch_type``.

    ``LowCardinality`` and ``Nullable`` wrap the inner type (Arrow columns are
    nullable anyway). Raises ``ValueError`` for a type the sink does not write.

    >>> arrow_type("LowCardinality(Nullable(String))"), arrow_type("Array(String)")
    (DataType(string), ListType(list<item: string>))
    >>> arrow_type("DateTime64(3, 'UTC')")
    TimestampType(timestamp[ms, tz=UTC])
    """
    ch_type = ch_type.strip()
    if ch_type in _SIMPLE:
        return _SIMPLE[ch_type]
    m = _WRAPPED.match(ch_type)
    if m:
        inner = arrow_type(m.group(2))
        return pa.list_(inner) if m.group(1) == "Array" else inner
    m = _DATETIME64.match(ch_type)
    if m and int(m.group(1)) in _UNITS:
        return pa.timestamp(_UNITS[int(m.group(1))], tz=m.group(2) or "UTC")
    raise ValueError(f"ClickHouse type {ch_type!r} has no Arrow mapping in the sink")


def column_array(values: Sequence, typ: pa.DataType) -> pa.Array:
    """One Arrow column from Python values (timestamps given as epoch integers in the type's unit).

    Raises ``pyarrow.ArrowInvalid`` / ``ArrowTypeError`` (both ``ValueError``/``TypeError``)
    for a value that does not fit the type.
    """
    if pa.types.is_timestamp(typ):
        return pa.array(values, pa.int64()).cast(typ)
    return pa.array(values, typ)


def rows_to_table(rows: Iterable[tuple], columns: Sequence[str], types: Sequence[pa.DataType]) -> pa.Table:
    """Row tuples (in ``columns`` order) → an Arrow table.

    Raises ``ValueError`` when a row's length differs from the column count.
    """
    rows = list(rows)
    width = len(columns)
    for row in rows:
        if len(row) != width:
            raise ValueError(f"row has {len(row)} values, expected {width}: {row[:3]!r}...")
    cols = list(zip(*rows)) if rows else [()] * width
    return pa.table([column_array(c, t) for c, t in zip(cols, types)], names=list(columns))
