"""A seeded corpus of hostile ``gateway.requests`` messages (issue #16 item 9), for a live worker.

:func:`build_corpus` mixes good traffic with everything issue #16 and SPEC
§3 list as bad input: invalid JSON, binary garbage (invalid UTF-8), ``0x01``
floods, huge messages (5 MB bodies, one message of ``huge_bytes``), deep
nesting, wrong types, absurd values (negative latency, ``NaN``/``Infinity``,
``1e999``, timestamps years off, 2^40 tokens), odd channel names (RTL and
bidi controls, NUL, zero-width, 10,000 characters), batches mixing good and
bad events, ``event_id``\\ s re-sent with another ``ts_ms``, empty values and
tombstones, null keys, and ``new_channels`` channels with one event each.

Each :class:`CorpusMessage` carries how many inputs it holds
(``elements``), computed independently of the pipeline's decoder with the
standard library's JSON parser (the decoder's contract, SPEC §3 / module doc
of :mod:`pipeline.ingest.decode`: a batch envelope of N >= 1 elements yields
N events or dead letters, any other message exactly one). Deterministic for
a given seed and ``now_ms``; only the tests use it.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

MAX_MESSAGE_BYTES = 1_000_000  # the worker decoder's default limit (larger: one too_large dead letter)
MINUTE_MS = 60_000
DAY_MS = 86_400_000


@dataclass(frozen=True)
class CorpusMessage:
    """One Kafka message: ``key`` (None: null key), ``value`` (None: tombstone), its ``kind``,
    ``elements`` (inputs it holds, >= 1), and ``bad_ids``: event_ids of elements that must never be stored."""

    key: bytes | None
    value: bytes | None
    kind: str
    elements: int
    bad_ids: tuple[str, ...] = ()


def expected_elements(raw: bytes | None) -> int:
    """Inputs a message holds, by the stdlib JSON parser: N for ``{"events": [N >= 1 items]}`` within the
    size limit, else 1 (a tombstone, invalid UTF-8 or JSON, ``NaN``, nesting beyond the parser: one input)."""
    if raw is None or len(raw) > MAX_MESSAGE_BYTES:
        return 1

    def reject(_: str) -> None:
        raise ValueError("non-standard constant")

    try:
        doc = json.loads(raw.decode("utf-8"), parse_constant=reject)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return 1
    if isinstance(doc, dict) and isinstance(doc.get("events"), list) and doc["events"]:
        return len(doc["events"])
    return 1


@dataclass
class _Gen:
    rng: random.Random
    now_ms: int
    channels: list[str]
    ts_ms: int
    seq: int = 0
    sent_ids: list[tuple[str, int, str]] = field(default_factory=list)

    def eid(self, tag: str) -> str:
        self.seq += 1
        return f"{tag}-{self.seq}"

    def tick(self) -> int:
        """Event time of the next event: rises 0-50 ms per event (a 10,000-message corpus spans ~9 min)."""
        self.ts_ms += self.rng.randint(0, 50)
        return self.ts_ms

    def good(self, channel: str | None = None, tag: str = "ok") -> dict:
        ch = channel or self.rng.choice(self.channels)
        e = {"event_id": self.eid(tag), "ts_ms": self.tick(), "channel": ch, "route": "chat",
             "status": self.rng.choice(["ok", "ok", "ok", "error", "timeout"]),
             "latency_ms": round(self.rng.lognormvariate(5.3, 0.4), 2)}
        if self.rng.random() < 0.3:
            e.update(ttft_ms=round(e["latency_ms"] / 3, 2), input_tokens=self.rng.randint(1, 4000),
                     output_tokens=self.rng.randint(0, 2000), tier=self.rng.choice(["free", "paid"]))
        self.sent_ids.append((e["event_id"], e["ts_ms"], ch))
        return e

    def bad(self) -> dict:
        """A JSON object that is not a valid event (wrong type, missing field or absurd value)."""
        e = self.good(tag="bad")
        self.sent_ids.pop()
        r = self.rng.randrange(14)
        if r == 0:
            e["latency_ms"] = -self.rng.uniform(0.001, 1e6)  # negative latency
        elif r == 1:
            e["latency_ms"] = "fast"
        elif r == 2:
            e["ts_ms"] = "yesterday"
        elif r == 3:
            e["ts_ms"] = self.now_ms + self.rng.choice([1, -1]) * self.rng.randint(2, 30) * 365 * DAY_MS  # years off
        elif r == 4:
            del e[self.rng.choice(["channel", "ts_ms", "latency_ms", "status", "route"])]
        elif r == 5:
            e["channel"] = self.rng.choice([42, None, ["a"], {"x": 1}, True])
        elif r == 6:
            e["status"] = self.rng.choice(["exploded", "", "OK ", None])
        elif r == 7:
            e["input_tokens"] = self.rng.choice([2**40, -5, 1.5])
        elif r == 8:
            e["latency_ms"] = float("inf")  # not JSON: json.dumps writes Infinity
        elif r == 9:
            e["event_id"] = self.rng.choice(["", 12, None, "x" * 5_000])
        elif r == 10:
            e["ttft_ms"] = -1
        elif r == 11:
            e["route"] = self.rng.choice([7, None, ["chat"]])
        elif r == 12:
            e["ts_ms"] = self.rng.choice([-1, 0, 2**63, 1.5e12])
        else:
            e["http_status"] = self.rng.choice([-200, 99_999, "404"])
        return e


def _dumps(doc: object) -> bytes:
    return json.dumps(doc, ensure_ascii=False).encode("utf-8", "surrogatepass")


def _msg(key: bytes | None, value: bytes | None, kind: str, bad_ids: tuple[str, ...] = ()) -> CorpusMessage:
    return CorpusMessage(key, value, kind, expected_elements(value), bad_ids)


ODD_CHANNELS = [
    "\u0645\u0632\u0648\u062f/\u0646\u0645\u0648\u0630\u062c@paid",  # Arabic (RTL)
    "\u05e1\u05e4\u05e7/\u05de\u05d5\u05d3\u05dc@free",  # Hebrew (RTL)
    "prov/\u202emodel\u202c@paid",  # RIGHT-TO-LEFT OVERRIDE
    "prov/mo\u0000del@paid",  # NUL
    "prov/\u200bzero\u200dwidth@paid",
    "prov/\U0001f525model@paid",  # emoji (non-BMP)
    "prov/" + "long" * 2_500,  # 10,005 characters
    " ",
    "prov/model'); DROP TABLE request_events;--",
    "prov/\\x01\n\t@paid",
]


@dataclass(frozen=True)
class Corpus:
    """The messages in send order and ``last_ts_ms``: no event of the corpus is later."""

    messages: list[CorpusMessage]
    last_ts_ms: int


def build_corpus(seed: int, now_ms: int, *, messages: int = 10_000, new_channels: int = 2_000,
                 huge_bytes: int = 20_000_000, five_mb_bodies: int = 2) -> Corpus:
    """``messages`` (>= 1,000) hostile and good messages in a seeded order, the specials among them:
    one ``huge_bytes`` message, ``five_mb_bodies`` events with a 5 MB ``response_text``, a 200 KB
    ``0x01`` message, and ``new_channels`` one-event channels (spread through the corpus). Good
    events have ``ts_ms`` rising ~25 ms per event from ``now_ms - 30 min`` (bad ones may be years
    off). Raises ``ValueError`` for fewer than 1,000 messages or more new channels than half of them."""
    if messages < 1_000 or new_channels > messages // 2:
        raise ValueError("messages must be >= 1000 and new_channels <= messages / 2")
    rng = random.Random(seed)
    g = _Gen(rng, now_ms, [f"corpus{k}/model@{'paid' if k % 2 else 'free'}" for k in range(8)],
             now_ms - 30 * MINUTE_MS)
    out: list[CorpusMessage] = [
        _msg(b"flood", b"\x01" * 200_000, "0x01 200 KB (issue #16)"),
        _msg(b"huge", b"\x01" * huge_bytes, "huge 0x01"),
    ]
    for _ in range(five_mb_bodies):
        e = g.good(tag="body5mb")
        g.sent_ids.pop()
        e["response_text"] = "x" * (5 * 1024 * 1024)
        out.append(_msg(e["channel"].encode(), _dumps(e), "5 MB body", (e["event_id"],)))
    specials = len(out)
    new_at = set(rng.sample(range(messages - specials), new_channels))

    def one(k: int) -> CorpusMessage:
        if k in new_at:
            e = g.good(channel=f"new{k}/model@free", tag="new")
            return _msg(None if rng.random() < 0.5 else e["channel"].encode(), _dumps(e), "new channel")
        r = rng.random()
        key = None if rng.random() < 0.1 else rng.choice(g.channels).encode()
        if r < 0.30:
            return _msg(key, _dumps(g.good()), "good event")
        if r < 0.36:
            evs = [g.good() for _ in range(rng.randint(1, 30))]
            return _msg(key, _dumps({"events": evs}), "good batch")
        if r < 0.44:  # mixed batch: good and bad elements, non-objects, a repeated id
            elems: list[object] = []
            bad: list[str] = []
            for _ in range(rng.randint(2, 25)):
                p = rng.random()
                if p < 0.5:
                    elems.append(g.good())
                elif p < 0.85:
                    b = g.bad()
                    elems.append(b)
                    if isinstance(b.get("event_id"), str):
                        bad.append(b["event_id"])
                else:
                    elems.append(rng.choice([42, "event", None, [], [1, 2], True, {"events": []}]))
            if rng.random() < 0.3 and isinstance(elems[0], dict):
                elems.append(dict(elems[0]))  # the same event twice in one batch
            return _msg(key, _dumps({"events": elems}), "mixed batch", tuple(bad))
        if r < 0.52:
            b = g.bad()
            return _msg(key, _dumps(b), "bad event", (b["event_id"],) if isinstance(b.get("event_id"), str) else ())
        if r < 0.58:  # invalid JSON: cut, NaN/Infinity, trailing garbage, plain text
            text = _dumps(g.good(tag="cut"))
            g.sent_ids.pop()
            v = rng.choice([text[: rng.randrange(1, len(text))],
                            text.replace(b'"latency_ms": ', b'"latency_ms": NaN, "x": '),
                            text.replace(b'"latency_ms": ', b'"latency_ms": -Infinity, "x": '), text + b"}",
                            b"{'single': 'quotes'}", b"not json at all", b"{\"events\": [", b"\xef\xbb\xbf" + text])
            return _msg(key, v, "invalid json")
        if r < 0.64:  # binary garbage, mostly invalid UTF-8
            return _msg(key, rng.randbytes(rng.randint(1, 4_096)), "binary")
        if r < 0.67:  # 0x01 floods and other control characters
            return _msg(key, bytes([rng.choice([0, 1, 2, 0x1F, 0x7F])]) * rng.randint(1, 60_000), "control flood")
        if r < 0.70:  # deep nesting: top level, or inside one event's unknown field
            depth = rng.choice([50, 999, 1_001, 5_000, 50_000])
            if rng.random() < 0.5:
                return _msg(key, b"[" * depth + b"]" * depth, "deep array")
            e = g.good(tag="deep")
            g.sent_ids.pop()
            text = _dumps(e)
            return _msg(key, text[:-1] + b', "deep": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}", "deep object")
        if r < 0.74:  # wrong JSON type at the top, bad batch shapes
            return _msg(key, rng.choice([b"[1, 2, 3]", b"42", b'"event"', b"null", b"true", b'{"events": []}',
                                         b'{"events": 5}', b'{"events": {"a": 1}}', b"{}"]), "wrong shape")
        if r < 0.80:  # odd channel names (valid or not is the decoder's call)
            e = g.good(channel=rng.choice(ODD_CHANNELS), tag="odd")
            return _msg(key, _dumps(e), "odd channel")
        if r < 0.86 and g.sent_ids:  # an event_id already sent, again with another ts_ms
            eid, ts, ch = rng.choice(g.sent_ids)
            e = g.good(channel=ch, tag="dup")
            g.ts_ms += 1  # later than every event so far: never the same (channel, ts_ms, event_id) row twice
            e["event_id"], e["ts_ms"] = eid, g.ts_ms
            g.sent_ids[-1] = (eid, e["ts_ms"], ch)
            return _msg(key, _dumps(e), "re-sent event_id")
        if r < 0.89:
            value = rng.choice([b"", b" ", b"\n\t ", None])
            return _msg(key if value is not None else key or b"tombstone", value, "empty")  # Kafka: key or value
        if r < 0.90:  # large but under the limit, or just over it
            e = g.good(tag="big")
            size = rng.randint(700_000, 1_200_000) if rng.random() < 0.05 else rng.randint(10_000, 150_000)
            e["response_text"] = rng.choice(["y", "\u00e9", "\x01"]) * size
            return _msg(key, _dumps(e), "large body")
        e = g.good()
        e["gateway_id"] = rng.choice(["\u202e", "\x00", "g" * 300])
        return _msg(key, _dumps(e), "good event, odd optional")

    out.extend(one(k) for k in range(messages - specials))
    return Corpus(out, g.ts_ms)
