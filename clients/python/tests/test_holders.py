"""Who holds and who waits: owner labels (``O``), the listing with holders
(``W``, and ``L`` from older servers), one key's queue (``Q``), against the
real server and, for an older server's answers, the fake one."""

from __future__ import annotations

import asyncio

import pytest

from ringlock import (
    AsyncClient,
    Client,
    InvalidArgument,
    ProtocolError,
    async_list_locks,
    async_lock_queue,
    async_locks,
    list_locks,
    lock_queue,
    locks,
)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_the_listing_names_the_holder_its_owner_and_how_long(server):
    with Client(server.addr, owner="host-a/job-42") as holder, Client(server.addr) as anon:
        grant = holder.acquire("who/a", lease=30)
        other = anon.acquire("who/b", lease=30)
        assert grant is not None and other is not None
        page, cursor = list_locks(server.addr, "who/")
        assert cursor == 0
        by_key = {lock.key: lock for lock in page}
        a, b = by_key[b"who/a"], by_key[b"who/b"]
        assert (a.token, a.waiters) == (grant.token, 0)
        assert 0 < a.lease_left <= 30.01  # the server ends a lease 1 ms late, never early
        assert a.holder is not None and a.holder.owner == "host-a/job-42"
        # The holder's address is the client's end of one of its connections.
        assert a.holder.addr is not None and a.holder.addr.startswith("127.0.0.1:")
        assert a.holder.addr != server.addr
        assert 0 <= a.holder.seconds < 30
        assert b.holder is not None and b.holder.owner is None
        assert [lock.key for lock in locks(server.addr, "who/", max=1)] in ([b"who/a"], [b"who/b"])
        assert sorted(lock.key for lock in locks(server.addr, b"who/")) == [b"who/a", b"who/b"]


def test_the_queue_names_each_waiter_oldest_first(server):
    async def main() -> None:
        async with AsyncClient(server.addr, owner="holder/1") as holder, AsyncClient(server.addr, owner="waiter/1") as w1, AsyncClient(server.addr, owner="waiter/2") as w2:
            grant = await holder.acquire("q/k", lease=30)
            assert grant is not None
            first = asyncio.ensure_future(w1.acquire("q/k", lease=5, wait=20))
            await asyncio.sleep(0.2)
            second = asyncio.ensure_future(w2.acquire("q/k", lease=5, wait=20))

            async def two_waiting():
                q = await async_lock_queue(server.addr, "q/k")
                return q if q.waiting == 2 else None

            queue = None
            for _ in range(200):
                queue = await two_waiting()
                if queue:
                    break
                await asyncio.sleep(0.02)
            assert queue is not None, "two waiters not seen"
            assert queue.lock is not None and queue.lock.token == grant.token
            assert queue.lock.holder is not None and queue.lock.holder.owner == "holder/1"
            assert [w.owner for w in queue.waiters] == ["waiter/1", "waiter/2"]
            assert queue.waiters[0].seconds >= queue.waiters[1].seconds
            assert all(w.addr and w.addr.startswith("127.0.0.1:") for w in queue.waiters)
            page, _ = await async_list_locks(server.addr, "q/")
            assert [(lock.key, lock.waiters) for lock in page] == [(b"q/k", 2)]
            assert [lock.key for lock in await async_locks(server.addr, "q/")] == [b"q/k"]
            await holder.release("q/k", grant.token)
            got = await first
            assert got is not None
            assert (await async_lock_queue(server.addr, "q/k")).lock.holder.owner == "waiter/1"
            await w1.release("q/k", got.token)
            later = await second
            assert later is not None
            await w2.release("q/k", later.token)
            empty = await async_lock_queue(server.addr, "q/k")
            assert (empty.lock, empty.waiters, empty.waiting) == (None, [], 0)

    run(main())


def test_a_bad_owner_label_is_refused_before_any_connection():
    for bad in ["", "-", "has space", "é", "x" * 129, 7]:
        with pytest.raises(InvalidArgument):
            AsyncClient("127.0.0.1:1", owner=bad)  # type: ignore[arg-type]
    assert lock_queue.__doc__ and list_locks.__doc__


def test_an_older_server_that_refuses_the_owner_label_is_used_without_it(make_fake):
    """A server older than ``O`` answers ``E unknown op`` and closes: the
    client dials again at once without the label and works as before."""
    fake = make_fake(hello=False)

    async def main() -> None:
        # One address: two connections, each refused once with the label.
        client = AsyncClient(fake.addr, owner="me/1", redial_interval=60)
        task = asyncio.ensure_future(client.connect())
        loop = asyncio.get_running_loop()
        firsts = []
        for i in range(4):
            conn = await loop.run_in_executor(None, fake.conn, i)
            first = await loop.run_in_executor(None, conn.line)
            firsts.append(first)
            if first == b"O me/1":
                assert await loop.run_in_executor(None, conn.line) == b"S"
                conn.send(b'E unknown op "O" in line 1\n')
                conn.close()
            else:
                assert first == b"S"
                conn.send(b"S active - 0\n")
        await task
        assert sorted(firsts) == [b"O me/1", b"O me/1", b"S", b"S"]
        for _ in range(250):
            if client.connected() == 2:
                break
            await asyncio.sleep(0.02)
        assert client.connected() == 2
        await client.close()

    run(main())


def test_an_older_server_lists_without_holders(make_fake):
    """``W`` refused with E: the page is asked again with ``L``."""
    fake = make_fake(hello=False)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        listing = asyncio.ensure_future(async_list_locks(fake.addr, "p/", limit=5))
        w = await loop.run_in_executor(None, fake.conn, 0)
        assert await loop.run_in_executor(None, w.line) == b"W 0 5 p/"
        w.send(b'E unknown op "W" in line 1\n')
        w.close()
        l = await loop.run_in_executor(None, fake.conn, 1)
        assert await loop.run_in_executor(None, l.line) == b"L 0 5 p/"
        l.send(b"K p/a 7 1500 2\nL 0\n")
        page, cursor = await listing
        assert cursor == 0
        assert [(x.key, x.token, x.lease_left, x.waiters, x.holder) for x in page] == [(b"p/a", 7, 1.5, 2, None)]
        queue = asyncio.ensure_future(async_lock_queue(fake.addr, "p/a"))
        q = await loop.run_in_executor(None, fake.conn, 2)
        assert await loop.run_in_executor(None, q.line) == b"Q p/a"
        q.send(b'E unknown op "Q" in line 1\n')
        with pytest.raises(ProtocolError):
            await queue

    run(main())
