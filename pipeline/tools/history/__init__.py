"""History tools (issue #22): what a policy would have done on stored data.

- :mod:`.timeparse`: ``--from`` / ``--to`` values (ISO 8601 with zone, epoch
  ms, or relative such as ``-24h``)
- :mod:`.incidents`: the ``channel_incidents`` table (labelled incidents and
  clean periods: the ground truth of backtests and tuning)
- :mod:`.backtest`: replay stored request events through the engine with a
  candidate policy and compare with the recorded verdicts
- :mod:`.tune`: search thresholds within bounds for the policy that detects
  the labelled incidents earliest with no verdict on clean periods

Never imported by the stream worker.
"""
