"""``channel-health drill``: inject a fault, watch the verdicts, compare them with the policy's timeline.

Issue #22 item 3. :mod:`.kinds` maps a drill kind to a simulator fault on a
drill channel; :mod:`.timeline` derives the expected transitions from the
policy and compares them with the verdicts; :mod:`.runner` runs a drill
(shadow stack, live deployment, or in process); :mod:`.store` writes the run
and its incident to ClickHouse. Tools are never imported by the worker.
"""
