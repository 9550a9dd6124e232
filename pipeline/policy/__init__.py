"""Detection policy: default numbers, the per-channel state machine (circuit
breaker with half-open probe and ramp), penalties and per-route weights."""
