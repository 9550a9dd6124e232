"""Capturing channel snapshots of an engine (for :meth:`pipeline.engine.batch.BatchProcessor.snapshot_capture`):
:class:`Capture`.

A capture copies the state of some channels now (under the worker's lock) and
encodes it later, in another thread (:meth:`Capture.encode`). With
``changed_only`` it takes only the channels flagged changed since their last
capture (:meth:`pipeline.engine.core.Engine.take_changed`), plus a
rotating share of all of them, so every channel's record is re-published at
least every ``refresh_every`` captures (the state topic keeps one record per
channel, and a restore then never depends on very old records). A capture
whose records are not published must be handed back (:meth:`Capture.release`):
its channels are flagged again and go into the next one.

Why a clean channel's older record restores exactly: a channel is flagged by
every change of its exported state except a round that only moves its next
round boundary (idle, already reported ``no_data``; such rounds change
nothing on replay either). Its record carries the input offsets processed
when it was captured; no event of the channel was processed after them (that
would have flagged it), so skipping input up to them skips none of its
events, and the worker acks input only once a capture taken after it is
published, which includes every channel the input changed
(:mod:`pipeline.stream.snapshots`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping

import numpy as np

if TYPE_CHECKING:
    from pipeline.engine.core import Engine

#: One state-topic record: ``(channel, snapshot bytes, covered input offsets, input partition or None)``.
Record = tuple[str, bytes, dict[int, int], "int | None"]


@dataclass(frozen=True)
class Capture:
    """Copied state of the channel rows ``rows`` of ``engine``; calling it encodes their records.

    ``encode``: returns the records in row order (reads only the copies: safe in another thread).
    ``taken``: whether the rows' change flags were cleared by this capture (``changed_only``)."""

    engine: "Engine"
    rows: np.ndarray
    encode: Callable[[], list[Record]]
    taken: bool = False

    def __call__(self) -> list[Record]:
        return self.encode()

    def release(self) -> None:
        """The records were not published: flag the rows changed again (no-op for a full capture)."""
        if self.taken and self.rows.size:
            self.engine.mark_changed(self.rows)


def capture(engine: "Engine", offsets: Mapping[int, int], partition: Mapping[str, int],
            covered: Mapping[str, Mapping[int, int]], start: int = 0, stop: int | None = None,
            changed_only: bool = False, refresh_every: int = 0, refresh_phase: int = 0) -> Capture:
    """Copy the state of ``engine``'s channels at positions ``start:stop`` (all, or with ``changed_only``
    those flagged changed and the refresh share; see the module docstring) for :meth:`Capture.encode`.

    Each record covers ``offsets`` (partition → last input offset processed), raised to what a restored
    channel's own snapshot covered (``covered``: channel → partition → offset); ``partition``: channel →
    the input partition its events come from. An evicted channel's record is its eviction bytes (nothing copied).
    Raises ``ValueError`` for ``start < 0``.
    """
    from pipeline.state.snapshot import copy_state, encode_state

    if start < 0:
        raise ValueError(f"start must be >= 0, got {start!r}")
    names_all = engine.store.names
    if changed_only:
        rows = engine.take_changed(start, stop, refresh_every, refresh_phase)
    else:
        rows = np.arange(start, len(names_all) if stop is None else min(stop, len(names_all)), dtype=np.int64)
    evicted = engine.residency.evicted
    picked = [(int(i), names_all[i]) for i in rows.tolist()]
    held = {name: evicted[name] for _, name in picked if name in evicted}  # immutable bytes: nothing to copy
    resident = [i for i, name in picked if name not in held]
    frozen = dict(zip(resident, copy_state(engine, resident)))
    part = partition
    meta = []
    for i, name in picked:
        cov = dict(offsets)
        for p, o in covered.get(name, {}).items():
            if o > cov.get(p, -1):
                cov[p] = o
        meta.append((i, name, cov, part.get(name)))

    def encode() -> list[Record]:
        return [(name, held[name] if name in held else encode_state(frozen[i]), cov, p) for i, name, cov, p in meta]

    return Capture(engine, rows, encode, taken=changed_only)
