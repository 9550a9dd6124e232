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
pending, up to ``max_n`` messages, without waiting for more. Acks stay manual:
like ``noack_take`` it never acks (iterate a stream made with ``stream.noack()``).
Generic over the item type and faust-free, so it is tested with plain async
iterators.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterable, AsyncIterator, TypeVar

T = TypeVar("T")

#: Event-loop turns without a new item after which the items already on their way are all in.
#: faust hands a fetched message to the stream in a few turns (drain loop, conductor, channel),
#: so a fetch's messages arrive one or two turns apart; idle, the spins cost a few microseconds.
SETTLE_TURNS = 3


async def batches(items: AsyncIterable[T], max_n: int) -> AsyncIterator[list[T]]:
    """Yield lists of 1..``max_n`` items of ``items``, in order: every item pending when a batch is asked for.

    ``items`` is consumed by a background task that holds at most ``max_n``
    items beyond the batch being handled (then it waits: back-pressure, and so
    bounded memory). Once an item is pending, the batch is yielded as soon as
    :data:`SETTLE_TURNS` event-loop turns bring no further item (the rest of
    what was fetched with it), without waiting for new input.
    Raises ``ValueError`` for ``max_n < 1``; an exception of ``items`` is
    raised here once the items before it have been yielded; ends when
    ``items`` ends. Closing the generator cancels the background task.
    """
    if max_n < 1:
        raise ValueError(f"max_n must be >= 1, got {max_n!r}")
    pending: list[T] = []
    arrived = asyncio.Event()
    room = asyncio.Event()
    room.set()

    async def feed() -> None:
        async for item in items:
            pending.append(item)
            arrived.set()
            if len(pending) >= max_n:
                room.clear()
                await room.wait()

    feeder = asyncio.ensure_future(feed())
    try:
        while True:
            if not pending:
                if feeder.done():
                    feeder.result()  # raises what the iteration raised
                    return
                arrived.clear()
                waiter = asyncio.ensure_future(arrived.wait())
                try:
                    await asyncio.wait({waiter, feeder}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
                continue
            await _settle(pending, max_n, feeder)
            batch = pending[:max_n]
            del pending[:max_n]
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
