"""OffsetGate: in-order acceptance of input offsets after a rebalance (pipeline.stream.offsets)."""

from pipeline.stream.offsets import MAX_SEEKS, SEEK_INTERVAL_S, OffsetGate


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_prefetched_records_before_the_seek_are_dropped_then_read_in_order():
    # faust resumed fetching at the old position (offsets 200..) before seeking back to the committed 100.
    gate = OffsetGate({0: 100, 1: 7})
    assert [gate.check(0, o) for o in range(200, 205)] == ["gap"] * 5
    assert gate.want_seek(0) == 100
    accepted = [o for o in range(100, 210) if gate.check(0, o) == "accept"]
    assert accepted == list(range(100, 210))      # nothing between 100 and 199 is skipped
    assert gate.gaps == 5 and gate.duplicates == 0
    assert gate.last_accepted(0) == 209 and gate.last_accepted(1) is None


def test_duplicates_after_sync_and_below_the_start():
    gate = OffsetGate({0: 10})
    assert gate.check(0, 9) == "duplicate"         # below the committed offset: already processed
    assert gate.check(0, 10) == "accept"
    assert gate.check(0, 10) == "duplicate" and gate.check(0, 5) == "duplicate"
    assert gate.duplicates == 3


def test_forward_gaps_after_sync_are_tolerated():
    # e.g. transaction markers leave offsets without records on a production Kafka
    gate = OffsetGate({0: 10})
    assert [gate.check(0, o) for o in (10, 11, 13, 20)] == ["accept"] * 4
    assert gate.gaps == 0


def test_unknown_partition_syncs_on_its_first_message():
    gate = OffsetGate({})
    assert gate.check(3, 42) == "accept" and gate.check(3, 43) == "accept"
    assert gate.want_seek(3) is None


def test_seeks_are_throttled_and_a_missing_start_record_is_skipped_after_max_seeks():
    clock = Clock()
    gate = OffsetGate({0: 50}, clock_s=clock)
    seeks = []
    for _ in range(MAX_SEEKS):
        assert gate.check(0, 51) == "gap"
        seeks.append(gate.want_seek(0))
        assert gate.want_seek(0) is None            # within SEEK_INTERVAL_S of the last seek
        clock.t += SEEK_INTERVAL_S
    assert seeks == [50] * MAX_SEEKS
    assert gate.check(0, 51) == "accept"            # offset 50 has no record: start at 51
    assert gate.skipped_starts == [(0, 50, 51)]
    assert gate.want_seek(0) is None
