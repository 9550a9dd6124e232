"""Issue #17: the demo and the simulator run from a plain clone (no ``../shared`` beside it).

The repository's committed HEAD is cloned into an empty temporary folder
(nothing beside the clone) and run from there with ``PYTHONPATH`` set to
the clone, so the code finds neither ``../shared/data`` nor this checkout:
the simulator must fall back to the samples shipped in the package.
Uncommitted changes are not in the clone.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHANNEL = "replicate/llama-13b@free"

#: Runs in the clone: the demo's data path (build the scenario's events), then the in-process engine.
REPLAY = """
import json, pipeline
from pipeline.engine.replay import replay
from pipeline.tools.simulate import WARMUP_S, get_scenario
from pipeline.tools.simulate.traces import describe_data_source, resolve_data_dir
start = 1_780_000_000_000 - 1_780_000_000_000 % 3_600_000
sc = get_scenario("sparse-consecutive-failures")
events = list(sc.events(start_ms=start, seed=0))
_, verdicts = replay(iter(events))
opened = [v for v in verdicts if v.channel == "@CHANNEL@" and v.state == "open"]
print(json.dumps({"pipeline": pipeline.__file__, "folder": str(resolve_data_dir()), "source": describe_data_source(),
                  "events": len(events), "open_s": [(v.ts_ms - start) / 1000 - WARMUP_S for v in opened],
                  "reasons": opened[0].reasons if opened else None}))
""".replace("@CHANNEL@", CHANNEL)


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """``git clone`` of this repository's HEAD into ``<empty tmp>/repo``."""
    git = shutil.which("git")
    if git is None or not (REPO / ".git").exists():
        pytest.skip(f"needs git and a git checkout at {REPO}")
    dest = tmp_path_factory.mktemp("plainclone") / "repo"
    subprocess.run([git, "clone", "-q", str(REPO), str(dest)], check=True, timeout=120)
    assert sorted(p.name for p in dest.parent.iterdir()) == ["repo"]
    return dest


def clone_env(clone: Path) -> dict[str, str]:
    """This environment without CHANNEL_HEALTH_* settings, with PYTHONPATH = the clone."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHANNEL_HEALTH_") and k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(clone), COLUMNS="200", PYTHONUNBUFFERED="1")
    return env


def test_plain_clone_builds_a_scenario_from_the_shipped_samples(clone):
    res = subprocess.run([sys.executable, "-c", REPLAY], cwd=clone, env=clone_env(clone), capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.splitlines()[-1])
    assert Path(out["pipeline"]).is_relative_to(clone)
    assert out["folder"] == str(clone.resolve() / "pipeline" / "tools" / "simulate" / "samples")
    assert out["source"] == ("traces: shipped samples (pipeline/tools/simulate/samples; full sets not found at "
                             f"{clone.resolve().parent / 'shared' / 'data'})")
    # 7 failures 75 s apart from the fault start; the breaker opens on the 5th (at 300 s + its 250 ms latency).
    assert out["reasons"] == ["consecutive_failures"]
    assert out["open_s"][0] == pytest.approx(300.25, abs=0.5)


@pytest.mark.integration
def test_plain_clone_runs_the_demo_end_to_end(clone, tmp_path):
    """``channel-health demo`` from the clone: embedded broker + worker + chDB, verdicts, summary, rc 0."""
    cmd = [sys.executable, "-m", "pipeline.cli", "demo", "--scenario", "sparse-consecutive-failures",
           "--speed", "0", "--timeout-s", "240", "--data-dir", str(tmp_path / "demo")]
    env = clone_env(clone)
    env["CHANNEL_HEALTH_QUALITY"] = "off"  # no texts in this scenario; skip loading the embedding model
    res = subprocess.run(cmd, cwd=clone, env=env, capture_output=True, text=True, timeout=420)
    out = res.stdout + res.stderr
    if "no Tansu broker binary" in out:
        pytest.skip("embedded broker not available")
    assert res.returncode == 0, out[-4000:]
    assert "traces: shipped samples (pipeline/tools/simulate/samples; full sets not found at" in out
    assert re.search(rf"{re.escape(CHANNEL)}\s+healthy → open\s+weight 0\.00\s+consecutive_failures", out), out[-4000:]
    # The summary's example query reads the verdicts back from chDB.
    assert re.search(rf"{re.escape(CHANNEL)}\s*│\s*open\s*│", out) or re.search(rf"{re.escape(CHANNEL)}\s+open\s", out), \
        out[-3000:]
    # The demo ends with the faulted channel's HTML report (issue #21).
    report = re.search(rf"Report of {re.escape(CHANNEL)}: (\S+\.html)", out)
    assert report and Path(report.group(1)).stat().st_size > 20_000, out[-2000:]


def test_plain_clone_quality_train_names_the_missing_labels_in_one_line(clone):
    """The quality model's training needs the full MT-bench set: one clear line, before loading any model."""
    if importlib.util.find_spec("sentence_transformers") is None:  # find, not import: torch takes seconds
        pytest.skip("quality extras (sentence-transformers) not installed")
    res = subprocess.run([sys.executable, "-m", "pipeline.cli", "quality", "train"], cwd=clone, env=clone_env(clone),
                         capture_output=True, text=True, timeout=300)
    missing = clone.resolve().parent / "shared" / "data" / "llm-answers-judged" / "mt_bench_judged.jsonl"
    assert res.returncode == 2, res.stderr[-3000:]
    assert res.stderr.strip() == f"no --labels and {missing} is absent"
