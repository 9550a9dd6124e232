"""When may an input message be acknowledged? (at-least-once bookkeeping of the worker)

A message's offset may be committed only when both

1. every ClickHouse row it produced was written (the sink flushed), and
2. a state snapshot that includes its effect on the detector was saved to
   the state topic (so a restart neither loses nor double-counts it).

:class:`DeliveryLedger` keeps the processed-but-unacked batches in order,
numbered ``1, 2, ...`` (``seq``). The sink's flusher reports "every row of
batches up to ``seq`` is written" (:meth:`DeliveryLedger.flushed_up_to`); a
snapshot taken after batch ``seq`` (:meth:`DeliveryLedger.snapshot_taken`)
may be saved once those rows are written (:meth:`DeliveryLedger.ready_snapshot`),
and once saved the batches it covers are released for acking
(:meth:`DeliveryLedger.snapshot_saved`). Acks therefore always cover a
prefix of what was processed. A snapshot is only published after its rows
are written, so a restart that skips the events a snapshot covers never
skips rows that are missing from ClickHouse.

Kafka-free and synchronous; the faust agent in :mod:`pipeline.stream.app`
drives it.

>>> d = DeliveryLedger()
>>> d.add_batch(["m1", "m2"]), d.add_batch(["m3"])
(1, 2)
>>> d.snapshot_taken("state after batch 2")
2
>>> d.ready_snapshot() is None          # rows not written yet: do not save
True
>>> d.flushed_up_to(2)
>>> d.ready_snapshot()
'state after batch 2'
>>> d.snapshot_saved()
['m1', 'm2', 'm3']
>>> d.unacked_messages, d.unacked_batches
(0, 0)
"""

from __future__ import annotations

from collections import deque
from typing import Any, Generic, Iterable, TypeVar

M = TypeVar("M")


class DeliveryLedger(Generic[M]):
    """Ordered record of processed, not yet acknowledged input batches.

    ``epoch`` increases on :meth:`clear` (a rebalance): callers that awaited
    something in between compare it to detect that their batches were dropped.
    """

    def __init__(self) -> None:
        self.added = 0
        self.flushed = 0
        self.epoch = 0
        self._batches: deque[tuple[int, list[M]]] = deque()
        self._snapshot: tuple[int, Any, int] | None = None  # (rows needed up to, payload, acks up to)
        self.unacked_messages = 0

    @property
    def unacked_batches(self) -> int:
        """Batches processed and not yet released for acking."""
        return len(self._batches)

    @property
    def pending_snapshot_seq(self) -> int | None:
        """The batch a taken, not yet saved snapshot covers (None: none pending)."""
        return self._snapshot[0] if self._snapshot is not None else None

    def add_batch(self, messages: Iterable[M]) -> int:
        """Record a processed batch whose rows are all in the sink's buffer; returns its ``seq``."""
        self.added += 1
        batch = list(messages)
        self._batches.append((self.added, batch))
        self.unacked_messages += len(batch)
        return self.added

    def flushed_up_to(self, seq: int) -> None:
        """Every row of batches ``<= seq`` is written (call with the ``added`` read before the flush)."""
        if seq > self.flushed:
            self.flushed = min(seq, self.added)

    def snapshot_taken(self, payload: Any, covers: int | None = None) -> int:
        """A snapshot of the state after the last added batch; returns the ``seq`` it covers.

        ``covers``: for a snapshot taken in slices between batches, the batch
        every slice includes (the last one added when the first slice was
        taken, ``<= added``): only batches up to it are released for acking,
        while the rows of every batch up to ``added`` must be written before
        it is saved (a later slice holds their effect). None: ``added``.
        Raises ``RuntimeError`` while another snapshot is pending (save or drop it
        first) and ``ValueError`` for ``covers`` outside ``0..added``.
        """
        if self._snapshot is not None:
            raise RuntimeError(f"a snapshot covering batch {self._snapshot[0]} is still pending")
        covers = self.added if covers is None else covers
        if not 0 <= covers <= self.added:
            raise ValueError(f"covers must be in 0..{self.added}, got {covers!r}")
        self._snapshot = (self.added, payload, covers)
        return self.added

    def ready_snapshot(self) -> Any | None:
        """The pending snapshot's payload if the rows it covers are written, else None."""
        if self._snapshot is None or self._snapshot[0] > self.flushed:
            return None
        return self._snapshot[1]

    def snapshot_saved(self) -> list[M]:
        """The pending snapshot was saved: return the messages it covers (ack them), oldest first."""
        if self._snapshot is None:
            return []
        seq = self._snapshot[2]
        self._snapshot = None
        out: list[M] = []
        while self._batches and self._batches[0][0] <= seq:
            _, batch = self._batches.popleft()
            out.extend(batch)
        self.unacked_messages -= len(out)
        return out

    def drop_snapshot(self) -> None:
        """Forget the pending snapshot (it could not be saved); a newer one will be taken."""
        self._snapshot = None

    def clear(self) -> None:
        """Forget every unacked batch and the pending snapshot (rebalance: they are re-delivered)."""
        self._batches.clear()
        self._snapshot = None
        self.unacked_messages = 0
        self.flushed = self.added
        self.epoch += 1
