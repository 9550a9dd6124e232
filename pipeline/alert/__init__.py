"""``channel-health alert``: alerts from ``channel.health`` that reach a person (issue #20, SPEC §7).

Modules by concern: :mod:`.config` (``alerts.toml``), :mod:`.severity`
(verdict -> severity, silences), :mod:`.grouping` (Alertmanager-style groups,
dedup, resolves), :mod:`.formats` (webhook payloads), :mod:`.delivery`
(HTTP, retries, backup routes, rate limit), :mod:`.heartbeat` (dead man's
switch) and :mod:`.runner` (the Kafka loop).
"""
