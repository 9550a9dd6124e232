"""``channel-health bench``: throughput of the stream pipeline against the raw Kafka consumer ceiling.

Entry point :func:`pipeline.bench.run.run_bench` (the ``bench`` command in
:mod:`pipeline.cli`); each measured stage runs in its own process
(:mod:`pipeline.bench.stage`): :mod:`~pipeline.bench.warm` (24 h replay and
channel state), :mod:`~pipeline.bench.ceiling`,
:mod:`~pipeline.bench.bare_faust`, :mod:`~pipeline.bench.pipeline_run`,
:mod:`~pipeline.bench.profile` and, with ``--quality``,
:mod:`~pipeline.bench.quality`. Traffic: :mod:`~pipeline.bench.workload`
and :mod:`~pipeline.bench.fill`; figures: :mod:`~pipeline.bench.report`.
See README "Throughput".
"""
