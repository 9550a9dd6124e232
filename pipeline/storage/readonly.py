"""ClickHouse's own read-only enforcement for analysts' queries (SPEC §8, issue #16).

A :class:`ReadOnlySession` runs a query in three steps, all decided by
ClickHouse, not by a text check in Python:

1. **Parse.** ``SELECT formatQuery({q:String})`` (ClickHouse >= 23.10): the
   engine's parser reads the analyst's text, passed as a bound value, and
   answers with its canonical form, or refuses anything but exactly one
   statement (``Multi-statements are not allowed``). ``$$...$$`` strings,
   nested comments and every other lexical trick are ClickHouse's to read.
2. **Inspect.** ``EXPLAIN AST <canonical>`` (not executed): no ``INTO
   OUTFILE``; every function in a ``FROM``/``JOIN`` position (a *table
   function*) must be in :data:`ALLOWED_TABLE_FUNCTIONS`, and no function of
   :data:`REFUSED_FUNCTIONS` (files, network, processes) may appear anywhere.
3. **Run** the canonical statement (what was inspected is what runs) in a
   session with ``readonly=1``: ClickHouse refuses writes, DDL, ``SET`` and
   any ``SETTINGS`` clause of the query (so the limits cannot be lifted), and
   on chDB 26.9 also the table functions ``file``, ``url``, ``remote``,
   ``zeros``, ``format``. Limits (:class:`~pipeline.config.QueryLimits`)
   stand beside it: ``max_execution_time``, ``max_memory_usage``,
   ``max_result_rows`` and ``max_result_bytes`` with
   ``result_overflow_mode='throw'``; the rows are read block by block and
   their bytes counted again as they arrive
   (:func:`~pipeline.storage.result_limit.take_rows`: ClickHouse counts a
   constant column once), so the client never holds much more than the limit.

``INTO OUTFILE`` is not a write to ClickHouse (the client writes the file, and
on chDB the client is this process), so ``readonly`` does not stop it: step 2
does, from the AST.

How the settings reach ClickHouse:

chDB
    Two dedicated engine handles on the data directory of the given client
    (session state is per handle in clickhouse-connect >= 0.9's chDB backend;
    the writer's handle keeps ``readonly=0``): one to parse and inspect (no
    row limit: an AST has a line per node), one to run. Limits and
    ``readonly=1`` are applied with ``SET``, ``readonly`` last, and read back.
HTTP(S) server
    The same settings ride with every request. When the server user is
    already ``readonly=1`` nothing can be sent (ClickHouse refuses a change):
    the user's profile must carry the limits. With ``readonly=2`` only the
    limits are sent, and the query could raise them; give analysts a
    ``readonly=1`` profile or settings constraints.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from pipeline.config import QueryLimits
from pipeline.storage import DATABASE
from pipeline.storage.result_limit import take_rows

log = logging.getLogger(__name__)

#: Table functions an analyst may use (compared case-insensitively): generated
#: rows and views over tables the session may read anyway. Everything else in a
#: FROM/JOIN position is refused (an allow-list: new ClickHouse versions add
#: table functions that reach further, e.g. ``ytsaurus``, ``paimonS3``).
ALLOWED_TABLE_FUNCTIONS = frozenset({
    "numbers", "numbers_mt", "zeros", "zeros_mt", "generateseries", "generate_series", "generaterandom",
    "primes", "values", "view", "merge",
})

#: Functions refused in any position (lower case): table functions that read
#: files, open connections or start processes (used outside FROM, e.g. after
#: IN), and scalar functions that read the host (``file('/proc/self/environ')``
#: reads any file chDB's process can), load model files, or show server
#: configuration.
REFUSED_FUNCTIONS = frozenset({
    "file", "filecluster", "url", "urlcluster", "s3", "s3cluster", "gcs", "oss", "cosn", "remote", "remotesecure",
    "cluster", "clusterallreplicas", "executable", "python", "eval", "mysql", "postgresql", "mongodb", "redis",
    "sqlite", "jdbc", "odbc", "input", "filesystem", "dictionary", "bigquery", "ytsaurus", "arrowstream",
    "prometheusquery", "prometheusqueryrange", "catboostevaluate", "modelevaluate", "getserversetting", "getmacro",
    "getclienthttpheader", "filesystemavailable", "filesystemcapacity", "filesystemunreserved",
})
#: Families of table functions refused by prefix (lower case), e.g. ``icebergS3Cluster``, ``hdfsCluster``.
REFUSED_PREFIXES = ("azureblobstorage", "hdfs", "iceberg", "deltalake", "hudi", "paimon", "naivebayes")

_AST_LINE = re.compile(r"^( *)(\S+)(?: (\S+))?")
#: Statements whose rows are streamed (canonical text: no comments before the keyword).
_STREAMED = re.compile(r"\s*\(*\s*(SELECT|WITH)\b", re.IGNORECASE)


class ReadOnlyError(RuntimeError):
    """The read-only session could not be set up (e.g. ``readonly`` did not read back as 1)."""


def session_settings(limits: QueryLimits, *, result_limit: bool) -> dict[str, Any]:
    """ClickHouse settings of a read-only analyst session, ``readonly`` last.

    >>> session_settings(QueryLimits(max_execution_time_s=1.5, max_memory_bytes=2**20, max_result_rows=5,
    ...                              max_result_bytes=4096), result_limit=True)  # doctest: +NORMALIZE_WHITESPACE
    {'max_execution_time': 1.5, 'max_memory_usage': 1048576, 'max_result_rows': 5, 'max_result_bytes': 4096,
     'result_overflow_mode': 'throw', 'allow_introspection_functions': 0, 'allow_ddl': 0, 'readonly': 1}

    ``result_limit``: include the row and byte limits (False for the
    parse/inspect session, whose ``EXPLAIN AST`` answer has one row per AST
    node).
    """
    settings: dict[str, Any] = {
        "max_execution_time": limits.max_execution_time_s,
        "max_memory_usage": limits.max_memory_bytes,
    }
    if result_limit:
        settings["max_result_rows"] = limits.max_result_rows
        settings["max_result_bytes"] = limits.max_result_bytes
        settings["result_overflow_mode"] = "throw"
    settings["allow_introspection_functions"] = 0
    settings["allow_ddl"] = 0
    settings["readonly"] = 1
    return settings


def ast_functions(ast_text: str) -> list[tuple[str, bool]]:
    """``(name, is_table_function)`` of every ``Function`` node in an ``EXPLAIN AST`` answer.

    A table function is a ``Function`` whose parent node is a
    ``TableExpression`` (one space of indentation per level).

    >>> ast_functions("SelectQuery\\n TableExpression\\n  Function file (children 1)\\n   Function lower")
    [('file', True), ('lower', False)]
    """
    found: list[tuple[str, bool]] = []
    stack: list[tuple[int, str]] = []
    for line in ast_text.splitlines():
        match = _AST_LINE.match(line)
        if not match:
            continue
        indent, node = len(match.group(1)), match.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if node == "Function" and match.group(3):
            found.append((match.group(3), bool(stack) and stack[-1][1] == "TableExpression"))
        stack.append((indent, node))
    return found


def ast_problems(ast_text: str) -> list[str]:
    """Why the statement of an ``EXPLAIN AST`` answer is not allowed (empty list: allowed).

    Refused: ``INTO OUTFILE`` (a ``Literal`` child of the root node: the
    output options of every query kind sit there, and no other literal does),
    functions of :data:`REFUSED_FUNCTIONS` / :data:`REFUSED_PREFIXES`
    anywhere, table functions outside :data:`ALLOWED_TABLE_FUNCTIONS`.

    >>> ast_problems("SelectWithUnionQuery (children 2)\\n ExpressionList\\n Literal 'x'")
    ['INTO OUTFILE writes a file; not allowed in a read-only query']
    """
    problems: list[str] = []
    if any(line.startswith(" Literal ") for line in ast_text.splitlines()):
        problems.append("INTO OUTFILE writes a file; not allowed in a read-only query")
    for name, is_table in ast_functions(ast_text):
        low = name.lower()
        if low in REFUSED_FUNCTIONS or low.startswith(REFUSED_PREFIXES):
            problems.append(f"function {name}() reaches files, network, processes or server configuration")
        elif is_table and low not in ALLOWED_TABLE_FUNCTIONS:
            allowed = ", ".join(sorted(ALLOWED_TABLE_FUNCTIONS))
            problems.append(f"table function {name}() is not allowed (allowed: {allowed})")
    return list(dict.fromkeys(problems))


class ReadOnlySession:
    """Parse, inspect and run analysts' statements under ``readonly=1`` and limits (see module doc).

    ``client``: an open clickhouse-connect client (chDB or HTTP) on the data to
    query; it is not modified (chDB: new handles are opened on its directory).
    ``limits``: :class:`~pipeline.config.QueryLimits`. Use as a context
    manager, or call :meth:`close`.

    Raises :class:`ReadOnlyError` when ``readonly=1`` cannot be put in place
    (fail closed), and the driver's error when ClickHouse refuses a setting.
    """

    def __init__(self, client: Any, limits: QueryLimits) -> None:
        from clickhouse_connect.driver.httpclient import HttpClient

        self._own: list[Any] = []
        self._max_result_bytes = limits.max_result_bytes
        self._inspect_settings: dict[str, Any] | None = None
        self._run_settings: dict[str, Any] | None = None
        if isinstance(client, HttpClient):
            self._inspect = self._run = client
            self._inspect_settings, self._run_settings = _http_settings(client, limits)
        else:
            path = getattr(client, "path", None)
            if not isinstance(path, str) or path.startswith(":memory:"):
                raise ReadOnlyError(f"expected a chDB client on a data directory or an HTTP client, got {client!r}")
            try:
                self._inspect = self._chdb_handle(path, session_settings(limits, result_limit=False))
                self._run = self._chdb_handle(path, session_settings(limits, result_limit=True))
            except Exception:
                self.close()
                raise

    def _chdb_handle(self, path: str, settings: dict[str, Any]) -> Any:
        import clickhouse_connect

        handle = clickhouse_connect.get_client(interface="chdb", path=path, tz_mode="aware")
        self._own.append(handle)
        for name, value in settings.items():
            handle.command(f"SET {name} = {value!r}")
        handle.database = DATABASE
        readonly = handle.query("SELECT getSetting('readonly')").result_rows[0][0]
        if str(readonly) != "1":
            raise ReadOnlyError(f"chDB session readonly reads back as {readonly!r}, not 1; refusing to run queries")
        return handle

    def canonical(self, sql: str) -> str:
        """ClickHouse's canonical text of the one statement in ``sql``.

        Raises the driver's error (ClickHouse ``SYNTAX_ERROR``, code 62) when
        ``sql`` is not exactly one statement.
        """
        result = self._inspect.query("SELECT formatQuery({q:String})", parameters={"q": sql},
                                     settings=self._inspect_settings)
        return str(result.result_rows[0][0])

    def explain_ast(self, statement: str, params: dict[str, Any] | None) -> str:
        """The ``EXPLAIN AST`` answer for ``statement`` (parsed, not executed); ``params`` as for the query."""
        result = self._inspect.query(f"EXPLAIN AST {statement}", parameters=params or None,
                                     settings=self._inspect_settings)
        return "\n".join(str(row[0]) for row in result.result_rows)

    def query(self, statement: str, params: dict[str, Any] | None) -> tuple[list[str], list[tuple]]:
        """Run ``statement`` (from :meth:`canonical`) in the limited read-only session: ``(columns, rows)``.

        The rows are streamed block by block and their bytes counted
        (:func:`~pipeline.storage.result_limit.take_rows`) when it is a
        ``SELECT``/``WITH`` (chDB streams nothing else); other statements
        (``SHOW``/``DESCRIBE``/``EXPLAIN``: small answers) are read whole and
        counted after. A result without rows may carry no column names (chDB
        gives none, streamed or not). Raises
        :class:`~pipeline.storage.result_limit.QueryLimitExceeded` past
        ``max_result_bytes``, and the driver's error when ClickHouse refuses
        or stops the statement.
        """
        run = dict(parameters=params or None, settings=self._run_settings)
        stream = None
        if _STREAMED.match(statement):
            try:
                stream = self._run.query_row_block_stream(statement, **run)
            except Exception as exc:
                if "Streaming query is not supported" not in str(exc):
                    raise
        if stream is None:
            result = self._run.query(statement, **run)
            return list(result.column_names), take_rows([result.result_rows], self._max_result_bytes)
        with stream:
            rows = take_rows(stream, self._max_result_bytes)
            return list(stream.source.column_names), rows

    def close(self) -> None:
        """Close the chDB handles this session opened (the given client stays open)."""
        for handle in self._own:
            try:
                handle.close()
            except Exception as exc:  # best effort; report, don't hide
                log.warning("closing a read-only chDB handle failed: %s", exc)
        self._own.clear()

    def __enter__(self) -> "ReadOnlySession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _http_settings(client: Any, limits: QueryLimits) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """Per-request settings (inspect, run) for an HTTP client, given the user's own ``readonly``."""
    current = client.server_settings.get("readonly")
    level = current.value if current is not None else "0"
    inspect, run = session_settings(limits, result_limit=False), session_settings(limits, result_limit=True)
    if level == "0":
        return inspect, run
    if level == "2":  # may change settings but not readonly; it is read-only already
        inspect.pop("readonly"), run.pop("readonly")
        log.warning("ClickHouse user is readonly=2: the query limits are sent but a query could raise them; "
                    "give analysts a readonly=1 profile with limits")
        return inspect, run
    log.info("ClickHouse user is readonly=%s: no setting can be sent; the user's profile sets the limits", level)
    return None, None
