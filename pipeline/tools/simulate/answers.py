"""Structured answers for ``expected_fields`` requests, from real BFCL outputs.

Source: ``function-call-outputs/bfcl_outputs.jsonl`` (SPEC §6). Only rows
whose ``output_format`` starts with ``"native tool calls"`` and whose
``error_class`` is null (the benchmark judged them correct) are used, and
only those whose every call parses and carries all its required arguments.

Two answer kinds (SPEC §3 ``expected_fields``):

tool call
    ``response_text`` = the row's raw ``output``
    (``[{"<function>": "<arguments JSON string>"}, ...]``);
    ``expected_fields`` = the row's ``[{function, required}]``.
JSON object
    ``response_text`` = the arguments object of one call of such a row
    (a real JSON object an LLM produced); ``expected_fields`` = that
    function's required argument names.

A *hollow* variant of every answer drops one required field (for a tool
call: one required argument of one call), deterministically per answer, and
records its name in ``missing`` (``"<function>.<arg>"`` for tool calls, the
key for JSON objects); that is what the gateway reports in ``missing_fields``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .traces import load_bfcl_rows, resolve_data_dir

#: Longest ``prompt_text`` attached to a structured event, characters (the
#: gateway truncates prompts, SPEC §3).
PROMPT_MAX_CHARS = 300


@dataclass(frozen=True)
class Answer:
    """One structured answer with its healthy and hollow forms.

    expected_fields: list of names (JSON object) or list of
    ``{"function", "required"}`` dicts (tool call), JSON-ready.
    text: healthy ``response_text``. hollow_text: the same answer missing one
    required field, named in ``missing`` (list of one str). prompt: the
    request prompt, at most :data:`PROMPT_MAX_CHARS` characters.
    """

    expected_fields: list
    text: str
    hollow_text: str
    missing: list[str]
    prompt: str


@dataclass(frozen=True)
class AnswerBank:
    """Healthy and hollow structured answers (see module doc).

    ``tool_calls`` and ``json_objects``: non-empty tuples of :class:`Answer`.
    """

    tool_calls: tuple[Answer, ...]
    json_objects: tuple[Answer, ...]


def _parse_calls(output: str) -> list[tuple[str, dict]] | None:
    """``[{"fn": "<json args>"}]`` -> ``[(fn, args_dict)]``; ``None`` if malformed."""
    try:
        calls = json.loads(output)
    except (TypeError, ValueError):
        return None
    if not isinstance(calls, list) or not calls:
        return None
    out = []
    for call in calls:
        if not isinstance(call, dict) or len(call) != 1:
            return None
        (fn, raw), = call.items()
        try:
            args = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            return None
        if not isinstance(args, dict):
            return None
        out.append((fn, args))
    return out


def row_answers(i: int, row: dict) -> tuple[Answer, Answer] | None:
    """The (tool call, JSON object) answers of BFCL row ``row``, or ``None`` if unusable.

    ``i``: the row's 0-based line in ``bfcl_outputs.jsonl`` (a shipped sample
    row carries it as ``line``); it picks which required field the hollow
    variants drop, so the bank is the same on the full set and the sample.
    """
    if not str(row.get("output_format", "")).startswith("native tool calls"):
        return None
    if row.get("error_class") is not None:
        return None
    expected = row.get("expected_fields") or []
    calls = _parse_calls(row.get("output", ""))
    if not expected or calls is None or len(calls) != len(expected):
        return None
    if any(
        not isinstance(e, dict) or e.get("function") != fn or any(r not in args for r in e.get("required", []))
        for e, (fn, args) in zip(expected, calls)
    ):
        return None
    with_required = [j for j, e in enumerate(expected) if e.get("required")]
    if not with_required:
        return None
    prompt = str(row.get("prompt") or "")[:PROMPT_MAX_CHARS]
    # Hollow tool call: drop one required argument of one call.
    j = with_required[i % len(with_required)]
    fn, args = calls[j]
    req = list(expected[j]["required"])
    dropped = req[i % len(req)]
    hollow_calls = []
    for k, (f, a) in enumerate(calls):
        if k == j:
            a = {key: v for key, v in a.items() if key != dropped}
        hollow_calls.append({f: json.dumps(a)})
    expected_json = [{"function": e["function"], "required": list(e.get("required", []))} for e in expected]
    tool = Answer(
        expected_fields=expected_json,
        text=row["output"],
        hollow_text=json.dumps(hollow_calls),
        missing=[f"{fn}.{dropped}"],
        prompt=prompt,
    )
    # JSON object: the arguments of the call with required fields.
    obj = Answer(
        expected_fields=req,
        text=json.dumps(args),
        hollow_text=json.dumps({key: v for key, v in args.items() if key != dropped}),
        missing=[dropped],
        prompt=prompt,
    )
    return tool, obj


def _build(rows: tuple[dict, ...]) -> AnswerBank:
    tool: list[Answer] = []
    objs: list[Answer] = []
    for i, row in enumerate(rows):
        pair = row_answers(int(row.get("line", i)), row)
        if pair is not None:
            tool.append(pair[0])
            objs.append(pair[1])
    if not tool:
        raise ValueError("no usable healthy tool-call rows in bfcl_outputs.jsonl")
    return AnswerBank(tool_calls=tuple(tool), json_objects=tuple(objs))


@lru_cache(maxsize=4)
def _bank_cached(data_dir: Path) -> AnswerBank:
    return _build(load_bfcl_rows(data_dir))


def load_answer_bank(data_dir: str | Path | None = None) -> AnswerBank:
    """Build (once per data folder) the :class:`AnswerBank` from BFCL outputs.

    Raises :class:`~pipeline.tools.simulate.traces.DataNotFoundError` if the file is
    missing, ``ValueError`` if no row is usable.
    """
    return _bank_cached(resolve_data_dir(data_dir))
