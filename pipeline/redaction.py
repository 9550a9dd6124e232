"""Secrets that never print, and their redaction from logs and messages.

A :class:`Secret` registers its value on creation (:func:`register_secret`):
from then on every log record of the process, of any library, has the value
(and its URL-quoted and repr-escaped forms) replaced by ``***``, and
:func:`redact_secrets` scrubs text printed outside logging.
:func:`redact_url` hides the password of a URL's user-info, even in text that
does not parse as a URL. :mod:`pipeline.config` reads the secrets from the
environment.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote


@dataclass(frozen=True)
class Secret:
    """A secret string that never prints. Use :meth:`reveal` where it is needed."""

    _value: str = field(repr=False)

    def __post_init__(self) -> None:
        register_secret(self._value)

    def reveal(self) -> str:
        """Return the secret value (for client constructors only)."""
        return self._value

    def __str__(self) -> str:
        return "***"

    def __repr__(self) -> str:
        return "Secret('***')"


#: Secrets shorter than this are not scrubbed from logs (they would garble every
#: line; a password that short is no protection anyway).
MIN_REDACTED_CHARS = 4

_redact_lock = threading.Lock()
_redact_forms: tuple[str, ...] = ()
_base_record_factory: Any = None


def register_secret(value: str | None) -> None:
    """Scrub ``value`` from every later log record of this process and from :func:`redact_secrets`.

    Also scrubs its URL-quoted form and its escaped forms inside a ``str`` or
    ``bytes`` repr (how libraries tend to log request payloads). Installs the
    redacting log-record factory on first use. Values shorter than
    :data:`MIN_REDACTED_CHARS` are ignored.
    """
    global _redact_forms, _base_record_factory
    if not value or len(value) < MIN_REDACTED_CHARS:
        return
    forms = {value, quote(value, safe=""), repr(value)[1:-1]}
    try:
        forms.add(repr(value.encode("utf-8"))[2:-1])
    except UnicodeEncodeError:
        pass
    with _redact_lock:
        known = set(_redact_forms) | {f for f in forms if len(f) >= MIN_REDACTED_CHARS}
        _redact_forms = tuple(sorted(known, key=len, reverse=True))
        if _base_record_factory is None:
            _base_record_factory = logging.getLogRecordFactory()
            logging.setLogRecordFactory(_redacting_record_factory)


def redact_secrets(text: str) -> str:
    """``text`` with every registered secret value replaced by ``***``."""
    for form in _redact_forms:
        if form in text:
            text = text.replace(form, "***")
    return text


def _redacting_record_factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
    record = _base_record_factory(*args, **kwargs)
    if not _redact_forms:
        return record
    try:
        message = record.getMessage()
    except Exception:  # a broken format string: leave it to the handler to report
        return record
    clean = redact_secrets(message)
    if clean != message:
        record.msg, record.args = clean, None
    if record.exc_info and not record.exc_text:
        text = logging.Formatter().formatException(record.exc_info)
        clean = redact_secrets(text)
        if clean != text:
            record.exc_text = clean  # formatters use exc_text as given
    return record


def redact_url(url: str) -> str:
    """Return ``url`` with the password part of its user-info replaced by ``***``.

    Works on text that does not parse as a URL too: a password holding ``/``,
    ``#``, ``?`` or ``@`` unquoted makes :func:`urllib.parse.urlsplit` read
    part of it as host, path, query or fragment, so the user-info is taken
    here as everything between ``scheme://`` and the *last* ``@``, and all of
    it after the first ``:`` is redacted (see :func:`_url_password_span`).
    A URL with no ``@`` is returned unchanged.

    >>> redact_url("https://bob:hunter2@ch.example:8443/db")
    'https://bob:***@ch.example:8443/db'
    >>> redact_url("http://bob:pa/ss#w?rd@ch.example:8123/db")
    'http://bob:***@ch.example:8123/db'
    >>> redact_url("chdb:///tmp/x")
    'chdb:///tmp/x'
    """
    span = _url_password_span(url)
    if span is None:
        return url
    start, end = span
    return f"{url[:start]}***{url[end:]}"


def _url_password_span(url: str) -> tuple[int, int] | None:
    """``(start, end)`` offsets of the password in ``url``'s user-info, or None when it has none.

    User-info: the text after ``://`` (or from the start, without a scheme) up
    to the last ``@``; the password is what follows its first ``:``. Passwords
    are therefore found whatever characters they hold (RFC 3986 §3.2.1 wants
    them percent-encoded; people paste them raw). A ``:`` and ``@`` in a path
    (``http://host:8123/a@b``) are read as a password too: over-redacting a
    message is the safe error.
    """
    begin = url.find("://")
    begin = 0 if begin < 0 else begin + 3
    at = url.rfind("@")
    if at < begin:
        return None
    colon = url.find(":", begin, at)
    if colon < 0 or colon + 1 == at:
        return None
    return colon + 1, at


def register_url_password(url: str) -> None:
    """:func:`register_secret` for the password in ``url``'s user-info, as given and URL-decoded (if any)."""
    span = _url_password_span(url)
    if span is not None:
        password = url[span[0]:span[1]]
        register_secret(password)
        register_secret(unquote(password))
