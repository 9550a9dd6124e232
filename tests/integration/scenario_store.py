"""A simulator scenario replayed through the engine into ClickHouse (chDB), for tests that read the tables.

No broker, no worker: :class:`~pipeline.engine.Engine` batches and
:class:`~pipeline.sinks.clickhouse.ClickHouseSink` write the same rows the
worker writes (accepted events with their structure, and every verdict).
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from pipeline.config import Settings
from pipeline.contracts import RequestEvent, Verdict
from pipeline.engine import Engine
from pipeline.sinks.clickhouse import ClickHouseSink
from pipeline.storage.client import close_clients, open_client
from pipeline.storage.schema import apply_ddl
from pipeline.tools.simulate.scenarios import get_scenario

#: Scenario time 0 of the stored scenarios: a fixed whole hour (as tests/acceptance).
START_MS = 1_780_000_000_000 - 1_780_000_000_000 % 3_600_000


def store_scenario(client: Any, name: str = "sparse-consecutive-failures", seed: int = 0,
                   batch_size: int = 2_000) -> tuple[list[dict], list[Verdict]]:
    """Replay scenario ``name`` (events from :data:`START_MS`) and write its rows through the sink.

    ``client``: a client whose database has the schema. Returns the events and the verdicts written.
    """
    events = list(get_scenario(name).events(start_ms=START_MS, seed=seed))
    engine, sink, verdicts = Engine(), ClickHouseSink(client), []
    for i in range(0, len(events), batch_size):
        batch = [msgspec.convert(e, RequestEvent) for e in events[i:i + batch_size]]
        result = engine.process(batch, fields=engine.read_fields(batch))
        sink.add_events([(e, ok, missing) for e, (ok, missing) in zip(result.accepted, result.structure)])
        sink.add_verdicts(result.verdicts)
        verdicts.extend(result.verdicts)
        sink.flush()
    return events, verdicts


#: The stored scenario's channel that the fault hits (opens, half-opens, recovers).
FAULTY_CHANNEL = "replicate/llama-13b@free"


@pytest.fixture(scope="session")
def scenario_chdb_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A ``chdb://`` URL of a directory holding sparse-consecutive-failures (stored once per session).

    chDB allows one directory per process and other tests open theirs: call
    ``close_clients()`` and open this URL again in each test (the data stays on disk).
    """
    url = f"chdb://{tmp_path_factory.mktemp('scenario') / 'chdb'}"
    close_clients()
    client = open_client(Settings(kafka_bootstrap=None, clickhouse_url=url))
    apply_ddl(client)
    store_scenario(client)
    close_clients()
    return url


def open_scenario(url: str) -> Any:
    """A client on the stored scenario at ``url`` (closing whatever chDB this process had open)."""
    close_clients()
    return open_client(Settings(kafka_bootstrap=None, clickhouse_url=url), create_database=False)
