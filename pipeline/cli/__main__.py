"""``python -m pipeline.cli``: the ``channel-health`` console script without an installed entry point."""

from pipeline.cli.main import main

if __name__ == "__main__":  # imported (e.g. by tests/unit/test_import_graph.py walking every module): no run
    main()
