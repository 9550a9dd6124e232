"""The agent's input batches: whatever has arrived, taken while the previous batch is processed.

Why not faust's ``noack_take(n, within)`` (issue #15): it moves messages from
the stream into its buffer only while the agent waits for the next batch.
While a batch is processed its buffering step is blocked, so the stream (faust's
per-message path: consumer thread → conductor → channel → stream) stands
still; after the batch it gathers for ``within`` seconds and hands over what
came in that window. Intake and processing thus take turns, and a backlog
left by a slow batch (an evaluation round, a busy machine) drains only a few
messages per window: in the paced stage of ``channel-health bench`` the worker
took 2-20 messages per 50 ms window while the input it took was 2-4 s old.

:func:`batches` iterates the stream in its own task instead, so messages keep
moving into a pending list whenever the event loop is free (also while the
agent awaits Kafka's acks for its verdicts), and each batch is everything
pending, up to :attr:`TakeLimits.max_n` messages. Acks stay manual: like
``noack_take`` it never acks (iterate a stream made with ``stream.noack()``).

**Linger under a backlog.** faust hands single-event messages to the stream
one at a time, about a hundred per burst, so a batch of small messages held
~100 events and paid the processor's per-call cost (a few dozen numpy calls
per window ring) for each hundred. While the input is behind, a batch smaller
than :attr:`TakeLimits.min_bytes` is held open up to :attr:`TakeLimits.linger_s`
for more, as Kafka's producer batches with ``batch.size`` and ``linger.ms``
(Apache Kafka producer configuration reference): the messages keep arriving
meanwhile, so the wait costs no throughput, only latency that a backlog has
anyway. When the input is caught up (``lingering()`` false) a batch goes at
once. Batch envelopes are large and never wait.

Generic over the item type and faust-free, so it is tested with plain async
iterators.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import AsyncIterable, AsyncIterator, Callable, TypeVar

T = TypeVar("T")

#: Event-loop turns without a new item after which the items already on their way are all in.
#: faust hands a fetched message to the stream in a few turns (drain loop, conductor, channel),
#: so a fetch's messages arrive one or two turns apart; idle, the spins cost a few microseconds.
SETTLE_TURNS = 3


@dataclasses.dataclass(frozen=True)
class TakeLimits:
    """How large a batch of :func:`batches` is and how long it may wait to grow.

    ``max_n``: most items per batch, and most held pending beyond the batch
    being handled (>= 1). ``max_bytes``: the feeder also stops taking items
    once this many bytes are pending (None: no byte bound; needs a ``size``
    function). ``min_bytes``: a batch with fewer bytes pending may linger
    (0: never). ``linger_s``: the longest a batch waits for ``min_bytes``,
    counted from the moment it is asked for (0..1 s).
    Raises ``ValueError`` for a value outside these ranges.
    """

    max_n: int
    max_bytes: int | None = None
    min_bytes: int = 0
    linger_s: float = 0.0

    def __post_init__(self) -> None:
        if self.max_n < 1:
            raise ValueError(f"max_n must be >= 1, got {self.max_n!r}")
        if self.max_bytes is not None and self.max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1 or None, got {self.max_bytes!r}")
        if self.min_bytes < 0:
            raise ValueError(f"min_bytes must be >= 0, got {self.min_bytes!r}")
        if not 0.0 <= self.linger_s <= 1.0:
            raise ValueError(f"linger_s must be within 0..1 s, got {self.linger_s!r}")

    @property
    def sized(self) -> bool:
        """Whether these limits count bytes (then :func:`batches` needs a ``size`` function)."""
        return self.max_bytes is not None or self.min_bytes > 0


async def batches(items: AsyncIterable[T], limits: TakeLimits, size: Callable[[T], int] | None = None,
                  lingering: Callable[[], bool] | None = None) -> AsyncIterator[list[T]]:
    """Yield lists of 1..``limits.max_n`` items of ``items``, in order: every item pending when a batch is
    asked for.

    ``items`` is consumed by a background task that holds at most
    ``limits.max_n`` items (and about ``limits.max_bytes`` bytes) beyond the
    batch being handled; then it waits: back-pressure, and so bounded memory.
    Once an item is pending, the batch is yielded as soon as
    :data:`SETTLE_TURNS` event-loop turns bring no further item (the rest of
    what was fetched with it). If then fewer than ``limits.min_bytes`` are
    pending and ``lingering()`` is true (None: always), it waits for more
    until ``min_bytes`` or ``max_n`` items are pending, the feeder stopped,
    or ``limits.linger_s`` passed since the batch was asked for.
    ``size``: an item's bytes (required when ``limits.sized``).

    Raises ``ValueError`` when ``limits`` count bytes and ``size`` is None; an
    exception of ``items`` is raised here once the items before it have been
    yielded; ends when ``items`` ends. Closing the generator cancels the
    background task.
    """
    if limits.sized and size is None:
        raise ValueError("these take limits count bytes: pass a size function")
    loop = asyncio.get_running_loop()
    max_n, max_bytes = limits.max_n, limits.max_bytes
    pending: list[T] = []
    pending_bytes = 0
    want_bytes = 0  # a waiting batch is woken once this many bytes are pending (0: on any item)
    waiter: asyncio.Future | None = None
    room = asyncio.Event()
    room.set()

    def wake(_: object = None) -> None:
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def full() -> bool:
        return len(pending) >= max_n or (max_bytes is not None and pending_bytes >= max_bytes)

    async def feed() -> None:
        nonlocal pending_bytes
        async for item in items:
            pending.append(item)
            if size is not None:
                pending_bytes += size(item)
            if waiter is not None and (pending_bytes >= want_bytes or full()):
                wake()
            if full():
                room.clear()
                await room.wait()

    async def wait(min_pending_bytes: int, timeout_s: float | None) -> None:
        """Until ``min_pending_bytes`` (0: an item) are pending, the feeder is full or ended, or
        ``timeout_s`` passed."""
        nonlocal waiter, want_bytes
        waiter, want_bytes = loop.create_future(), min_pending_bytes
        timer = loop.call_later(timeout_s, wake) if timeout_s is not None else None
        try:
            await waiter
        finally:
            waiter = None
            if timer is not None:
                timer.cancel()

    feeder = asyncio.ensure_future(feed())
    feeder.add_done_callback(wake)
    try:
        while True:
            if not pending:
                if feeder.done():
                    feeder.result()  # raises what the iteration raised
                    return
                await wait(0, None)
                continue
            asked = time.monotonic()
            await _settle(pending, max_n, feeder)
            if (pending_bytes < limits.min_bytes and not full() and not feeder.done()
                    and (lingering is None or lingering())):
                left_s = limits.linger_s - (time.monotonic() - asked)
                if left_s > 0:
                    await wait(limits.min_bytes, left_s)
            batch = pending[:max_n]
            del pending[:max_n]
            if size is not None:
                pending_bytes = sum(size(item) for item in pending) if pending else 0
            room.set()
            yield batch
    finally:
        feeder.cancel()


async def _settle(pending: list, max_n: int, feeder: asyncio.Future) -> None:
    """Let the items already on their way join ``pending`` (up to ``max_n``): return after
    :data:`SETTLE_TURNS` event-loop turns in a row that added none."""
    idle = 0
    while idle < SETTLE_TURNS and len(pending) < max_n and not feeder.done():
        n = len(pending)
        await asyncio.sleep(0)
        idle = idle + 1 if len(pending) == n else 0
