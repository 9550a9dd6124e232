"""pipeline.stream.take.batches: intake keeps moving while a batch is handled (issue #15)."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.stream.take import TakeLimits, batches


class Source:
    """An async iterator fed by the test; ``None`` ends it, an exception instance is raised."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.taken = 0

    def __aiter__(self) -> "Source":
        return self

    async def __anext__(self) -> int:
        item = await self.queue.get()
        if item is None:
            raise StopAsyncIteration
        if isinstance(item, Exception):
            raise item
        self.taken += 1
        return item


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_items_arriving_while_a_batch_is_handled_form_the_next_batch():
    async def main() -> list[list[int]]:
        src = Source()
        it = batches(src, TakeLimits(4))
        src.queue.put_nowait(1)
        got = [await it.__anext__()]            # one item pending: yielded at once, no waiting for more
        for i in range(2, 8):                   # arrive while batch [1] is "handled"
            src.queue.put_nowait(i)
        await _settle()
        assert src.taken == 5                   # taken meanwhile: [1] and max_n=4 pending, then it waits
        got.append(await it.__anext__())
        got.append(await it.__anext__())
        src.queue.put_nowait(None)
        got += [b async for b in it]
        return got

    assert asyncio.run(main()) == [[1], [2, 3, 4, 5], [6, 7]]


def test_an_error_of_the_stream_comes_after_the_items_before_it():
    async def main() -> list[list[int]]:
        src = Source()
        for item in (1, 2, RuntimeError("broker gone")):
            src.queue.put_nowait(item)
        got = []
        with pytest.raises(RuntimeError, match="broker gone"):
            async for b in batches(src, TakeLimits(10)):
                got.append(b)
        return got

    assert asyncio.run(main()) == [[1, 2]]


def test_closing_the_batches_stops_reading_the_stream():
    async def main() -> int:
        src = Source()
        src.queue.put_nowait(1)
        it = batches(src, TakeLimits(3))
        assert await it.__anext__() == [1]
        await it.aclose()
        for i in range(5):
            src.queue.put_nowait(i)
        await _settle()
        return src.taken

    assert asyncio.run(main()) == 1


@pytest.mark.parametrize("kwargs, match", [
    ({"max_n": 0}, "max_n"), ({"max_n": 1, "max_bytes": 0}, "max_bytes"), ({"max_n": 1, "min_bytes": -1}, "min_bytes"),
    ({"max_n": 1, "linger_s": 1.5}, "linger_s"), ({"max_n": 1, "linger_s": -0.1}, "linger_s"),
])
def test_limits_out_of_range_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TakeLimits(**kwargs)


def test_byte_limits_need_a_size_function():
    async def main() -> None:
        await batches(Source(), TakeLimits(4, min_bytes=10)).__anext__()

    with pytest.raises(ValueError, match="size function"):
        asyncio.run(main())


def test_items_already_on_their_way_join_the_batch():
    """A fetch's messages reach the stream one event-loop turn apart: they form one batch, not one each."""

    async def trickle():
        for i in range(6):
            yield i
            await asyncio.sleep(0)          # the next one is one loop turn behind
        await asyncio.sleep(0.05)           # new input comes later: not waited for
        yield 6

    async def main() -> list[list[int]]:
        return [b async for b in batches(trickle(), TakeLimits(4))]

    assert asyncio.run(main()) == [[0, 1, 2, 3], [4, 5], [6]]


class Drip:
    """An async iterator that yields ``n`` items ``gap_s`` apart on the event loop's clock (a producer
    that keeps pace while the consumer lingers)."""

    def __init__(self, n: int, gap_s: float, nbytes: int = 100) -> None:
        self.n, self.gap_s, self.nbytes, self.i = n, gap_s, nbytes, 0

    def __aiter__(self) -> "Drip":
        return self

    async def __anext__(self) -> bytes:
        if self.i >= self.n:
            raise StopAsyncIteration
        if self.i:
            await asyncio.sleep(self.gap_s)
        self.i += 1
        return bytes(self.nbytes)


def _sizes(limits: TakeLimits, source, lingering=None) -> list[int]:
    async def main() -> list[int]:
        return [len(b) async for b in batches(source, limits, len, lingering)]

    return asyncio.run(main())


def test_under_a_backlog_small_items_linger_until_min_bytes():
    """Items 1 ms apart, 100 bytes each, lingering up to 1 s for 1,000 bytes: batches of 10 (the 10th item
    brings min_bytes and ends the wait at once)."""
    assert _sizes(TakeLimits(64, min_bytes=1_000, linger_s=1.0), Drip(30, 0.001)) == [10, 10, 10]


def test_a_linger_ends_at_max_n_and_when_the_input_ends():
    assert _sizes(TakeLimits(4, min_bytes=10_000, linger_s=1.0), Drip(10, 0.001)) == [4, 4, 2]


def _first_batch(limits: TakeLimits, lingering) -> tuple[list[int], float]:
    """One pending item and no more: the first batch and the loop time it took to come."""
    async def main() -> tuple[list[int], float]:
        src = Source()
        src.queue.put_nowait(7)
        loop = asyncio.get_running_loop()
        it = batches(src, limits, lambda item: 100, lingering)
        t0 = loop.time()
        batch = await it.__anext__()
        waited = loop.time() - t0
        await it.aclose()
        return batch, waited

    return asyncio.run(main())


def test_without_a_backlog_a_small_batch_goes_at_once():
    batch, waited = _first_batch(TakeLimits(64, min_bytes=10_000, linger_s=1.0), lambda: False)
    assert batch == [7] and waited < 0.5


def test_a_linger_ends_after_linger_s():
    batch, waited = _first_batch(TakeLimits(64, min_bytes=10_000, linger_s=0.05), lambda: True)
    assert batch == [7] and waited >= 0.049  # the timer may fire within the clock resolution


def test_the_feeder_stops_at_max_bytes():
    """max_bytes 250 with 100-byte items: the feeder holds 3 pending (300 >= 250), then waits."""
    async def main() -> tuple[int, list[int]]:
        src = Source()
        it = batches(src, TakeLimits(100, max_bytes=250), lambda item: 100)
        src.queue.put_nowait(0)
        first = await it.__anext__()
        for i in range(1, 10):
            src.queue.put_nowait(i)
        await _settle()
        taken = src.taken
        src.queue.put_nowait(None)
        return taken, [len(first)] + [len(b) async for b in it]

    assert asyncio.run(main()) == (4, [1, 3, 3, 3])
