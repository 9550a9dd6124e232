"""Read-only analyst queries (``channel-health query "SQL"``) and table output.

:func:`run_readonly_query` runs exactly one ``SELECT`` / ``WITH`` / ``SHOW`` /
``DESCRIBE`` / ``EXPLAIN`` statement (SPEC §8, issue #16). Fences:

1. a lexical gate (:func:`check_readonly_sql`), so a plain write is refused
   before anything is opened: one statement, an allowed first keyword, no
   ``INTO OUTFILE`` (the client writes that file, and on chDB the client is
   this process), no ``INSERT``;
2. ClickHouse itself (:class:`~pipeline.storage.readonly.ReadOnlySession`):
   its parser must read the text as one statement; the gate of 1 runs again
   on ClickHouse's canonical text of it, and its AST must have no output
   file, no table function outside the allow-list and no function that reaches files,
   network or processes; the canonical statement then runs under
   ``readonly=1`` with time, memory, result-row and result-byte limits, on
   chDB as on a server (the result bytes are counted again as the rows
   arrive: :mod:`pipeline.storage.result_limit`).

Parameters are bound server-side with ClickHouse's ``{name:Type}`` syntax,
never formatted into the SQL text by Python.
"""

from __future__ import annotations

import io
import re
from datetime import datetime
from typing import Any, Sequence

from pipeline.config import QueryLimits
from pipeline.storage.readonly import ReadOnlySession, ast_problems
from pipeline.storage.result_limit import QueryLimitExceeded, limit_error

__all__ = ["QueryLimitExceeded", "QueryRefused", "QueryParameterError", "check_readonly_sql", "format_table",
           "placeholders", "run_readonly_query"]
from pipeline.storage.sqltext import SqlLexError, mask_sql, split_statements

#: First keywords of the statements :func:`run_readonly_query` runs.
ALLOWED_KEYWORDS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXPLAIN"})

_FIRST_WORD = re.compile(r"\s*\(*\s*([A-Za-z_]+)")
_INTO_OUTFILE = re.compile(r"\bINTO\s+OUTFILE\b", re.IGNORECASE)
#: ClickHouse runs ``WITH 1 AS x INSERT INTO t SELECT x`` as an insert, so a
#: leading ``WITH`` does not make a statement read-only.
_INSERT = re.compile(r"\bINSERT\b", re.IGNORECASE)
_PLACEHOLDER = re.compile(r"\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*[^{}]+\}")


class QueryError(ValueError):
    """A query cannot be run as given."""


class QueryRefused(QueryError):
    """The SQL is not a single read-only statement; the message says why."""


class QueryParameterError(QueryError):
    """Placeholders and parameter values do not match one to one."""


def check_readonly_sql(sql: str) -> str:
    """Return the single read-only statement in ``sql`` (trailing ``;`` removed).

    >>> check_readonly_sql("  select 1;  ")
    'select 1'

    Raises :class:`QueryRefused` for no statement, several statements, a
    first keyword outside :data:`ALLOWED_KEYWORDS`, ``INTO OUTFILE``, an
    ``INSERT`` anywhere in the code (``WITH ... INSERT`` is an insert) or
    unterminated quotes/comments.
    """
    try:
        statements = split_statements(sql)
    except SqlLexError as exc:
        raise QueryRefused(f"cannot read the SQL: {exc}") from None
    if len(statements) != 1:
        raise QueryRefused(f"expected exactly one statement, got {len(statements)}")
    statement = statements[0]
    code = mask_sql(statement)
    match = _FIRST_WORD.match(code)
    keyword = match.group(1).upper() if match else ""
    if keyword not in ALLOWED_KEYWORDS:
        allowed = ", ".join(sorted(ALLOWED_KEYWORDS))
        raise QueryRefused(f"only read-only statements ({allowed}) are allowed, got {keyword or 'no keyword'!s}")
    if _INTO_OUTFILE.search(code):
        raise QueryRefused("INTO OUTFILE writes a file; not allowed in a read-only query")
    if _INSERT.search(code):
        raise QueryRefused("INSERT writes to a table (also after WITH); not allowed in a read-only query")
    return statement


def placeholders(sql: str) -> set[str]:
    """Names of the ``{name:Type}`` placeholders in the code of ``sql`` (not in strings/comments).

    >>> sorted(placeholders("SELECT {a:String}, '{b:UInt8}' WHERE x = {c: Array(UInt8)}"))
    ['a', 'c']

    Raises :class:`QueryRefused` for unterminated quotes/comments (found by
    the battery of tests/integration/test_hostile_query.py: the lexer's own
    error escaped when the text had not been through :func:`check_readonly_sql`).
    """
    try:
        return set(_PLACEHOLDER.findall(mask_sql(sql)))
    except SqlLexError as exc:
        raise QueryRefused(f"cannot read the SQL: {exc}") from None


def run_readonly_query(
    client: Any, sql: str, params: dict[str, Any] | None = None, limits: QueryLimits | None = None
) -> tuple[list[str], list[tuple]]:
    """Run one read-only statement and return ``(column_names, rows)``.

    ``client``: a clickhouse-connect client (HTTP, or chDB on a directory).
    ``params``: values for the ``{name:Type}`` placeholders, bound by the
    server. ``limits``: time/memory/row/byte limits (default
    :class:`~pipeline.config.QueryLimits()`: 30 s, 2 GiB, 100 000 rows,
    64 MiB).

    Raises :class:`QueryRefused` when the lexical gate, ClickHouse's parser
    (not exactly one statement) or the AST check refuses the SQL,
    :class:`QueryParameterError` when placeholders and ``params`` keys differ,
    :class:`~pipeline.storage.result_limit.QueryLimitExceeded` (naming the
    setting to raise, ClickHouse's error name in the message) when a limit
    stops it (``TIMEOUT_EXCEEDED``, ``MEMORY_LIMIT_EXCEEDED``,
    ``TOO_MANY_ROWS_OR_BYTES``, or the result bytes counted as rows arrive),
    and the driver's error when ClickHouse refuses the query (``READONLY``, ...).
    """
    statement = check_readonly_sql(sql)
    params = dict(params or {})
    names = placeholders(statement)
    if names != set(params):
        parts = []
        if names - set(params):
            parts.append(f"placeholders without a value: {sorted(names - set(params))}")
        if set(params) - names:
            parts.append(f"values without a {{name:Type}} placeholder: {sorted(set(params) - names)}")
        raise QueryParameterError("; ".join(parts))
    with ReadOnlySession(client, limits or QueryLimits()) as session:
        try:
            canonical = session.canonical(statement)
        except Exception as exc:
            if getattr(exc, "code", None) == 62 or "SYNTAX_ERROR" in str(exc):
                raise QueryRefused(f"ClickHouse does not read it as exactly one statement: {exc}") from None
            raise
        check_readonly_sql(canonical)
        problems = ast_problems(session.explain_ast(canonical, params))
        if problems:
            raise QueryRefused("; ".join(problems))
        try:
            return session.query(canonical, params)
        except Exception as exc:
            stopped = limit_error(exc)
            if stopped is None:
                raise
            raise stopped from None


def format_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, width: int = 160) -> str:
    """Render a result as a plain-text table (rich, no colour) followed by a ``(N rows)`` line.

    ``None`` prints as ``NULL``, datetimes in ISO 8601, floats with up to 6
    significant digits; text as :func:`~pipeline.escape.terminal_text` (control
    characters visible, e.g. ``\\n``). Columns whose values are all numbers
    (or NULL) are right-aligned. ``width``: maximum line width in characters;
    long values fold onto further lines, never cut. Columns that cannot fit
    even folded are left out from the right and named in a last line
    (issue #35: ``SELECT *`` was cut without a word), never silently.
    """
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table

    from pipeline.escape import rich_text

    def numeric(i: int) -> bool:
        vals = [r[i] for r in rows if r[i] is not None]
        return bool(vals) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals)

    def build(n: int) -> Any:
        # rich_text everywhere: values such as "[bold]" print as-is, not as rich markup, and control characters
        # (ESC, newline) are shown escaped, never sent to the terminal (SPEC §8).
        table = Table()
        for i, column in enumerate(columns[:n]):
            table.add_column(rich_text(column), justify="right" if numeric(i) else "left", overflow="fold")
        for row in rows:
            table.add_row(*(rich_text(_cell(value)) for value in row[:n]))
        return table

    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, force_terminal=False, no_color=True)
    shown = len(columns)
    # a column folded to fewer than 3 characters is unreadable: leave out columns from the right until it fits
    while shown > 1 and Measurement.get(console, console.options, build(shown)).minimum + 2 * shown > width:
        shown -= 1
    console.print(build(shown))
    text = out.getvalue() + f"({len(rows)} row{'' if len(rows) == 1 else 's'})\n"
    if shown < len(columns):
        cut = ", ".join(str(c) for c in columns[shown:])
        text += (f"({len(columns) - shown} of {len(columns)} columns not shown, too wide for {width} characters: "
                 f"{cut}; use --format csv, tsv or json for every column)\n")
    return text


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)
