"""Kafka plumbing outside the stream worker: topics, admin, producer.

- :mod:`pipeline.kafka.topics`: every topic of the product with its
  configuration; ``topics ensure|check`` (SPEC §7, §8).
- :mod:`pipeline.kafka.admin`: idempotent topic creation with aiokafka's
  admin client (used by the tools and the tests).
- :mod:`pipeline.kafka.producer`: the gateway-side publisher that batches
  request events into envelopes (SPEC §3).
"""
