"""The bench's peak RSS of a stage is that stage's own, not its parent's (pipeline/tools/bench/rss.py)."""

import json
import subprocess
import sys

import numpy as np
import pytest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is Linux's")
def test_a_spawned_stage_does_not_report_its_parents_peak():
    """``ru_maxrss`` of an exec'd child keeps the larger of its peak and the memory it was forked from
    (Linux ``exec_mmap``); the bench parent holds a pre-built paced feed of hundreds of MB, which showed up
    as the worker's peak (636 MB on the bench). 300 MiB resident here; a bare interpreter peaks under 100."""
    held = np.ones(300 * 2**20 // 8)  # 300 MiB, touched
    code = ("import json, resource; from pipeline.tools.bench.rss import peak_rss_mb; "
            "print(json.dumps([peak_rss_mb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024]))")
    own, inherited = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                               check=True).stdout)
    assert held.sum() > 0
    assert inherited > 300  # the kernel's ru_maxrss carries the parent's memory: the trap this avoids
    assert own < 100
