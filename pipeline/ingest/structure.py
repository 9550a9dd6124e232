"""Structured-output check: does an answer carry the fields it must? (SPEC §4.4)

Two kinds of answer, chosen by the shape of ``expected_fields`` (SPEC §3):

* **JSON object** — ``expected_fields`` is a list of names. The answer text
  must parse as one JSON object, either bare or inside a Markdown fenced block
  (```` ```json ... ``` ````, the first fenced block in the text). A name is
  present when it is a top-level key, or, for a dotted name such as
  ``"address.city"`` that is not itself a top-level key, when the path exists
  through nested objects.
* **Tool calls** — ``expected_fields`` is a list of ``{function, required}``
  (:class:`pipeline.contracts.ExpectedCall` or plain dicts). The answer text is
  native tool-call output, in any of these shapes (optionally fenced):

  - BFCL native: ``[{"<name>": "<arguments JSON>"}]`` (arguments may also be an
    object already), as in ``shared/data/function-call-outputs`` rows whose
    ``output_format`` starts with ``native tool calls``;
  - OpenAI-like: ``[{"name": ..., "arguments": ...}]``,
    ``[{"type": "function", "function": {"name": ..., "arguments": ...}}]``,
    ``{"tool_calls": [...]}`` of either item shape, or one such call object.

  Each expected entry, in order, is matched to the first not-yet-used parsed
  call with the same function name; its required arguments absent from that
  call are reported as ``"<function>.<arg>"``. An entry with no matching call
  reports all its required arguments. An empty arguments string counts as
  ``{}`` (providers send it for argument-less calls).

``parse_ok`` is False when the text does not parse, is not of the expected
shape, or any call's arguments do not parse to a JSON object; nothing could be
verified then, so every expected field is reported missing (for a call whose
arguments did not parse: that call's required arguments).
"""

from __future__ import annotations

import re
from itertools import compress, repeat
from operator import attrgetter, ne
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import msgspec

from pipeline.contracts import ExpectedCall, RequestEvent
from pipeline.ingest.error_class import Classifier, resolve_errors

__all__ = ["StructureResult", "check_structure", "resolve_onto", "resolve_structure"]

_FENCE = re.compile(r"```[ \t]*(?:[A-Za-z0-9_+-]+)?[ \t]*\r?\n?(.*?)```", re.DOTALL)
_NOT_PARSED = object()


class StructureResult(NamedTuple):
    """Outcome of :func:`check_structure`.

    ``parse_ok``: the answer parsed into the expected shape.
    ``missing_fields``: expected names (JSON object) or ``"function.arg"``
    (tool calls) that the answer lacks, in the order of ``expected_fields``.
    """

    parse_ok: bool
    missing_fields: list[str]


def _loads(text: str) -> Any:
    """Parse JSON text; return ``_NOT_PARSED`` instead of raising."""
    try:
        return msgspec.json.decode(text)
    except (msgspec.DecodeError, ValueError, TypeError):
        return _NOT_PARSED


def _parse_answer(text: str) -> Any:
    """Parse the whole text as JSON, else the first fenced block; ``_NOT_PARSED`` if neither."""
    stripped = text.strip()
    if not stripped:
        return _NOT_PARSED
    value = _loads(stripped)
    if value is not _NOT_PARSED:
        return value
    fence = _FENCE.search(stripped)
    if fence is None:
        return _NOT_PARSED
    return _loads(fence.group(1).strip())


def _has_path(obj: Mapping[str, Any], name: str) -> bool:
    """True if ``name`` is a key of ``obj`` or a dotted path through nested objects."""
    if name in obj:
        return True
    if "." not in name:
        return False
    node: Any = obj
    for part in name.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _expected_call(entry: Any) -> tuple[str, list[str]]:
    """``(function, required)`` from an :class:`ExpectedCall` or a ``{function, required}`` dict."""
    if isinstance(entry, ExpectedCall):
        return entry.function, list(entry.required)
    if not isinstance(entry, Mapping):
        raise TypeError(f"expected_fields entry must be a name or {{function, required}}, got {entry!r}")
    return str(entry.get("function", "")), [str(a) for a in (entry.get("required") or [])]


def _parse_arguments(args: Any) -> dict[str, Any] | None:
    """Arguments as a dict: a JSON string, an object, ``""``/None meaning ``{}``; None if unparseable."""
    if isinstance(args, dict):
        return args
    if args is None:
        return {}
    if isinstance(args, str):
        if not args.strip():
            return {}
        value = _loads(args)
        return value if isinstance(value, dict) else None
    return None


def _one_call(item: Any) -> tuple[str | None, dict[str, Any] | None]:
    """``(name, args)`` of one tool-call item; name None if the shape is unknown, args None if unparseable."""
    if not isinstance(item, dict):
        return None, None
    fn = item.get("function")
    if isinstance(fn, dict) and isinstance(fn.get("name"), str):
        return fn["name"], _parse_arguments(fn.get("arguments"))
    if isinstance(item.get("name"), str) and ("arguments" in item or "parameters" in item):
        args = item["arguments"] if "arguments" in item else item["parameters"]
        return item["name"], _parse_arguments(args)
    if len(item) == 1:
        ((name, args),) = item.items()
        return name, _parse_arguments(args)
    return None, None


def _parse_tool_calls(value: Any) -> tuple[bool, list[tuple[str, dict[str, Any] | None]]]:
    """``(all_parsed, calls)`` from a parsed tool-call answer; ``(False, [])`` if the shape is unknown."""
    if isinstance(value, dict):
        items = value["tool_calls"] if isinstance(value.get("tool_calls"), list) else [value]
    elif isinstance(value, list):
        items = value
    else:
        return False, []
    calls: list[tuple[str, dict[str, Any] | None]] = []
    ok = True
    for item in items:
        name, args = _one_call(item)
        if name is None:
            return False, []
        if args is None:
            ok = False
        calls.append((name, args))
    return ok, calls


def _check_object(text: str, names: Sequence[str]) -> StructureResult:
    """JSON-object kind: see the module docstring."""
    value = _parse_answer(text)
    if not isinstance(value, dict):
        return StructureResult(False, list(names))
    return StructureResult(True, [n for n in names if not _has_path(value, n)])


def _check_calls(text: str, expected: Sequence[Any]) -> StructureResult:
    """Tool-call kind: see the module docstring."""
    wanted = [_expected_call(e) for e in expected]
    value = _parse_answer(text)
    ok, calls = (False, []) if value is _NOT_PARSED else _parse_tool_calls(value)
    if not calls and not ok:
        return StructureResult(False, [f"{fn}.{arg}" for fn, req in wanted for arg in req])
    used = [False] * len(calls)
    missing: list[str] = []
    for fn, required in wanted:
        args: dict[str, Any] = {}
        for i, (name, call_args) in enumerate(calls):
            if not used[i] and name == fn:
                used[i] = True
                args = call_args if call_args is not None else {}
                break
        missing.extend(f"{fn}.{arg}" for arg in required if arg not in args)
    return StructureResult(ok, missing)


def check_structure(response_text: str, expected_fields: Iterable[Any]) -> StructureResult:
    """Check an answer against its expected fields (SPEC §4.4; rules in the module docstring).

    ``response_text``: the answer (any length; never raises on any text).
    ``expected_fields``: a list of names (JSON-object answer) or a list of
    :class:`ExpectedCall` / ``{"function": str, "required": [str]}`` (tool-call
    answer). An empty list requires nothing: ``parse_ok`` then says whether
    the text parses as a JSON object or as a tool-call list, and
    ``missing_fields`` is empty.

    Raises ``TypeError`` if ``expected_fields`` mixes names and call entries
    or holds anything else.
    """
    expected = list(expected_fields)
    if not expected:
        value = _parse_answer(response_text)
        if isinstance(value, dict) and "tool_calls" not in value:
            return StructureResult(True, [])
        return StructureResult(_parse_tool_calls(value)[0] if value is not _NOT_PARSED else False, [])
    names = [e for e in expected if isinstance(e, str)]
    if len(names) == len(expected):
        return _check_object(response_text, names)
    if names:
        raise TypeError("expected_fields mixes field names and {function, required} entries")
    return _check_calls(response_text, expected)


def resolve_structure(event: RequestEvent) -> tuple[bool | None, list[str] | None]:
    """Structure verdict of one event: ``(parse_ok, missing_fields)`` (SPEC §3, §4.4).

    Only ``ok`` events are judged; others give ``(None, None)`` (not checked).
    If the event carries ``missing_fields`` (the gateway's own check, or one the
    decoder made before truncating the text) they are used, with ``parse_ok``
    from the event or True when absent. Else, with ``response_text`` and a
    non-empty ``expected_fields``, :func:`check_structure` decides. Else
    ``(None, None)``.
    """
    if event.status != "ok":
        return None, None
    if event.missing_fields is not None:
        return (True if event.parse_ok is None else event.parse_ok), list(event.missing_fields)
    if event.response_text is not None and event.expected_fields:
        result = check_structure(event.response_text, event.expected_fields)
        return result.parse_ok, result.missing_fields
    return None, None


#: The fields a structure verdict is resolved from; an event with none of them is not checked.
_INPUTS = attrgetter("missing_fields", "parse_ok", "response_text")
_NO_INPUTS = (None, None, None)


def _as_sent(event: RequestEvent) -> tuple[bool | None, list[str] | None]:
    """The flags an event's own fields state as data (SPEC §3: ``parse_ok`` absent with
    ``missing_fields`` present means "parsed"), before :func:`resolve_structure`."""
    missing = event.missing_fields
    return (True if event.parse_ok is None and missing is not None else event.parse_ok), missing


def resolve_onto(events: Sequence[RequestEvent], classifier: Classifier | None = None) -> int:
    """Resolve every event's structure verdict once, at ingest, onto the event itself.

    Sets ``parse_ok`` / ``missing_fields`` of each event to
    :func:`resolve_structure`'s ``(parse_ok, missing_fields)``: ``parse_ok``
    None means "not checked" (and ``missing_fields`` is then None),
    True/False "checked" with ``missing_fields`` the list of absent fields.
    Everything downstream (the engine's counts, the ``request_events``
    rows) reads these two fields and applies no rule of its own. Idempotent.

    Only events with ``missing_fields``, ``parse_ok`` or ``response_text``
    can change; the others are skipped after C-level scans.

    The error fields are resolved in the same pass
    (:func:`pipeline.ingest.error_class.resolve_errors`: ``error_class`` of a
    failed event, ``error_message`` cut); a cut message also counts in the
    return value (the class does not: see ``resolve_errors``). ``classifier``: the policy's
    (:attr:`pipeline.policy.defaults.PolicyConfig.classifier`, its ``[error_classes.<provider>]``
    patterns); default the built-in phrases only.

    Returns how many events now carry flags other than their fields stated
    as data (:func:`_as_sent`): 0 means the message's own bytes still say
    what is stored (:mod:`pipeline.sinks.batches` may store it as it came).
    Raises what :func:`check_structure` raises (``TypeError`` for an
    ``expected_fields`` the decoder would have refused).

    >>> e = RequestEvent(event_id="e", ts_ms=0, channel="c", route="r", status="error", latency_ms=1.0,
    ...                  missing_fields=["a"])
    >>> resolve_onto([e]), e.parse_ok, e.missing_fields
    (1, None, None)
    """
    changed = 0
    for e in compress(events, map(ne, map(_INPUTS, events), repeat(_NO_INPUTS))):  # one C-level scan
        resolved = resolve_structure(e)
        if resolved != _as_sent(e):
            changed += 1
        e.parse_ok, e.missing_fields = resolved
    return changed + resolve_errors(events, classifier)
