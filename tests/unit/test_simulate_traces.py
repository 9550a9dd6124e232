"""Loaders of the real data behind the simulator (pipeline/tools/simulate/traces.py, answers.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.tools.simulate.answers import load_answer_bank
from pipeline.tools.simulate.traces import (
    DEFAULT_DATA_DIR,
    DataNotFoundError,
    list_llmperf,
    load_azure_trace,
    load_bfcl_rows,
    load_llmperf,
    resolve_data_dir,
    status_for_error_code,
)

needs_data = pytest.mark.skipif(
    not DEFAULT_DATA_DIR.is_dir(), reason=f"shared data folder {DEFAULT_DATA_DIR} is absent"
)


def test_default_data_dir_is_beside_the_repo():
    assert DEFAULT_DATA_DIR.parts[-2:] == ("shared", "data")


def test_missing_data_dir_raises_clear_error(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(DataNotFoundError, match="shared data folder not found"):
        resolve_data_dir(missing)
    with pytest.raises(DataNotFoundError, match="data file not found"):
        load_llmperf("groq_70b", tmp_path)
    with pytest.raises(DataNotFoundError, match="no llmperf files"):
        list_llmperf(tmp_path)


def test_status_for_error_code_mapping():
    assert status_for_error_code(None) == "ok"
    assert status_for_error_code(429) == "rate_limited"
    assert status_for_error_code(-100) == "error"
    assert status_for_error_code(-1) == "error"
    assert status_for_error_code(503) == "error"


@needs_data
def test_azure_traces_shape_and_rates():
    conv = load_azure_trace("conv")
    code = load_azure_trace("code")
    assert len(conv.arrival_s) == 19_366
    assert len(code.arrival_s) == 8_819
    assert conv.arrival_s[0] == 0.0 and np.all(np.diff(conv.arrival_s) >= 0)
    assert conv.span_s == pytest.approx(3501.72, abs=0.01)
    assert conv.mean_rate_rps == pytest.approx(5.53, abs=0.01)
    assert int(np.median(conv.context_tokens)) == 1020
    assert int(np.median(conv.generated_tokens)) == 129
    env = conv.burst_envelope()
    assert env.mean() == pytest.approx(1.0)
    assert 0.1 < env.min() < 0.2 and 1.8 < env.max() < 1.9
    with pytest.raises(ValueError, match="valid"):
        load_azure_trace("chat")  # type: ignore[arg-type]


@needs_data
def test_llmperf_files_and_statuses():
    names = list_llmperf()
    assert len(names) == 19 and "groq_70b" in names
    lepton = load_llmperf("lepton_70b")
    assert len(lepton) == 150
    assert lepton.status.count("rate_limited") == 130
    assert lepton.status[:10] == ("ok",) * 10
    bedrock = load_llmperf("bedrock_13b")
    assert bedrock.status.count("error") == 97
    groq = load_llmperf("groq_70b")
    assert groq.failure_share == 0.0
    assert float(np.median(groq.e2e_latency_s)) == pytest.approx(0.8052, abs=1e-4)
    assert len(load_llmperf("replicate_70b")) == 145


@needs_data
def test_answer_bank_uses_healthy_native_tool_calls_and_drops_required_fields():
    rows = load_bfcl_rows()
    assert len(rows) == 1673
    bank = load_answer_bank()
    assert len(bank.tool_calls) == len(bank.json_objects) == 770
    ans = bank.tool_calls[0]
    assert ans.expected_fields == [{"function": "find_instrument", "required": ["budget", "type"]}]
    assert json.loads(ans.text) == [{"find_instrument": '{"budget": 1000, "type": "acoustic"}'}]
    assert ans.missing == ["find_instrument.type"]
    hollow_args = json.loads(json.loads(ans.hollow_text)[0]["find_instrument"])
    assert hollow_args == {"budget": 1000}
    obj = bank.json_objects[0]
    assert obj.expected_fields == ["budget", "type"]
    assert json.loads(obj.text) == {"budget": 1000, "type": "acoustic"}
    assert json.loads(obj.hollow_text) == {"budget": 1000}
    for a in bank.json_objects:  # every healthy object has all required keys, hollow misses one
        parsed = json.loads(a.text)
        assert all(k in parsed for k in a.expected_fields)
        assert a.missing[0] not in json.loads(a.hollow_text)
