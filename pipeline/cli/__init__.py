"""The ``channel-health`` command line (SPEC §7): one module per command or command group.

:mod:`pipeline.cli.main` holds the typer app, the commands that run the
product (``demo``, ``broker``, ``worker``, ``simulate``, ``query``,
``bench``) and :func:`~pipeline.cli.main.main`, the console script; the
other modules each hold one command or group (``topics``, ``alert``,
``watch``, ``override``, ``report``, ``drill``, ``scorecard``, and ``backtest``/
``tune``/``incident`` in :mod:`pipeline.cli.history`) or a shared helper
(:mod:`pipeline.cli.help`: help rendering; :mod:`pipeline.cli.settings`:
settings or a one-line error). ``python -m pipeline.cli`` runs the same app.

Tools (:mod:`pipeline.tools`) are imported only inside the commands that run
them, so ``channel-health worker`` never loads them (issue #15;
tests/unit/test_import_graph.py).
"""
