"""Open a clickhouse-connect client from :class:`~pipeline.config.Settings`.

Two URL forms (``CHANNEL_HEALTH_CLICKHOUSE_URL``, SPEC §7):

``chdb:///abs/path`` or ``chdb://./rel/path``
    In-process ClickHouse (chDB) persisted in that directory (created if
    missing, unless ``create_database=False``: then it must exist). chDB allows one data directory per process and one process per
    directory, so the client is cached per directory: every
    :func:`open_client` call for the same directory returns the same client.
    Call :func:`close_clients` before switching to another directory.
``http(s)://user@host:port/channel_health``
    A ClickHouse server over HTTP(S) (default ports 8123 / 8443). The password
    comes from the URL or ``CHANNEL_HEALTH_CLICKHOUSE_PASSWORD[_FILE]``
    (not both). A new client per call (HTTP clients are cheap).

Clients return ``DateTime64(3, 'UTC')`` values as timezone-aware UTC
datetimes (``tz_mode="aware"``); writers pass epoch milliseconds, so no value
is ever read as local time. The default database of the client is
``channel_health`` (created if missing and the user may create it).

Errors (:class:`~pipeline.storage.errors.StorageConfigError`,
:class:`~pipeline.storage.errors.StorageConnectError`) show the URL with the
password redacted and never include the password.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import clickhouse_connect

from pipeline.config import Settings
from pipeline.redaction import redact_url
from pipeline.storage import DATABASE
from pipeline.storage.errors import StorageConfigError, StorageConnectError

log = logging.getLogger(__name__)

#: How to point the tools at existing data (used in "not found" errors).
POINT_AT_DATA = (
    "set CHANNEL_HEALTH_CLICKHOUSE_URL to the data: chdb:///absolute/path/to/data/chdb (the default "
    "chdb://./data/chdb is relative to the current directory) or http(s)://user@host:8123/channel_health"
)

_chdb_lock = threading.Lock()
_chdb_clients: dict[str, Any] = {}


def chdb_path(url: str) -> Path:
    """Return the absolute data directory named by a ``chdb://`` URL.

    >>> str(chdb_path("chdb:///var/lib/ch"))
    '/var/lib/ch'
    >>> chdb_path("chdb://./data/chdb") == Path("data/chdb").resolve()
    True

    Raises :class:`StorageConfigError` for another scheme, an empty path, or
    a query string / fragment (chDB options are not taken from the URL).
    """
    parts = urlsplit(url)
    if parts.scheme != "chdb":
        raise StorageConfigError(f"not a chdb:// URL: {redact_url(url)}")
    if parts.query or parts.fragment:
        raise StorageConfigError(f"chdb:// URL must not have a query or fragment: {redact_url(url)}")
    raw = unquote(parts.netloc + parts.path)
    if not raw:
        raise StorageConfigError("chdb:// URL names no directory (use chdb:///abs/path or chdb://./rel/path)")
    return Path(raw).expanduser().resolve()


def open_client(settings: Settings, *, create_database: bool = True, timeout_s: float = 30.0) -> Any:
    """Return a clickhouse-connect client for ``settings.clickhouse_url``.

    ``create_database``: create ``channel_health`` (and a chDB directory)
    when it does not exist (skipped when it exists, so read-only users work);
    False: a missing chDB directory or database is an error that says where
    it looked and how to set ``CHANNEL_HEALTH_CLICKHOUSE_URL``, and nothing
    is created (``channel-health query`` from another directory). ``timeout_s``: HTTP
    connect timeout (the read timeout is 10x that); unused for chDB.

    Raises :class:`StorageConfigError` for a malformed URL or contradictory
    credentials, :class:`StorageConnectError` when the server or directory
    cannot be opened (for chDB: another process holds the directory, or this
    process has a different directory open).
    """
    url = settings.clickhouse_url
    scheme = urlsplit(url).scheme
    if scheme == "chdb":
        return _open_chdb(chdb_path(url), create_database)
    if scheme in ("http", "https"):
        return _open_http(settings, create_database, timeout_s)
    raise StorageConfigError(f"unsupported ClickHouse URL scheme {scheme!r} in {redact_url(url)}")


def close_clients() -> None:
    """Close every cached chDB client (so another directory can be opened).

    Safe to call when none is open. Clients returned earlier must not be used
    afterwards.
    """
    with _chdb_lock:
        clients = list(_chdb_clients.items())
        _chdb_clients.clear()
    for path, client in clients:
        try:
            client.close()
        except Exception as exc:  # closing is best effort; report, don't hide
            log.warning("closing chDB client for %s failed: %s", path, exc)


def _open_chdb(path: Path, create_database: bool) -> Any:
    key = str(path)
    with _chdb_lock:
        cached = _chdb_clients.get(key)
        if cached is not None:
            return cached
        if _chdb_clients:
            other = next(iter(_chdb_clients))
            raise StorageConnectError(
                f"this process already has chDB directory {other} open; chDB allows one data directory "
                f"per process (call pipeline.storage.client.close_clients() before opening {key})"
            )
        if not create_database and not path.is_dir():
            raise StorageConnectError(f"no chDB data directory at {key}; {POINT_AT_DATA}")
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageConnectError(f"cannot create chDB directory {key}: {exc.strerror}") from exc
        try:
            # path= rather than dsn="chdb://...": the DSN path is not percent-decoded, so a
            # directory with a space or '%' would be misread.
            client = clickhouse_connect.get_client(interface="chdb", path=key, tz_mode="aware")
        except Exception as exc:
            raise StorageConnectError(
                f"cannot open chDB directory {key}: {type(exc).__name__}: {exc}. Only one process may open a "
                "chDB directory at a time: stop the other worker/demo using it, or point "
                "CHANNEL_HEALTH_CLICKHOUSE_URL at another directory or a ClickHouse server"
            ) from exc
        try:
            _use_database(client, create_database, where=f"chDB directory {key}")
        except Exception:
            client.close()
            raise
        _chdb_clients[key] = client
        log.info("opened chDB at %s", key)
        return client


def _open_http(settings: Settings, create_database: bool, timeout_s: float) -> Any:
    url = settings.clickhouse_url
    shown = redact_url(url)
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise StorageConfigError(f"ClickHouse URL must not have a query or fragment: {shown}")
    try:
        port = parts.port
    except ValueError:
        raise StorageConfigError(f"ClickHouse URL has an invalid port: {shown}") from None
    if not parts.hostname:
        raise StorageConfigError(f"ClickHouse URL names no host: {shown}")
    database = parts.path.strip("/")
    if database not in ("", DATABASE):
        raise StorageConfigError(
            f"ClickHouse URL names database {database!r}; the schema lives in {DATABASE!r} (SPEC §7): {shown}"
        )
    url_password = unquote(parts.password) if parts.password is not None else None
    secret = settings.clickhouse_password
    if url_password and secret is not None:
        raise StorageConfigError(
            "ClickHouse password given both in CHANNEL_HEALTH_CLICKHOUSE_URL and "
            "CHANNEL_HEALTH_CLICKHOUSE_PASSWORD[_FILE]; give it once"
        )
    password = url_password or (secret.reveal() if secret is not None else "")
    secure = parts.scheme == "https"
    try:
        client = clickhouse_connect.get_client(
            host=parts.hostname,
            port=port or (8443 if secure else 8123),
            username=unquote(parts.username) if parts.username else "default",
            password=password,
            secure=secure,
            connect_timeout=timeout_s,
            send_receive_timeout=timeout_s * 10,
            tz_mode="aware",
            autogenerate_session_id=False,
        )
        _use_database(client, create_database, where=f"ClickHouse at {shown}")
    except StorageConnectError:
        raise
    except Exception as exc:
        detail = _scrub(f"{type(exc).__name__}: {exc}", password)
        # ``from None``: the driver's exception chain may carry request details.
        raise StorageConnectError(f"cannot connect to ClickHouse at {shown}: {detail}") from None
    log.info("connected to ClickHouse at %s", shown)
    return client


def _use_database(client: Any, create: bool, where: str) -> None:
    """Make :data:`DATABASE` the client's default database, creating it if allowed.

    ``where``: what was opened, for the error (no password in it).
    """
    exists = client.query(
        "SELECT count() FROM system.databases WHERE name = {db:String}", parameters={"db": DATABASE}
    ).result_rows[0][0]
    if not exists:
        if not create:
            raise StorageConnectError(f"database {DATABASE!r} does not exist in {where} (apply the DDL first, "
                                      f"or {POINT_AT_DATA})")
        client.command(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
    client.database = DATABASE


def _scrub(text: str, password: str) -> str:
    """Replace ``password`` (plain and URL-quoted) in ``text`` with ``***``."""
    if not password:
        return text
    for form in {password, quote(password, safe="")}:
        text = text.replace(form, "***")
    return text
