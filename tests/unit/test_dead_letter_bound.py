"""Dead letters are bounded by the size of the *encoded* record, whatever the bytes (issue #16 item 2).

Issue #16: a 200 KB message of ``0x01`` bytes was dead-lettered with its copy
JSON-escaped to 1.2 MB (``\\u0001`` is 6 bytes), over the producer's 1 MB
limit; the send failed and the worker stopped on that offset for good. Here:
the bound on the record (property test over arbitrary bytes and sizes), the
``0x01`` and 20 MB messages, the budget derived from the producer's request
limit, and the publisher that retries a refused dead letter without its copy,
then counts it -- never raises.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from pathlib import Path

import jsonschema
import msgspec
import pytest
from aiokafka.errors import KafkaTimeoutError, MessageSizeTooLargeError
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.config import ConfigError, load_settings
from pipeline.ingest import dead_letter as DL
from pipeline.ingest.dead_letter import DEFAULT_DLQ_RAW_BYTES, DeadLetter, max_record_bytes, raw_budget
from pipeline.ingest.decode import Decoder
from pipeline.stream.dead_letters import DeadLetterPublisher
from pipeline.stream.runtime import faust_broker_kwargs

NOW = 1_750_000_000_000
MB = 1_000_000
SCHEMA = jsonschema.Draft202012Validator(
    json.loads((Path(__file__).resolve().parents[2] / "schemas" / "dead_letter.v1.json").read_text()))


def record_size(d: DeadLetter, budget: int) -> tuple[dict, int]:
    """The decoded DLQ value and the record's size as aiokafka's producer checks it against max_request_size."""
    value = d.to_kafka_value(budget)
    size = DefaultRecordBatchBuilder.estimate_size_in_bytes(d.kafka_key(), value, [])
    return msgspec.json.decode(value), size


def copy_of(value: dict) -> bytes:
    return value["raw"].encode() if value["raw_encoding"] == "utf-8" else base64.b64decode(value["raw"])


def check(d: DeadLetter, budget: int) -> dict:
    """Every invariant of one dead letter's record; returns its decoded value."""
    value, size = record_size(d, budget)
    assert size <= max_record_bytes(budget), (size, budget)
    assert len(msgspec.json.encode(value["raw"])) - 2 <= budget  # the escaped copy fits its budget
    SCHEMA.validate(value)
    raw = bytes(d.raw)
    copy = copy_of(value)
    assert raw.startswith(copy)
    assert value["raw_truncated"] is (len(copy) < len(raw))
    assert value["raw_size"] == len(raw)
    assert value["raw_sha256"] == hashlib.sha256(raw).hexdigest()
    assert value["reason"] == d.reason[:64] or value["reason"].endswith("...")
    return value


floods = st.builds(lambda unit, n: unit * n, st.sampled_from([b"\x01", b'"', b"\\", b"\n", b"x", b"\xff",
                                                               "é".encode(), "𝄞".encode(), b"\x00\x80"]),
                   st.integers(0, 400_000))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(raw=st.binary(max_size=5_000) | floods | st.text(max_size=3_000).map(str.encode),
       budget=st.integers(0, 300_000) | st.sampled_from([0, 1, 5, 6, 7, DEFAULT_DLQ_RAW_BYTES]),
       event_id=st.none() | st.text(max_size=2_000), detail=st.text(max_size=2_000), reason=st.text(max_size=200),
       index=st.none() | st.integers(-5, 2**70))
def test_record_is_bounded_whatever_the_bytes(raw, budget, event_id, detail, reason, index):
    check(DeadLetter(reason, detail, raw, event_id, index), budget)


def test_the_escape_table_is_msgspecs():
    for b in range(128):
        assert len(msgspec.json.encode(chr(b))) - 2 == DL._ESCAPED[b], b
    assert msgspec.json.encode("é𝄞") == b'"' + "é𝄞".encode() + b'"'  # non-ASCII: its UTF-8 bytes, 1 each


def test_the_0x01_message_of_issue_16_is_sent_as_base64_within_the_budget():
    raw = b"\x01" * 200_000
    (dead,) = Decoder().decode(raw, NOW).dead_letters
    value = check(dead, DEFAULT_DLQ_RAW_BYTES)
    # Escaped it would be 1.2 MB; base64 keeps 192,000 of its bytes in 256,000 characters.
    assert (value["reason"], value["raw_encoding"], len(copy_of(value)), value["raw_truncated"]) == (
        "invalid_json", "base64", 192_000, True)
    assert record_size(dead, raw_budget(MB))[1] < MB // 2


@pytest.mark.parametrize("unit", [b"\x01", b"x", b"\xff", b"{"])
def test_a_20_mb_message_is_too_large_and_its_dead_letter_small(unit):
    raw = unit * 20_000_000
    (dead,) = Decoder().decode(raw, NOW).dead_letters
    value = check(dead, raw_budget(MB))
    assert value["reason"] == "too_large" and value["raw_size"] == 20_000_000 and value["raw_truncated"] is True
    assert len(copy_of(value)) == (256_000 if unit in (b"x", b"{") else 192_000)


def test_text_stays_text_when_it_keeps_more_than_base64_and_never_splits_a_character():
    value = check(DeadLetter("invalid_json", "d", "é".encode() * 300_000), 255_999)
    assert (value["raw_encoding"], value["raw"]) == ("utf-8", "é" * 127_999)
    value = check(DeadLetter("invalid_json", "d", b'{"a": "' + b"\n" * 10 + b"x" * 500_000), 1_000)
    assert (value["raw_encoding"], len(value["raw"])) == ("utf-8", 1_000 - 2 - 10 - 1)  # 2 quotes, 10 newlines
    value = check(DeadLetter("invalid_json", "d", b"\x01" * 10), 1_000)  # the whole message fits: text
    assert (value["raw_encoding"], value["raw"], value["raw_truncated"]) == ("utf-8", "\x01" * 10, False)


def test_budget_from_the_producer_request_limit():
    assert raw_budget(1_000_000) == DEFAULT_DLQ_RAW_BYTES
    assert raw_budget(65_536) == 32_768 - max_record_bytes(0)
    assert max_record_bytes(raw_budget(65_536)) == 32_768
    with pytest.raises(ValueError, match="leaves no room for a dead letter"):
        raw_budget(10_000)


def test_producer_request_limit_setting():
    env = {"CHANNEL_HEALTH_KAFKA_BOOTSTRAP": "k:9092"}
    assert load_settings(env).producer_max_request_bytes == 1_000_000
    s = load_settings({**env, "CHANNEL_HEALTH_PRODUCER_MAX_REQUEST_BYTES": "2000000"})
    assert s.producer_max_request_bytes == 2_000_000
    assert faust_broker_kwargs(s)["producer_max_request_size"] == 2_000_000
    for bad in ("1000", "lots"):
        with pytest.raises(ConfigError, match="PRODUCER_MAX_REQUEST_BYTES"):
            load_settings({**env, "CHANNEL_HEALTH_PRODUCER_MAX_REQUEST_BYTES": bad})


class FakeProducer:
    """faust transport producer: refuses values over ``limit`` at send (as aiokafka does), and fails
    the delivery of every value when ``broker_down``."""

    def __init__(self, limit: int = MB, broker_down: bool = False) -> None:
        self.limit, self.broker_down = limit, broker_down
        self.acked: list[tuple[bytes | None, dict]] = []

    async def send(self, topic, key, value, partition, timestamp, headers):
        if len(value) > self.limit:
            raise MessageSizeTooLargeError(f"{len(value)} bytes")
        fut = asyncio.get_running_loop().create_future()
        if self.broker_down:
            fut.set_exception(KafkaTimeoutError())
        else:
            self.acked.append((key, msgspec.json.decode(value)))
            fut.set_result(None)
        return fut


def test_a_refused_dead_letter_is_sent_again_without_its_copy_then_counted_never_raised(caplog):
    dead = [DeadLetter("invalid_json", "d", b"\x01" * 200_000, "e1"), DeadLetter("invalid_json", "d", b"{", "e2")]
    pub = DeadLetterPublisher("dlq", DEFAULT_DLQ_RAW_BYTES)
    producer = FakeProducer(limit=100_000)  # a broker with a lower limit than the budget assumes
    asyncio.run(pub.publish(producer, dead))
    assert (pub.sent, pub.sent_without_raw, pub.lost) == (1, 1, 0)
    (k1, v1), (k2, v2) = sorted(producer.acked, key=lambda kv: kv[0])
    assert (k1, v1["raw"], v1["raw_truncated"], v1["raw_size"]) == (b"e1", "", True, 200_000)
    assert v1["raw_sha256"] == hashlib.sha256(b"\x01" * 200_000).hexdigest()
    assert (k2, v2["raw"], v2["raw_truncated"]) == (b"e2", "{", False)

    down = DeadLetterPublisher("dlq", DEFAULT_DLQ_RAW_BYTES)
    asyncio.run(down.publish(FakeProducer(broker_down=True), dead))
    assert (down.sent, down.sent_without_raw, down.lost, dict(down.lost_by_reason)) == (0, 0, 2, {"invalid_json": 2})
    assert "lost (not sent), processing continues" in caplog.text


def test_publisher_lets_cancellation_through():
    class Cancelled(FakeProducer):
        async def send(self, *a):
            raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(DeadLetterPublisher("dlq", 10).publish(Cancelled(), [DeadLetter("r", "d", b"x")]))


def test_unencodable_text_fields_are_replaced_not_raised():
    value = check(DeadLetter("invalid_json", "bad \ud800 detail", b"{", "id\udfff"), 100)
    assert (value["detail"], value["event_id"]) == ("bad ? detail", "id?")
    assert DeadLetter("r", "d", b"", "id\udfff").kafka_key() == b"id?"
