"""Every compression codec a gateway's Kafka client may choose is decodable by the worker.

aiokafka decodes snappy, lz4 and zstd record batches only when `cramjam` is installed
(aiokafka docs, "Optional compression dependencies"); without it a batch from franz-go (snappy by
default) or librdkafka with `compression.type=zstd` raises `UnsupportedCodecError` in the consumer.
"""

from __future__ import annotations

import pytest
from aiokafka import codec


@pytest.mark.parametrize(
    ("name", "compress", "decompress"),
    [
        ("gzip", codec.gzip_encode, codec.gzip_decode),
        ("snappy", codec.snappy_encode, codec.snappy_decode),
        ("lz4", codec.lz4_encode, codec.lz4_decode),
        ("zstd", codec.zstd_encode, codec.zstd_decode),
    ],
)
def test_codec_round_trips_a_batch(name: str, compress, decompress) -> None:
    payload = b'{"event_id":"e-1","channel":"chan-a","status":"ok"}' * 50
    assert decompress(compress(payload)) == payload, name
