"""Shared locks and semaphores against one real node: readers hold a key
together, a writer waits for them, a reader behind a waiting writer waits,
a semaphore never has more holders than its limit, refusals of the other
kind, and the answer parser's bounds."""

from __future__ import annotations

import asyncio
import threading

import pytest

from conftest import poll
from ringlock import AsyncClient, Client, InvalidArgument, LockTimeout, WrongKind, lock_queue
from ringlock import _proto


def test_readers_share_and_a_writer_waits_for_them(server):
    with Client(server.addr) as a, Client(server.addr) as b:
        r1 = a.acquire("cfg", lease=10, shared=True)
        r2 = b.acquire("cfg", lease=10, shared=True)
        assert r1 is not None and r2 is not None and r2.token > r1.token
        # An exclusive acquire does not get it while readers hold it.
        assert a.try_acquire("cfg", 10) is None
        got = {}

        def writer():
            got["w"] = b.acquire("cfg", lease=10, wait=5)

        t = threading.Thread(target=writer)
        t.start()
        poll("the writer queued", lambda: lock_queue(server.addr, "cfg").waiting == 1, 5)
        # A reader behind the waiting writer waits too.
        assert a.try_acquire("cfg", 10, shared=True) is None
        assert a.release("cfg", r1.token) is True
        assert "w" not in got
        assert b.release("cfg", r2.token) is True
        t.join(5)
        w = got["w"]
        assert w is not None and w.token > r2.token
        assert b.release("cfg", w.token) is True


def test_a_semaphore_never_has_more_holders_than_its_limit(server):
    with Client(server.addr) as client:
        p1 = client.acquire("pool", lease=10, permits=2)
        p2 = client.acquire("pool", lease=10, permits=2)
        assert p1 and p2 and p2.token > p1.token
        assert client.try_acquire("pool", 10, permits=2) is None
        assert client.release("pool", p1.token) is True
        p3 = client.acquire("pool", lease=10, wait=1, permits=2)
        assert p3 is not None and p3.token > p2.token
        assert client.renew("pool", p3.token, 20) is True
        for p in (p2, p3):
            assert client.release("pool", p.token) is True


def test_the_other_kind_is_refused_and_changes_nothing(server):
    with Client(server.addr) as client:
        p = client.acquire("sem", lease=10, permits=3)
        with pytest.raises(WrongKind) as e:
            client.acquire("sem", lease=10, permits=4)
        assert e.value.limit == 3 and "semaphore of 3" in str(e.value)
        with pytest.raises(WrongKind):
            client.acquire("sem", lease=10, shared=True)
        lock = client.acquire("lk", lease=10)
        with pytest.raises(WrongKind) as e:
            client.acquire("lk", lease=10, permits=2)
        assert e.value.limit == 0 and "as a lock" in str(e.value)
        # The client goes on: the permit and the lock are still held.
        assert client.release("sem", p.token) is True
        assert client.release("lk", lock.token) is True


def test_an_exclusive_acquire_of_a_semaphore_is_wrong_kind(server):
    with Client(server.addr) as holder, Client(server.addr) as other:
        p = holder.acquire("sem2", lease=10, permits=2)
        with pytest.raises(WrongKind) as e:
            other.acquire("sem2", lease=10, wait=1)
        assert "semaphore" in str(e.value)
        assert holder.release("sem2", p.token) is True


def test_shared_locks_renew_and_end_with_the_block(server):
    async def main():
        async with AsyncClient(server.addr) as client:
            async with client.lock("doc", lease=0.6, shared=True) as r1:
                async with client.lock("doc", lease=0.6, shared=True) as r2:
                    await asyncio.sleep(1.0)  # renewed past its first lease
                    assert not r1.is_lost() and not r2.is_lost()
            w = await client.acquire("doc", lease=5, wait=1)
            assert w is not None and w.token > r2.token
            assert await client.release("doc", w.token)

    asyncio.run(main())


def test_a_timed_out_shared_acquire_is_none_and_lock_raises(server):
    with Client(server.addr) as client:
        w = client.acquire("busy2", lease=10)
        assert client.acquire("busy2", lease=5, wait=0.2, shared=True) is None
        with pytest.raises(LockTimeout):
            client.lock("busy2", lease=5, wait=0.2, shared=True)
        assert client.release("busy2", w.token)


def test_bad_kind_arguments_are_refused_before_sending():
    for shared, permits in [(True, 2), (False, 0), (False, 65537), (False, True), ("yes", None), (False, 1.5)]:
        with pytest.raises(InvalidArgument):
            _proto.check_kind(shared, permits)  # type: ignore[arg-type]
    assert _proto.check_kind(False, None) == ("A", 0)
    assert _proto.check_kind(True, None) == ("G", 0)
    assert _proto.check_kind(False, 65536) == ("C", 65536)
    assert _proto.acquire_kind_line("G", b"k", 0, 1500, 0) == b"G k 1.5 0\n"
    assert _proto.acquire_kind_line("C", b"k", 7, 30000, 250) == b"C k 7 30 0.25\n"


def test_the_answers_of_g_and_c_parse_within_their_bounds():
    ok = {
        b"G k 17": ("G", 17),
        b"C k 0": ("C", 0),
        b"G k semaphore 3": ("G", ("semaphore", 3)),
        b"C k semaphore 65536": ("C", ("semaphore", 65536)),
        b"C k lock": ("C", ("lock", 0)),
    }
    for line, (op, value) in ok.items():
        a = _proto.parse_answer(line)
        assert (a.op, a.key, a.value) == (op, b"k", value)
    for line in [b"G k lock", b"G k", b"C k semaphore 0", b"C k semaphore 65537", b"G k -1",
                 b"C k 18446744073709551616", b"G k semaphore", b"C k lock 1", b"G  k 1"]:
        with pytest.raises(_proto.MalformedAnswer):
            _proto.parse_answer(line)
