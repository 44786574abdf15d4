"""Against one real node: acquire, release, renew, try-lock, FIFO waits,
wait timeouts, renewal and its loss signal, keys as bytes, concurrency."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from conftest import poll
from ringlock import (
    AsyncClient,
    Client,
    InvalidArgument,
    LockLost,
    LockTimeout,
    RinglockError,
    node_problem,
    node_status,
)


def test_acquire_release_renew(server):
    with Client(server.addr) as client:
        assert client.connections() == 2  # one address: two connections
        poll("both connections up", lambda: client.connected() == 2, 5)
        grant = client.acquire("job", lease=5)
        assert grant is not None and grant.token > 2**53
        assert grant.key == b"job" and grant.lease == 5.0
        assert 4 < grant.remaining() <= 5
        assert client.renew("job", grant.token, 10) is True
        assert client.release("job", grant.token) is True
        assert client.release("job", grant.token) is False
        assert client.renew("job", grant.token, 10) is False
        again = client.acquire("job", lease=5, wait=1)
        assert again is not None and again.token > grant.token
        assert client.release(b"job", again.token)


def test_lock_context_manager_and_try_lock(server):
    with Client([server.addr]) as client:
        with client.lock("report", lease=10, wait=2) as lock:
            assert lock.token > 0 and lock.key == b"report"
            assert client.try_lock("report", 10) is None
            assert client.try_acquire("report", 10) is None
        # Released at the end of the block.
        other = client.try_lock("report", 10)
        assert other is not None and other.token > lock.token
        assert other.release() is True
        assert other.release() is False


def test_wait_runs_out(server):
    with Client(server.addr) as holder, Client(server.addr) as waiter:
        held = holder.lock("busy", lease=30)
        started = time.monotonic()
        with pytest.raises(LockTimeout):
            waiter.lock("busy", lease=5, wait=0.3)
        took = time.monotonic() - started
        assert 0.25 <= took < 1.3, took
        assert waiter.acquire("busy", 5, wait=0.05) is None
        held.release()
        assert waiter.acquire("busy", 5, wait=1) is not None


def test_fifo_waiters(server):
    """Waiters are granted in arrival order. Each waiter's arrival is made
    sure of (pending request seen, then a sync barrier) before the next."""
    with Client(server.addr) as holder:
        first = holder.lock("fifo", lease=30)
        order: list = []
        clients = [Client(server.addr) for _ in range(3)]
        threads = []
        try:
            for i, c in enumerate(clients):
                def wait_turn(i: int = i, c: Client = c) -> None:
                    with c.lock("fifo", lease=30, wait=20) as lock:
                        order.append((i, lock.token))

                t = threading.Thread(target=wait_turn)
                t.start()
                threads.append(t)
                poll(f"waiter {i} sent its acquire", lambda c=c: c.pending_requests() == 1, 5)
                c.sync()  # the server has read it
            first.release()
            for t in threads:
                t.join(20)
                assert not t.is_alive()
        finally:
            for c in clients:
                c.close()
        assert [i for i, _ in order] == [0, 1, 2]
        tokens = [t for _, t in order]
        assert tokens == sorted(tokens) and tokens[0] > first.token


def test_renewal_keeps_the_lock_and_signals_loss(server):
    with Client(server.addr) as client, Client(server.addr) as other:
        lost_seen = []
        lock = client.lock("renewed", lease=0.6, on_lost=lost_seen.append)
        # Renewed every 0.2 s: still held well past its first lease.
        poll("four renewals", lambda: lock.renewals >= 4, 5)
        assert other.try_lock("renewed", 5) is None
        assert lock.lost is None
        # Someone releases it with the token: the next renewal is refused.
        assert other.release("renewed", lock.token) is True
        lost = lock.wait_lost(timeout=3)
        assert isinstance(lost, LockLost) and lost.refused
        assert lost_seen and lost_seen[0] is lost
        with pytest.raises(LockLost):
            lock.check()
        with pytest.raises(LockLost):
            with lock:
                pass


def test_lock_without_renewal_expires(server):
    with Client(server.addr) as client, Client(server.addr) as other:
        lock = client.lock("short", lease=0.3, renew=False)
        assert other.try_lock("short", 5) is None
        got = poll("the lease ran out", lambda: other.try_lock("short", 5), 3)
        assert got.token > lock.token
        assert lock.renew() is False
        assert lock.release() is False


def test_keys_are_bytes_utf8_for_str(server):
    with Client(server.addr) as client:
        key = "clé-🔒/é"
        lock = client.lock(key, lease=10)
        assert lock.key == key.encode("utf-8")
        # The same lock, spelled as bytes.
        assert client.try_lock(key.encode("utf-8"), 10) is None
        raw = b"\x80\xff\xfe-bin"
        g = client.acquire(raw, 10)
        assert g is not None and g.key == raw
        assert client.try_acquire(bytearray(raw), 10) is None
        assert client.release(raw, g.token)
        assert lock.release()
        for bad in ["", "a b", "tab\t", "del\x7f", "x" * 251, b"\x00", "new\nline"]:
            with pytest.raises(InvalidArgument):
                client.acquire(bad, 10)
        with pytest.raises(InvalidArgument):
            client.acquire("k", 0)
        with pytest.raises(InvalidArgument):
            client.acquire("k", 86401)
        with pytest.raises(InvalidArgument):
            client.acquire("k", 1, wait=0)
        with pytest.raises(InvalidArgument):
            client.release("k", 0)
        with pytest.raises(InvalidArgument):
            client.release("k", 2**64)
        # 250 bytes is fine.
        g = client.acquire("k" * 250, 1)
        assert g is not None and client.release("k" * 250, g.token)


def test_status_sync_and_one_off(server):
    with Client(server.addr) as client:
        g = client.acquire("s", 5)
        statuses = client.status()
        assert len(statuses) == 1
        st = statuses[0].status
        assert st is not None and st.role == "active" and st.active == server.addr
        assert st.token >= g.token
        client.sync()
    assert node_status(server.addr).role == "active"
    assert node_problem(server.addr) is None


def test_threads_share_one_client_with_mutual_exclusion(server):
    counter = {"inside": 0, "max": 0, "done": 0, "tokens": []}
    guard = threading.Lock()
    until = time.monotonic() + 2
    with Client(server.addr) as client:
        def worker() -> None:
            while time.monotonic() < until:
                with client.lock("shared", lease=5, wait=10, renew=False) as lock:
                    with guard:
                        counter["inside"] += 1
                        counter["max"] = max(counter["max"], counter["inside"])
                        counter["tokens"].append(lock.token)
                    with guard:
                        counter["inside"] -= 1
                        counter["done"] += 1

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
    assert counter["max"] == 1
    assert counter["done"] > 10
    assert counter["tokens"] == sorted(counter["tokens"])


def test_asyncio_api(server):
    async def main() -> None:
        async with AsyncClient(server.addr) as client:
            inside = 0
            seen = []

            async def worker(i: int) -> None:
                nonlocal inside
                for _ in range(5):
                    async with client.lock("aio", lease=5, wait=10) as lock:
                        inside += 1
                        assert inside == 1
                        seen.append(lock.token)
                        await asyncio.sleep(0)
                        inside -= 1

            await asyncio.wait_for(asyncio.gather(*(worker(i) for i in range(16))), 30)
            assert len(seen) == 80 and seen == sorted(seen)

            # try_lock, timeout, renewal and the loss signal.
            lock = await client.lock("aio-renew", lease=0.6)
            assert await client.try_lock("aio-renew") is None
            with pytest.raises(LockTimeout):
                await client.lock("aio-renew", lease=1, wait=0.1)
            assert await client.release("aio-renew", lock.token)
            lost = await asyncio.wait_for(lock.wait_lost(), 3)
            assert isinstance(lost, LockLost) and lost.refused
            with pytest.raises(LockLost):
                async with lock:
                    pass

    asyncio.run(main())


def test_cancelled_acquire_is_released_when_granted_later(server):
    """An acquire whose caller gave up stays queued on the server (waiting
    acquires belong to their connection); when it is granted the client
    releases it at once."""

    async def main() -> None:
        async with AsyncClient(server.addr) as holder, AsyncClient(server.addr) as waiter:
            held = await holder.lock("gone", lease=30, renew=False)
            task = asyncio.ensure_future(waiter.acquire("gone", 30))
            deadline = time.monotonic() + 5
            while waiter.pending_requests() == 0:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            await waiter.sync()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await held.release()
            # Granted to the cancelled waiter, then released by its client.
            deadline = time.monotonic() + 5
            while True:
                got = await holder.try_lock("gone", 5, renew=False)
                if got is not None:
                    await got.release()
                    break
                assert time.monotonic() < deadline, "the abandoned grant was not released"
                await asyncio.sleep(0.02)

    asyncio.run(main())


def test_local_queue_keeps_releases_moving(server):
    """With room for 1 waiting acquire per connection (2 in all), further acquires
    queue in the client and a release is not held behind them."""
    with Client(server.addr) as holder, Client(server.addr, max_waiting_acquires=1) as waiter:
        held = holder.lock("q", lease=30, renew=False)
        results = []

        def wait_once() -> None:
            results.append(waiter.acquire("q", 30, wait=10))

        threads = [threading.Thread(target=wait_once) for _ in range(4)]
        for t in threads:
            t.start()
        # Two on the server (one per connection), two in the client.
        poll("two acquires sent", lambda: waiter.pending_requests() == 2, 5)
        # Releases and renewals are not held back behind them.
        other = holder.acquire("other", 5)
        assert other is not None
        assert waiter.renew("other", other.token, 5) is True
        assert waiter.release("other", other.token) is True
        held.release()
        released: set = set()
        for _ in range(4):
            g = poll("next grant", lambda: next((r for r in results if r is not None and r.token not in released), None), 10)
            released.add(g.token)
            assert waiter.release("q", g.token)
        for t in threads:
            t.join(10)
        assert len(results) == 4 and all(r is not None for r in results)


def test_a_lock_dropped_unreleased_is_released_in_the_background(server):
    import gc

    with Client(server.addr) as client, Client(server.addr) as other:
        lock = client.lock("dropped", lease=30)
        assert other.try_lock("dropped", 5, renew=False) is None
        del lock
        gc.collect()
        got = poll("released in the background", lambda: other.try_lock("dropped", 5, renew=False), 5)
        assert got.release() is True


def test_close_ends_calls_blocked_in_other_threads(server):
    with Client(server.addr) as holder:
        held = holder.lock("closing", lease=30, renew=False)
        client = Client(server.addr)
        errors = []

        def wait_forever() -> None:
            try:
                client.acquire("closing", 30)  # no wait limit
            except Exception as e:
                errors.append(e)

        t = threading.Thread(target=wait_forever)
        t.start()
        poll("waiting", lambda: client.pending_requests() == 1, 5)
        client.close()
        t.join(5)
        assert not t.is_alive()
        assert errors and isinstance(errors[0], RinglockError)
        held.release()
