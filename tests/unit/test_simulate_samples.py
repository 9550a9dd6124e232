"""The trace samples shipped in the package and the choice between them and ../shared/data (SPEC §6)."""

from __future__ import annotations

import gzip
import itertools
import tomllib
from pathlib import Path

import numpy as np
import pytest

from pipeline.tools.simulate import traces
from pipeline.tools.simulate.answers import load_answer_bank
from pipeline.tools.simulate.chat_answers import GOOD_SCORE, load_chat_pool
from pipeline.tools.simulate.samples import SAMPLES_DIR, derive
from pipeline.tools.simulate.scenarios import get_scenario
from pipeline.tools.simulate.traces import (
    DEFAULT_DATA_DIR,
    DataNotFoundError,
    describe_data_source,
    list_llmperf,
    load_azure_trace,
    load_bfcl_rows,
    load_llmperf,
    resolve_data_dir,
)

REPO = Path(__file__).resolve().parents[2]
needs_full = pytest.mark.skipif(
    not DEFAULT_DATA_DIR.is_dir(), reason=f"full sets absent: {DEFAULT_DATA_DIR} (a plain clone has only the samples)"
)


def _shipped_files() -> set[Path]:
    return {p for p in SAMPLES_DIR.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")}


def test_samples_are_used_when_the_shared_folder_is_absent(monkeypatch, tmp_path):
    absent = tmp_path / "shared" / "data"
    monkeypatch.setattr(traces, "DEFAULT_DATA_DIR", absent)
    assert resolve_data_dir() == SAMPLES_DIR
    assert describe_data_source() == f"traces: shipped samples (pipeline/tools/simulate/samples; full sets not found at {absent})"
    absent.mkdir(parents=True)
    assert resolve_data_dir() == absent.resolve()
    assert describe_data_source() == f"traces: full sets ({absent.resolve()})"


def test_a_named_folder_that_is_missing_is_an_error_not_a_fallback(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(DataNotFoundError, match="shared data folder not found"):
        describe_data_source(missing)
    with pytest.raises(DataNotFoundError, match="shared data folder not found"):
        next(get_scenario("recovery", data_dir=missing).events(start_ms=0))
    assert describe_data_source(SAMPLES_DIR) == "traces: shipped samples (pipeline/tools/simulate/samples)"


def test_sample_traces_hold_every_request():
    conv = load_azure_trace("conv", SAMPLES_DIR)
    code = load_azure_trace("code", SAMPLES_DIR)
    assert (len(conv.arrival_s), len(code.arrival_s)) == (19_366, 8_819)
    assert conv.arrival_s[0] == 0.0 and np.all(np.diff(conv.arrival_s) >= 0)
    assert np.array_equal(conv.arrival_s, np.floor(conv.arrival_s))  # whole seconds
    assert len(conv.counts_per_second()) == 3502  # the full trace spans 3,501.72 s
    assert int(np.median(conv.context_tokens)) == 1020
    assert int(np.median(conv.generated_tokens)) == 129
    names = list_llmperf(SAMPLES_DIR)
    assert len(names) == 19 and names[0] == "anyscale_13b"
    lepton = load_llmperf("lepton_70b", SAMPLES_DIR)
    assert lepton.status.count("rate_limited") == 130 and lepton.status[:10] == ("ok",) * 10
    assert len(load_llmperf("replicate_70b", SAMPLES_DIR)) == 145
    with pytest.raises(DataNotFoundError, match="no llmperf file 'acme_1b'"):
        load_llmperf("acme_1b", SAMPLES_DIR)


def test_sample_answers_give_the_simulators_pools():
    rows = load_bfcl_rows(SAMPLES_DIR)
    assert len(rows) == 770
    assert all(r["license"].startswith("Apache-2.0") for r in rows)
    bank = load_answer_bank(SAMPLES_DIR)
    assert (len(bank.tool_calls), len(bank.json_objects)) == (770, 770)
    pool = load_chat_pool(SAMPLES_DIR)
    assert len(pool) == 32 and min(a.score for a in pool) >= GOOD_SCORE
    assert len(load_chat_pool(SAMPLES_DIR, size=64)) == 64
    with pytest.raises(ValueError, match="the shipped samples hold 64 answers, 65 asked"):
        load_chat_pool(SAMPLES_DIR, size=65)


def test_samples_stay_small_and_carry_their_licences():
    files = _shipped_files()
    assert sum(p.stat().st_size for p in files) < 400_000
    for folder in ("azure-llm-inference-2023", "llmperf-leaderboard"):
        assert (SAMPLES_DIR / folder / "LICENSE").is_file()
    for folder in ("function-call-outputs", "llm-answers-judged"):
        assert (SAMPLES_DIR / folder / "SOURCES_AND_LICENSES.txt").is_file()
    assert "CC-BY-4.0" in (SAMPLES_DIR / "README.md").read_text()


def test_package_data_ships_every_sample_file():
    """pyproject's package-data globs (as setuptools expands them) name exactly the shipped files."""
    conf = tomllib.loads((REPO / "pyproject.toml").read_text())
    globs = conf["tool"]["setuptools"]["package-data"]["pipeline.tools.simulate.samples"]
    matched = {p for g in globs for p in SAMPLES_DIR.glob(g) if p.is_file()}
    assert matched == _shipped_files()


def test_derive_names_a_missing_folder_in_one_line(tmp_path, capsys):
    assert derive.main(["--data-dir", str(tmp_path / "nope"), "--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "shared data folder not found" in err


@needs_full
def test_shipped_samples_match_their_derivation():
    for name, text in derive.derive_all(DEFAULT_DATA_DIR).items():
        assert gzip.decompress((SAMPLES_DIR / name).read_bytes()).decode("utf-8") == text, name
    for name in derive.LICENCE_FILES:
        assert (SAMPLES_DIR / name).read_bytes() == (DEFAULT_DATA_DIR / name).read_bytes(), name


@needs_full
@pytest.mark.parametrize("name", ["content-hollowing", "quality-drift", "real-providers"])
def test_scenario_events_are_the_same_on_samples_and_full_sets(name):
    def first(data_dir, n=30_000):
        return list(itertools.islice(get_scenario(name, data_dir=data_dir).events(start_ms=1_700_000_000_000, seed=3), n))

    full = first(DEFAULT_DATA_DIR)
    assert len(full) > 1_000
    assert first(SAMPLES_DIR) == full


def test_simulate_cli_names_a_missing_traces_dir_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from pipeline.cli.main import app

    missing = tmp_path / "nope"
    res = CliRunner().invoke(app, ["simulate", "--scenario", "recovery", "--traces-dir", str(missing)],
                             env={"CHANNEL_HEALTH_KAFKA_BOOTSTRAP": "127.0.0.1:1"})
    assert res.exit_code == 2
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert f"shared data folder not found: {missing}" in res.output
