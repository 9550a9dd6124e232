"""Errors raised by :mod:`pipeline.storage` (ClickHouse access).

Messages never contain passwords: URLs are shown through
:func:`pipeline.redaction.redact_url` and driver messages are scrubbed of the
password before they are wrapped.
"""

from __future__ import annotations


class StorageError(RuntimeError):
    """Base class of ClickHouse storage errors."""


class StorageConfigError(StorageError, ValueError):
    """The ClickHouse URL or credentials are malformed or contradictory."""


class StorageConnectError(StorageError):
    """A ClickHouse server or chDB data directory could not be opened."""


class SchemaError(StorageError):
    """A DDL file is missing, unreadable or failed to apply (the message names the file)."""
