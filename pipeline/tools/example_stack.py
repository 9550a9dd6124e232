"""The embedded default for ``examples/``: broker, topics and one worker, stopped in order (children die with us).

:func:`embedded_stack` starts the embedded Tansu broker (or uses
``CHANNEL_HEALTH_KAFKA_BOOTSTRAP`` when set), creates the topics, starts one
``channel-health worker`` on a chDB directory under ``data_dir`` (its log in
``data_dir/worker.log``), yields the settings, and on exit stops the worker (SIGTERM: it drains) and
then the broker (:func:`pipeline.tools.demo_stop.stop_in_order`). The broker
gets the kernel's parent-death signal and the worker watches its parent, so
neither outlives the example, however it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator

from pipeline.config import Settings, load_settings

__all__ = ["embedded_stack"]


@contextlib.contextmanager
def embedded_stack(data_dir: Path, say: Callable[[str], None] = print) -> Iterator[Settings]:
    """Broker + topics + one worker (module docstring); yields the :class:`~pipeline.config.Settings` to use.

    Raises ``RuntimeError`` when the worker exits at once.
    """
    from pipeline.kafka.topics import ensure
    from pipeline.tools.demo_stop import stop_in_order, worker_popen_kwargs
    from pipeline.tools.embedded.broker import EmbeddedBroker

    data_dir.mkdir(parents=True, exist_ok=True)
    settings = load_settings().with_overrides(clickhouse_url=f"chdb://{data_dir / 'chdb'}")
    broker = worker = None
    try:
        if not settings.kafka_bootstrap:
            broker = EmbeddedBroker().start()
            settings = settings.with_overrides(kafka_bootstrap=broker.bootstrap)
            say(f"embedded broker at {broker.bootstrap}")
        asyncio.run(ensure(settings))
        log_path = data_dir / "worker.log"
        env = dict(os.environ, CHANNEL_HEALTH_KAFKA_BOOTSTRAP=settings.kafka_bootstrap or "",
                   CHANNEL_HEALTH_CLICKHOUSE_URL=settings.clickhouse_url,
                   PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                               os.environ.get("PYTHONPATH", "")]))
        with open(log_path, "ab") as log:
            worker = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "worker"], env=env, stdout=log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **worker_popen_kwargs())
        if worker.poll() is not None:
            raise RuntimeError(f"the worker exited with {worker.returncode} (log: {log_path})")
        say(f"worker started (log: {log_path}); it reads the topic from the start, so nothing is missed "
            "while it joins")
        yield settings
    finally:
        stop_in_order(worker, broker, lambda *a: None)
