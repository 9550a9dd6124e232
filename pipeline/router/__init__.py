"""Router-side subscriber library: the latest ``channel.health`` verdicts as
per-route traffic shares (SPEC §1 "Routers consume channel.health and route
by the recommended weights").

:class:`HealthTable` is the pure part (no Kafka, injectable clock);
:class:`HealthSubscriber` feeds one from the ``channel.health`` topic.
"""

from pipeline.router.table import HealthTable, RouteWeights

__all__ = ["HealthTable", "RouteWeights", "HealthSubscriber", "wait_for"]


def __getattr__(name: str):
    # The subscriber imports aiokafka; load it only when asked for, so a
    # router that feeds the table itself needs no Kafka client.
    if name in ("HealthSubscriber", "wait_for"):
        from pipeline.router import subscriber

        return getattr(subscriber, name)
    raise AttributeError(f"module 'pipeline.router' has no attribute {name!r}")
