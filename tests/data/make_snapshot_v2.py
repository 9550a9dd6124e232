"""Writes ``snapshot_v2.msgpack``: the version-1 fixture's channel restored and written again as a
version-2 snapshot (per-array zlib, counters by name) by the code at main f2b7a5d, the last to write
version 2.

Run once on that commit's code (``PYTHONPATH=<checkout of f2b7a5d> python tests/data/make_snapshot_v2.py``);
``tests/unit/test_snapshot_compat.py`` checks that today's code restores from these bytes the state the
version-1 fixture expects (``snapshot_v1_expected.json``).
"""

from pathlib import Path

from pipeline.engine import Engine
from pipeline.state.snapshot import SNAPSHOT_VERSION, decode_snapshot, export_channel, import_channel

HERE = Path(__file__).parent


def main() -> None:
    """Restore ``snapshot_v1.msgpack`` and write its channel as this code's snapshot."""
    assert SNAPSHOT_VERSION == 2, "run on the code that writes version 2 (main f2b7a5d)"
    engine = Engine()
    import_channel(engine, decode_snapshot((HERE / "snapshot_v1.msgpack").read_bytes()))
    (HERE / "snapshot_v2.msgpack").write_bytes(export_channel(engine, 0))


if __name__ == "__main__":
    main()
