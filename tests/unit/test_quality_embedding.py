"""Text cleaning and the offline embedder/scorer on hostile input: never a crash, reasons counted."""

from __future__ import annotations

import time

import numpy as np
import pytest

from pipeline.quality.embedding import DEFAULT_MODEL_NAME, MAX_CHARS, clean_text, shared_embedder
from pipeline.quality.features import STAT_NAMES, tail_of, text_stats

pytest.importorskip("sentence_transformers")

BAD = {
    "empty": "",
    "blank": "   \n\t ",
    "none": None,
    "huge": "lorem ipsum dolor " * 60_000,  # ~1 MB
    "bytes_invalid": b"caf\xe9 \xff\xfe answer",
    "lone_surrogate": "answer with a broken byte \udcff here",
    "control": "an\x00swer\x07 text",
    "chinese": "巴黎是法国的首都，也是该国最大的城市。",
}


@pytest.fixture(scope="module")
def embedder():
    return shared_embedder()


def test_clean_text_reasons():
    assert clean_text("")[1] == ["empty"]
    assert clean_text(None) == ("", ["not_text"])
    assert clean_text(42)[1] == ["not_text"]
    text, why = clean_text(BAD["huge"])
    assert len(text) <= MAX_CHARS and "truncated" in why
    assert clean_text(BAD["bytes_invalid"])[1] == ["invalid_utf8"]
    text, why = clean_text(BAD["lone_surrogate"])
    assert why == ["invalid_utf8"] and "\ufffd" in text
    text.encode("utf-8")  # now encodable
    assert clean_text(BAD["control"]) == ("answer text", ["control_chars"])
    assert clean_text(BAD["chinese"])[1] == ["non_latin"]
    assert clean_text("Ünïcödé façade naïve résumé")[1] == []


def test_stats_and_tail_handle_bad_input():
    for v in BAD.values():
        s = text_stats("a prompt", v)
        assert s.shape == (len(STAT_NAMES),) and np.all(np.isfinite(s))
        tail_of(v)
    # 1 MB is clipped, not "very thorough"
    assert text_stats(None, BAD["huge"])[0] == text_stats(None, "x" * 9000)[0]


def test_embedder_is_offline_default_and_handles_bad_texts(embedder):
    assert embedder.info.name == DEFAULT_MODEL_NAME and embedder.dim == 384
    before = embedder.counters.copy()
    t = time.perf_counter()
    E = embedder.encode(list(BAD.values()), batch_size=8)
    assert time.perf_counter() - t < 20
    assert E.shape == (len(BAD), 384) and E.dtype == np.float32
    assert np.all(np.isfinite(E))
    got = embedder.counters - before
    assert got["empty"] == 2 and got["not_text"] == 1 and got["truncated"] == 1
    assert got["invalid_utf8"] == 2 and got["control_chars"] == 1 and got["non_latin"] == 1


def test_encode_empty_batch(embedder):
    assert embedder.encode([], batch_size=4).shape == (0, 384)
