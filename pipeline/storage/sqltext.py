"""Lexical helpers for ClickHouse SQL text: comments, strings, statement splits.

Not a parser. It knows just enough of the ClickHouse lexer to tell code from
string literals, quoted identifiers and comments, so that a ``;`` or a keyword
inside ``'...'``, ``"..."``, ```...```, ``$$...$$`` / ``$tag$...$tag$``
(heredoc strings), ``-- ...``, ``# ...`` or ``/* ... */`` (which nest, as in
ClickHouse's lexer) is not mistaken for code. Used by :mod:`pipeline.storage.schema` (split DDL
files into statements) and :mod:`pipeline.storage.query` (the read-only gate).
"""

from __future__ import annotations

import re

_QUOTES = {"'", '"', "`"}
#: Opening of a ClickHouse heredoc string: ``$$`` or ``$tag$`` (tag: letters, digits, ``_``).
_HEREDOC = re.compile(r"\$([A-Za-z0-9_]*)\$")


class SqlLexError(ValueError):
    """The SQL text has an unterminated string, quoted identifier or comment."""


def mask_sql(sql: str) -> str:
    """Return ``sql`` with comments blanked and literal contents masked.

    The result has the same length and line structure: comment characters
    become spaces, and every character inside a quoted string, heredoc string
    or identifier becomes ``_`` (the quotes and ``$tag$`` delimiters stay). Keywords and ``;`` that remain
    are therefore real code.

    >>> mask_sql("SELECT ';' -- drop\\n")
    "SELECT '_'        \\n"

    >>> mask_sql("SELECT $$';$$ /* a /* b */ ; */")
    'SELECT $$__$$                  '

    Raises :class:`SqlLexError` for an unterminated quote, heredoc string or
    block comment.
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
        elif ch == "$" and (heredoc := _HEREDOC.match(sql, i)):
            tag = heredoc.group(0)
            j = sql.find(tag, heredoc.end())
            if j < 0:
                raise SqlLexError(f"unterminated {tag} string starting at offset {i}")
            body = sql[heredoc.end():j]
            out.append(tag + "".join("\n" if c == "\n" else "_" for c in body) + tag)
            i = j + len(tag)
        elif sql.startswith("--", i) or ch == "#":
            j = sql.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif sql.startswith("/*", i):
            j = _comment_end(sql, i)
            out.append("".join("\n" if c == "\n" else " " for c in sql[i:j]))
            i = j
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _comment_end(sql: str, start: int) -> int:
    """Offset just past the ``/* ... */`` comment opening at ``start``; comments nest."""
    depth, j = 0, start
    while j < len(sql):
        if sql.startswith("/*", j):
            depth, j = depth + 1, j + 2
        elif sql.startswith("*/", j):
            depth, j = depth - 1, j + 2
            if depth == 0:
                return j
        else:
            j += 1
    raise SqlLexError(f"unterminated /* comment starting at offset {start}")


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
