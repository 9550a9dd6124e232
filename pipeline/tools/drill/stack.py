"""The shadow stack of ``channel-health drill --shadow``: its own topics, worker and (if needed) broker.

Topics: ``drill.<run_id>.gateway.requests`` etc. (``CHANNEL_HEALTH_TOPIC_PREFIX``). The worker is a
``channel-health worker`` process with the consumer group ``channel-health-drill-<run_id>``, started
and stopped as the demo does (:mod:`pipeline.tools.demo_stop`: own session, SIGTERM drains, dies with
the drill). With no ``CHANNEL_HEALTH_KAFKA_BOOTSTRAP`` the embedded broker (Tansu) is started too; with
no ``CHANNEL_HEALTH_CLICKHOUSE_URL`` the worker writes to chDB under ``data_dir``. chDB allows one
process per directory, so the drill writes its run after :meth:`ShadowStack.stop`.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from pipeline.config import Settings


class WorkerDied(RuntimeError):
    """The shadow worker exited during the drill; the message holds the end of its log."""


def shadow_prefix(run_id: str) -> str:
    """The topic prefix of a shadow drill: ``drill.<run_id>.``."""
    return f"drill.{run_id}."


class ShadowStack:
    """Broker (when none is configured), topics and worker for shadow drills; a context manager.

    settings: the configured settings (their prefix and group are replaced); run_id: names the prefix
    and group; data_dir: chDB directory (when no ClickHouse URL is configured) and ``worker.log``;
    policy_path: the worker's ``--policy`` file (None: defaults); say: progress lines.
    After ``__enter__``, :attr:`settings` are the shadow settings (bootstrap, prefix, ClickHouse).
    """

    def __init__(self, settings: Settings, run_id: str, data_dir: Path, policy_path: Path | None = None,
                 say: Callable[[str], None] = print, clickhouse_configured: bool | None = None):
        self.prefix = shadow_prefix(run_id)
        self.group = f"channel-health-drill-{run_id}"
        self.data_dir = Path(data_dir)
        configured = ("CHANNEL_HEALTH_CLICKHOUSE_URL" in os.environ if clickhouse_configured is None
                      else clickhouse_configured)
        url = settings.clickhouse_url if configured else f"chdb://{self.data_dir / 'chdb'}"
        self.settings = settings.with_overrides(topic_prefix=self.prefix, consumer_group=self.group,
                                                clickhouse_url=url)
        self.policy_path = policy_path
        self.say = say
        self.broker: Any = None
        self.worker: subprocess.Popen | None = None
        self.log_path = self.data_dir / "worker.log"

    def __enter__(self) -> "ShadowStack":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start the broker if needed, create the shadow topics, start the worker."""
        from pipeline.kafka.topics import ensure as ensure_topics
        from pipeline.tools.demo_stop import worker_popen_kwargs

        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self.settings.kafka_bootstrap:
            from pipeline.tools.embedded.broker import EmbeddedBroker

            self.say("Starting the embedded Kafka broker (Tansu, memory storage)…")
            self.broker = EmbeddedBroker()
            self.broker.start()
            self.settings = self.settings.with_overrides(kafka_bootstrap=self.broker.bootstrap)
        asyncio.run(ensure_topics(self.settings))
        env = dict(os.environ, CHANNEL_HEALTH_KAFKA_BOOTSTRAP=self.settings.kafka_bootstrap,
                   CHANNEL_HEALTH_CLICKHOUSE_URL=self.settings.clickhouse_url,
                   CHANNEL_HEALTH_TOPIC_PREFIX=self.prefix, CHANNEL_HEALTH_CONSUMER_GROUP=self.group)
        cmd = [sys.executable, "-m", "pipeline.cli", "worker", "--loglevel", "warning"]
        if self.policy_path is not None:
            cmd += ["--policy", str(self.policy_path)]
        self.say(f"Starting the shadow worker on topics {self.prefix}* (log: {self.log_path})…")
        with open(self.log_path, "ab") as log:
            self.worker = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, **worker_popen_kwargs())

    def check(self) -> None:
        """Raise :class:`WorkerDied` (with the log's end) when the worker has exited."""
        if self.worker is not None and self.worker.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""
            raise WorkerDied(f"the shadow worker exited with code {self.worker.returncode}; end of "
                             f"{self.log_path}:\n{tail}")

    def stop(self) -> None:
        """Stop the worker (it drains), its children, then the broker; idempotent."""
        from pipeline.tools.demo_stop import stop_in_order

        worker, broker = self.worker, self.broker
        self.worker, self.broker = None, None
        if worker is not None or broker is not None:
            stop_in_order(worker, broker, self.say)
