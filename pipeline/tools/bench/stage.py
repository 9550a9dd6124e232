"""How the benchmark runs its stages: one subprocess each, JSON in and out.

Every measured stage runs in a fresh ``python -m pipeline.tools.bench.<module>
'<json args>'`` process, so its peak RSS is its own, chDB gets its own data
directory in its own process (chDB allows one process per directory), and
faust's event loop and signal handling are not shared. A stage writes its
result as JSON to ``args["out"]``; its stdout/stderr go to a log file whose
tail is shown when it fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable


class StageFailed(RuntimeError):
    """A stage exited without a result; the message holds its log tail."""


def stage_main(fn: Callable[[dict[str, Any]], dict[str, Any] | None]) -> None:
    """Entry point of a stage module: parse ``argv[1]``, run ``fn``, write its result (if any)."""
    args = json.loads(sys.argv[1])
    result = fn(args)
    if result is not None:
        write_result(args, result)


def write_result(args: dict[str, Any], result: dict[str, Any]) -> None:
    """Write a stage result atomically to ``args["out"]``."""
    out = Path(args["out"])
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(out)


def scratch_dir(args: dict[str, Any], prefix: str) -> str:
    """A new directory for a stage's chDB data or faust datadir: under ``args["scratch"]``
    (which the orchestrator deletes after the run) or, without it, a temporary one."""
    root = args.get("scratch")
    if root:
        Path(root).mkdir(parents=True, exist_ok=True)
    return tempfile.mkdtemp(prefix=prefix, dir=root or None)


def spawn(module: str, args: dict[str, Any], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start stage ``module`` (``pipeline.tools.bench.<module>``) in the background.

    Its chDB and faust data go under ``<log dir>/scratch`` unless ``args`` names another place.
    """
    args = {"scratch": str(log_path.parent / "scratch"), **args}
    log = open(log_path, "ab")
    try:
        return subprocess.Popen([sys.executable, "-m", f"pipeline.tools.bench.{module}", json.dumps(args)],
                                stdout=log, stderr=subprocess.STDOUT, env=env or dict(os.environ))
    finally:
        log.close()


def log_tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def wait_result(proc: subprocess.Popen, out: Path, log_path: Path, timeout_s: float, name: str) -> dict[str, Any]:
    """Wait for a stage's result file (the process may exit right after writing it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if out.exists():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            return json.loads(out.read_text())
        if proc.poll() is not None:
            if out.exists():
                continue
            raise StageFailed(f"stage {name} exited with code {proc.returncode} and no result; "
                              f"end of {log_path}:\n{log_tail(log_path)}")
        time.sleep(0.1)
    proc.kill()
    proc.wait(5)
    raise StageFailed(f"stage {name} gave no result within {timeout_s:.0f} s; end of {log_path}:\n{log_tail(log_path)}")


def run_stage(module: str, args: dict[str, Any], workdir: Path, name: str, timeout_s: float = 600.0,
              env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one stage to completion and return its result."""
    out = workdir / f"{name}.json"
    log_path = workdir / f"{name}.log"
    out.unlink(missing_ok=True)
    proc = spawn(module, {**args, "out": str(out)}, log_path, env)
    return wait_result(proc, out, log_path, timeout_s, name)
