"""pipeline.stream.take.batches: intake keeps moving while a batch is handled (issue #15)."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.stream.take import batches


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
        it = batches(src, 4)
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
            async for b in batches(src, 10):
                got.append(b)
        return got

    assert asyncio.run(main()) == [[1, 2]]


def test_closing_the_batches_stops_reading_the_stream():
    async def main() -> int:
        src = Source()
        src.queue.put_nowait(1)
        it = batches(src, 3)
        assert await it.__anext__() == [1]
        await it.aclose()
        for i in range(5):
            src.queue.put_nowait(i)
        await _settle()
        return src.taken

    assert asyncio.run(main()) == 1


def test_max_n_must_be_positive():
    async def main() -> None:
        await batches(Source(), 0).__anext__()

    with pytest.raises(ValueError, match="max_n"):
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
        return [b async for b in batches(trickle(), 4)]

    assert asyncio.run(main()) == [[0, 1, 2, 3], [4, 5], [6]]
