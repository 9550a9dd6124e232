"""``channel-health bench``: throughput of the stream pipeline against the raw Kafka consumer ceiling.

Entry point :func:`pipeline.tools.bench.run.run_bench` (the ``bench`` command in
:mod:`pipeline.cli.main`); each measured stage runs in its own process
(:mod:`pipeline.tools.bench.stage`): :mod:`~pipeline.tools.bench.warm` (24 h replay and
channel state), :mod:`~pipeline.tools.bench.ceiling`,
:mod:`~pipeline.tools.bench.bare_faust`, :mod:`~pipeline.tools.bench.pipeline_run`,
:mod:`~pipeline.tools.bench.profile` and, with ``--quality``,
:mod:`~pipeline.tools.bench.quality`. Traffic: :mod:`~pipeline.tools.bench.workload`
and :mod:`~pipeline.tools.bench.fill`; figures: :mod:`~pipeline.tools.bench.report`.
See docs/THROUGHPUT.md.
"""
