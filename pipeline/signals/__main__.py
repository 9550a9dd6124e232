"""``python -m pipeline.signals``: print the README's "Detection policy" table from the registry."""

from pipeline.signals.registry import policy_table

print(policy_table())
