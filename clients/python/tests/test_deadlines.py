"""The client's own wait_for: a deadline outside a wait always fires.

Before Python 3.12, asyncio.wait_for swallows a cancellation that arrives
just as the awaited thing has finished, and the task it runs in goes on.
An acquire's deadline (its wait plus the grace) is such a cancellation:
when a redial or a dropped connection woke the acquire's wait for a
connection in the same turn of the loop, the acquire ran on to the connect
timeout (3 s). These tests build that schedule exactly, without a server.
"""

from __future__ import annotations

import asyncio

import pytest

from ringlock._aio import _wait_for


def run(coro):
    return asyncio.run(coro)


def test_a_cancel_that_meets_a_finished_wait_is_not_swallowed() -> None:
    async def main() -> None:
        woken = asyncio.Event()
        ran_on = []

        async def waiting() -> None:
            await _wait_for(woken.wait(), 10)
            ran_on.append(True)  # only if the cancel was swallowed
            await asyncio.sleep(5)

        task = asyncio.ensure_future(waiting())
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        woken.set()
        await asyncio.sleep(0)  # the wait has finished; the task not yet resumed
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=1)
        assert task in done and task.cancelled()
        assert not ran_on

    run(main())


def test_a_timeout_cancels_what_it_waited_for() -> None:
    async def main() -> None:
        inner = asyncio.ensure_future(asyncio.sleep(10))
        with pytest.raises(asyncio.TimeoutError):
            await _wait_for(inner, 0.05)
        assert inner.cancelled()

    run(main())


def test_a_result_within_the_timeout_is_returned() -> None:
    async def main() -> None:
        async def answer() -> int:
            await asyncio.sleep(0.01)
            return 7

        assert await _wait_for(answer(), 5) == 7

    run(main())
