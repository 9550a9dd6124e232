"""``python -m pipeline.detectors``: print the README's "Detection policy" table from the registry."""

from pipeline.detectors.registry import policy_table

print(policy_table())
