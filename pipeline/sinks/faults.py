"""Fault injection for the ClickHouse sink (a test hook, off unless configured).

The embedded default runs ClickHouse in-process (chDB), so "the server is
unreachable" cannot be produced by stopping a service. Instead a worker
started with ``CHANNEL_HEALTH_FAULT_SINK_DOWN_FILE=/path`` wraps its client in
:class:`OutageSwitchClient`: while that file exists every insert raises
``ConnectionError`` -- exactly what a transport failure looks like to
:class:`~pipeline.sinks.table.TableSink` (it becomes ``SinkWriteError`` and
the rows stay buffered). Creating the file starts the outage, deleting it
ends it. Nothing else changes: reads, DDL and the rest of the worker run the
production code paths. The setting is never set by the product itself.
"""

from __future__ import annotations

import os
from typing import Any


class OutageSwitchClient:
    """Wrap a clickhouse-connect ``client``: its inserts (``insert``, ``insert_arrow``, ``raw_insert``) fail
    while ``down_file`` exists.

    >>> class Fake:
    ...     def insert(self, *a, **k): return "ok"
    ...     def query(self, sql): return sql
    >>> import tempfile, pathlib
    >>> flag = pathlib.Path(tempfile.mkdtemp()) / "down"
    >>> c = OutageSwitchClient(Fake(), str(flag))
    >>> c.insert("t", [])
    'ok'
    >>> _ = flag.write_text("")
    >>> c.insert("t", [])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ConnectionError: ClickHouse unreachable (fault injected: ... exists)
    >>> c.query("SELECT 1")
    'SELECT 1'
    """

    def __init__(self, client: Any, down_file: str) -> None:
        self._client = client
        self.down_file = down_file

    @property
    def down(self) -> bool:
        """True while the outage is switched on."""
        return os.path.exists(self.down_file)

    def _check(self) -> None:
        if self.down:
            raise ConnectionError(f"ClickHouse unreachable (fault injected: {self.down_file} exists)")

    def insert(self, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return self._client.insert(*args, **kwargs)

    def insert_arrow(self, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return self._client.insert_arrow(*args, **kwargs)

    def raw_insert(self, *args: Any, **kwargs: Any) -> Any:
        self._check()
        return self._client.raw_insert(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)
