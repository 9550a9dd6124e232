"""The input side: how a gateway's upstream calls become request events on ``gateway.requests`` (SPEC §7).

- :mod:`pipeline.gateways.litellm`: a LiteLLM ``CustomLogger`` (optional extra ``litellm``);
- :mod:`pipeline.gateways.otlp`: OpenTelemetry GenAI spans from a Collector's Kafka exporter
  (``channel-health ingest otlp``; optional extra ``otel``);
- :mod:`pipeline.gateways.publisher`: the bounded, non-blocking publisher both use.

docs/CONNECTING.md lists every way in with the field mapping.
"""
