"""What a failed request means: its error class (SPEC §4.1), a pure function of the event's error fields.

One of :data:`ERROR_CLASSES` per failed event (``status`` in
:data:`~pipeline.contracts.FAILURE_STATUSES`), None for any other status:

1. an explicit ``error_class`` sent by the gateway wins;
2. the message patterns, the provider's own table first, then the defaults
   (:data:`pipeline.ingest.error_patterns.DEFAULT_PATTERNS`); within a table
   the classes are tried in :data:`CLASS_ORDER` (a 429 or 403 that says the
   balance is gone is ``quota_exhausted``, not ``rate_limited`` /
   ``credential``). For a 5xx or a ``timeout`` only ``quota_exhausted`` and
   ``credential`` phrases count (relays wrap an upstream 401 in a 500); the
   rest stays ``transient``;
3. the HTTP status: 402 ``quota_exhausted``; 401, 403 ``credential``; 429
   ``rate_limited``; 400, 404, 405, 413, 414, 422 ``caller``;
4. ``status == "rate_limited"`` → ``rate_limited``; anything else
   (5xx, timeouts, connection errors, unknown) → ``transient``.

The text matched is ``error_type`` and ``error_message``, each cut to
:data:`MAX_MATCH_CHARS` characters first, lower-cased; patterns are
case-insensitive and compiled once per classifier, one alternation per
(provider, class). The defaults are plain phrases (``re.escape``); a table
given to :meth:`Classifier.from_table` may hold regexes, refused when they do
not compile or nest a quantifier inside a quantified group (the shape of
catastrophic backtracking). Results are cached in a bounded LRU keyed by the
inputs (after cutting).

**Provider** (the key of a pattern table): the part of the channel name before
the first ``/``, lower-cased (``lepton/llama-70b@free`` → ``lepton``); a
channel without ``/`` is its own provider up to a ``@`` (``deepseek@paid`` →
``deepseek``). :func:`provider_of` says it; callers may pass another.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from itertools import compress, repeat
from operator import attrgetter, ne
from typing import Any, Literal, cast

from pipeline.contracts import FAILURE_STATUSES, RequestEvent
from pipeline.ingest.error_patterns import DEFAULT_PATTERNS

__all__ = [
    "CLASS_ORDER",
    "ERROR_CLASSES",
    "MAX_MATCH_CHARS",
    "MAX_MESSAGE_CHARS",
    "Classifier",
    "ErrorClass",
    "ErrorTableError",
    "default_classifier",
    "provider_of",
    "resolve_errors",
]  # fmt: skip

ErrorClass = Literal["caller", "credential", "quota_exhausted", "rate_limited", "transient"]
#: The five classes (SPEC §4.1).
ERROR_CLASSES: tuple[str, ...] = ("caller", "credential", "quota_exhausted", "rate_limited", "transient")
#: Order in which the classes' patterns are tried within one table.
CLASS_ORDER: tuple[str, ...] = ("quota_exhausted", "credential", "rate_limited", "caller", "transient")
#: Classes whose phrases may override a 5xx / timeout.
_OVERRIDE_5XX = ("quota_exhausted", "credential")
#: Characters of ``error_type`` and of ``error_message`` that are matched (1 KiB of ASCII).
MAX_MATCH_CHARS = 1024
#: ``error_message`` is stored cut to this many characters (:func:`resolve_errors`).
MAX_MESSAGE_CHARS = 512
#: Most patterns per (provider, class) and characters per pattern a table may hold.
MAX_PATTERNS = 256
MAX_PATTERN_CHARS = 256
_DEFAULT_CACHE = 4096

_BY_STATUS: dict[int, str] = {
    402: "quota_exhausted", 401: "credential", 403: "credential", 429: "rate_limited",
    400: "caller", 404: "caller", 405: "caller", 413: "caller", 414: "caller", 422: "caller",
}  # fmt: skip
#: A quantified group that itself holds a quantifier, e.g. ``(a+)+`` or ``(x|y*)*``.
_NESTED_QUANTIFIER = re.compile(r"\([^()]*[*+}][^()]*\)\s*[*+{]")


class ErrorTableError(ValueError):
    """An error-class pattern table is malformed; the message names the key (``error_classes.<p>.<class>``)."""


def provider_of(channel: str) -> str:
    """The provider of a channel name (module docstring), lower-cased; ``""`` for an empty name.

    >>> provider_of("lepton/llama-70b@free"), provider_of("DeepSeek@paid"), provider_of("openai")
    ('lepton', 'deepseek', 'openai')
    """
    head = channel.split("/", 1)[0] if "/" in channel else channel.split("@", 1)[0]
    return head.strip().lower()


_Compiled = dict[str, list[tuple[str, "re.Pattern[str]"]]]


def _compile(table: Mapping[str, Mapping[str, Iterable[str]]], escape: bool) -> _Compiled:
    """Provider → ``[(class, one alternation)]`` in :data:`CLASS_ORDER`; raises :class:`ErrorTableError`."""
    if not isinstance(table, Mapping):
        raise ErrorTableError(f"error_classes: expected a table of providers, got {type(table).__name__}")
    out: _Compiled = {}
    for provider, classes in table.items():
        where = f"error_classes.{provider}"
        if not isinstance(provider, str) or not provider.strip():
            raise ErrorTableError(f"{where}: a provider name must be a non-empty string")
        if not isinstance(classes, Mapping):
            raise ErrorTableError(f"{where}: expected a table of classes, got {type(classes).__name__}")
        unknown = sorted(set(map(str, classes)) - set(ERROR_CLASSES))
        if unknown:
            raise ErrorTableError(f"{where}.{unknown[0]}: unknown error class (one of {', '.join(ERROR_CLASSES)})")
        rules = []
        for cls in CLASS_ORDER:
            if cls not in classes:
                continue
            key = f"{where}.{cls}"
            patterns = classes[cls]
            if isinstance(patterns, (str, bytes)) or not isinstance(patterns, Iterable):
                raise ErrorTableError(f"{key}: expected a list of patterns")
            patterns = list(patterns)
            if len(patterns) > MAX_PATTERNS:
                raise ErrorTableError(f"{key}: {len(patterns)} patterns, at most {MAX_PATTERNS}")
            parts = []
            for i, p in enumerate(patterns):
                parts.append(_check_pattern(p, f"{key}[{i}]", escape))
            if parts:
                rules.append((cls, re.compile("|".join(f"(?:{p})" for p in parts), re.IGNORECASE)))
        out[provider.strip().lower()] = rules
    return out


def _check_pattern(p: Any, key: str, escape: bool) -> str:
    """One pattern as regex source; raises :class:`ErrorTableError` naming ``key``."""
    if not isinstance(p, str) or not p:
        raise ErrorTableError(f"{key}: a pattern must be a non-empty string")
    if len(p) > MAX_PATTERN_CHARS:
        raise ErrorTableError(f"{key}: pattern of {len(p)} characters, at most {MAX_PATTERN_CHARS}")
    if escape:
        return re.escape(p.lower())
    try:
        re.compile(p)
    except re.error as exc:
        raise ErrorTableError(f"{key}: invalid regex {p!r}: {exc}") from None
    if _NESTED_QUANTIFIER.search(p):
        raise ErrorTableError(f"{key}: nested quantifier in {p!r} (catastrophic backtracking); use plain words")
    return p


class Classifier:
    """Maps a failed event's error fields to its class (rules in the module docstring).

    ``patterns``: provider → class → phrases, tried before the defaults (None:
    none); they are matched as plain substrings when built here, as regexes
    through :meth:`from_table`. ``cache_size``: entries of the LRU (>= 0; 0
    disables it). Raises :class:`ErrorTableError` for a malformed table.
    Thread-safe (the LRU is ``functools.lru_cache``).
    """

    def __init__(self, patterns: Mapping[str, Mapping[str, Iterable[str]]] | None = None, *,
                 cache_size: int = _DEFAULT_CACHE, _regex: bool = False) -> None:
        if cache_size < 0:
            raise ValueError(f"cache_size must be >= 0, got {cache_size}")
        self._defaults = _compile(DEFAULT_PATTERNS, escape=True)
        self._overrides = _compile(patterns or {}, escape=not _regex)
        self._args = (patterns, cache_size, _regex)
        self._cached: Callable[[str, int | None, str, str, str], str] = lru_cache(maxsize=cache_size)(self._classify)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled (and ``copy.deepcopy``-ed, e.g. inside a policy) as its table, rebuilt on load."""
        patterns, cache_size, regex = self._args
        return (_rebuild, (patterns, cache_size, regex))

    @classmethod
    def from_table(cls, table: Mapping[str, Any], *, cache_size: int = _DEFAULT_CACHE) -> Classifier:
        """A classifier from a ``[error_classes.<provider>]``-shaped dict: ``{provider: {class: [regex]}}``.

        Patterns are case-insensitive regexes, tried before the defaults.
        Raises :class:`ErrorTableError` naming the key (``error_classes.<provider>.<class>[i]``) of a
        pattern that does not compile, nests quantifiers, is empty or longer than
        :data:`MAX_PATTERN_CHARS`, and of an unknown class or a non-table value.
        """
        return cls(table, cache_size=cache_size, _regex=True)

    def classify(self, status: str, http_status: int | None = None, error_type: str | None = None,
                 error_message: str | None = None, provider: str = "", explicit: str | None = None) -> str | None:
        """The class of one event's error fields, or None when ``status`` is not a failure.

        ``status``: the event status; ``http_status``: 0..999 or None; ``error_type`` /
        ``error_message``: any text (only the first :data:`MAX_MATCH_CHARS` characters are read);
        ``provider``: a table key (:func:`provider_of`); ``explicit``: the gateway's class, used
        when it is one of :data:`ERROR_CLASSES`. Never raises for any text.
        """
        if status not in FAILURE_STATUSES:
            return None
        if explicit in ERROR_CLASSES:
            return explicit
        kind = (error_type or "")[:MAX_MATCH_CHARS]
        text = (error_message or "")[:MAX_MATCH_CHARS]
        return self._cached(status, http_status, kind, text, provider.lower())

    def classify_event(self, event: RequestEvent, provider: str | None = None) -> str | None:
        """:meth:`classify` of an event's fields; ``provider`` defaults to :func:`provider_of` of its channel."""
        return self.classify(event.status, event.http_status, event.error_type, event.error_message,
                             provider_of(event.channel) if provider is None else provider, event.error_class)

    def _classify(self, status: str, http_status: int | None, kind: str, text: str, provider: str) -> str:
        hay = f"{kind}\n{text}"
        hard = status == "timeout" or (http_status is not None and 500 <= http_status <= 599)
        for rules in (self._overrides.get(provider), self._defaults.get(provider), self._defaults["*"]):
            for cls, rx in rules or ():
                if hard and cls not in _OVERRIDE_5XX:
                    continue
                if rx.search(hay):
                    return cls
        if hard:
            return "transient"
        by_status = _BY_STATUS.get(http_status) if http_status is not None else None
        if by_status is not None:
            return by_status
        return "rate_limited" if status == "rate_limited" else "transient"


def _rebuild(patterns: Mapping[str, Mapping[str, Iterable[str]]] | None, cache_size: int, regex: bool) -> Classifier:
    """A classifier unpickled (:meth:`Classifier.__reduce__`)."""
    return Classifier(patterns, cache_size=cache_size, _regex=regex)


_default: Classifier | None = None
#: The fields error resolution reads; an ``ok`` event with neither a message nor a class is skipped.
_ERR_INPUTS = attrgetter("status", "error_class", "error_message")
_NO_ERR_INPUTS = ("ok", None, None)


def default_classifier() -> Classifier:
    """The process-wide classifier with the default patterns only (built on first use)."""
    global _default
    if _default is None:
        _default = Classifier()
    return _default


def resolve_errors(events: Sequence[RequestEvent], classifier: Classifier | None = None) -> int:
    """Resolve every event's error fields once, at ingest, onto the event (like
    :func:`~pipeline.ingest.structure.resolve_onto`): ``error_message`` cut to
    :data:`MAX_MESSAGE_CHARS`, ``error_class`` set to :meth:`Classifier.classify_event` (None for
    a non-failure). Idempotent. ``classifier`` defaults to :func:`default_classifier`.

    Returns how many messages it cut: then the event's bytes no longer say what is stored. A
    class is not counted: a stored envelope carries its events' classes beside its bytes
    (:func:`pipeline.ingest.envelope.with_error_classes`).

    >>> e = RequestEvent(event_id="e", ts_ms=0, channel="openai/gpt", route="r", status="error",
    ...                  latency_ms=1.0, http_status=401)
    >>> resolve_errors([e]), e.error_class
    (0, 'credential')
    """
    c = classifier or default_classifier()
    cut = 0
    for e in compress(events, map(ne, map(_ERR_INPUTS, events), repeat(_NO_ERR_INPUTS))):  # one C-level scan
        msg = e.error_message
        if msg is not None and len(msg) > MAX_MESSAGE_CHARS:
            e.error_message = msg[:MAX_MESSAGE_CHARS]
            cut += 1
        e.error_class = cast("ErrorClass | None", c.classify_event(e))  # one of ERROR_CLASSES or None
    return cut
