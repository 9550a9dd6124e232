"""``channel-health scorecard``: SPEC §5 scenarios offline through the engine, beside the
default rules of common circuit breakers (LiteLLM, Envoy, resilience4j, pybreaker) on the same streams.

Modules: :mod:`.baseline` (the common call type and the per-pool wrapper),
:mod:`.litellm_cooldown`, :mod:`.envoy_outlier`, :mod:`.resilience4j_breaker`,
:mod:`.pybreaker_breaker` (each rule re-implemented from its documented defaults, source cited),
:mod:`.scenarios` (the issue #19 measurement scenarios), :mod:`.runner` (one scenario x seed),
:mod:`.report` (aggregation over seeds, terminal table, JSON).
"""
