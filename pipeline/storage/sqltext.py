"""Lexical helpers for ClickHouse SQL text: comments, strings, statement splits.

Not a parser. It knows just enough of the ClickHouse lexer to tell code from
string literals, quoted identifiers and comments, so that a ``;`` or a keyword
inside ``'...'``, ``"..."``, ```...```, ``-- ...``, ``# ...`` or ``/* ... */``
is not mistaken for code. Used by :mod:`pipeline.storage.schema` (split DDL
files into statements) and :mod:`pipeline.storage.query` (the read-only gate).
"""

from __future__ import annotations

import re

_QUOTES = {"'", '"', "`"}


class SqlLexError(ValueError):
    """The SQL text has an unterminated string, quoted identifier or comment."""


def mask_sql(sql: str) -> str:
    """Return ``sql`` with comments blanked and literal contents masked.

    The result has the same length and line structure: comment characters
    become spaces, and every character inside a quoted string or identifier
    becomes ``_`` (the quotes themselves stay). Keywords and ``;`` that remain
    are therefore real code.

    >>> mask_sql("SELECT ';' -- drop\\n")
    "SELECT '_'        \\n"

    Raises :class:`SqlLexError` for an unterminated quote or block comment.
    """
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        if ch in _QUOTES:
            out.append(ch)
            j = i + 1
            while True:
                if j >= n:
                    raise SqlLexError(f"unterminated {ch} quote starting at offset {i}")
                cj = sql[j]
                if cj == "\\" and j + 1 < n:
                    out.append("__")
                    j += 2
                    continue
                if cj == ch:
                    if j + 1 < n and sql[j + 1] == ch:  # doubled quote = escaped quote
                        out.append("__")
                        j += 2
                        continue
                    out.append(ch)
                    j += 1
                    break
                out.append("\n" if cj == "\n" else "_")
                j += 1
            i = j
        elif sql.startswith("--", i) or ch == "#":
            j = sql.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            if j < 0:
                raise SqlLexError(f"unterminated /* comment starting at offset {i}")
            j += 2
            out.append("".join("\n" if c == "\n" else " " for c in sql[i:j]))
            i = j
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def split_statements(sql: str) -> list[str]:
    """Split ``sql`` on top-level ``;`` into stripped, non-empty statements.

    Semicolons inside strings, quoted identifiers and comments do not split.
    Statements keep their original text (comments included) but a statement
    made only of comments and whitespace is dropped.

    >>> split_statements("SELECT 1; -- two\\nSELECT ';';")
    ['SELECT 1', "-- two\\nSELECT ';'"]

    Raises :class:`SqlLexError` for unterminated quotes or comments.
    """
    masked = mask_sql(sql)
    statements: list[str] = []
    start = 0
    for match in re.finditer(";", masked):
        _append_statement(statements, sql, masked, start, match.start())
        start = match.end()
    _append_statement(statements, sql, masked, start, len(sql))
    return statements


def _append_statement(out: list[str], sql: str, masked: str, start: int, end: int) -> None:
    if masked[start:end].strip():
        out.append(sql[start:end].strip())
