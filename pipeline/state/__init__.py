"""Per-channel snapshots of the engine's memory (windows, baselines, runs,
circuit-breaker state, verdict seq), so a restart or rebalance resumes
without replaying a day of raw events."""
