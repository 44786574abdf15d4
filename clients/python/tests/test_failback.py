"""Failback as the client lives through it, against fake servers whose
answers the test writes: an ``M`` naming a node the client has no live
connection to is dialled at once (not at the next redial tick), ``M``
storms do not become dial storms, a renewing lock survives the role moving
to a node that has just started, and the end of a ``with`` block does not
wait on the cluster once the lock is known lost."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Callable, List, Optional

import pytest

from conftest import FakeServer, poll, reserve_port
from ringlock import AsyncClient, Client, ConnectionFailed, LockLost, RinglockError

Answer = Callable[[bytes], Optional[bytes]]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def serve_all(fake: FakeServer, answer: Answer) -> List[bytes]:
    """Answers every request on every connection of ``fake`` with
    ``answer(line)`` (nothing for None); returns the log of requests."""
    log: List[bytes] = []

    def conn_loop(conn) -> None:
        try:
            while not fake.closed:
                line = conn.line(60)
                log.append(line)
                out = answer(line)
                if out is not None:
                    conn.send(out + b"\n")
        except (AssertionError, OSError):
            pass

    def accept_loop() -> None:
        seen = 0
        while not fake.closed:
            with fake.cond:
                fake.cond.wait_for(lambda: len(fake.conns) > seen or fake.closed, 0.1)
                new = fake.conns[seen:]
            seen += len(new)
            for c in new:
                threading.Thread(target=conn_loop, args=(c,), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True).start()
    return log


def standby_naming(active: str) -> Answer:
    def answer(line: bytes) -> Optional[bytes]:
        f = line.split(b" ")
        if f[0] == b"S":
            return b"S standby " + active.encode() + b" 0"
        return b"M " + f[1] + b" " + active.encode()

    return answer


def active_node(me: str, renewed: bytes = b"1", answer_r: bool = True, answer_n: bool = True) -> Answer:
    def answer(line: bytes) -> Optional[bytes]:
        f = line.split(b" ")
        if f[0] == b"A":
            return b"A " + f[1] + b" 9"
        if f[0] == b"N":
            return b"N " + f[1] + b" " + renewed if answer_n else None
        if f[0] == b"R":
            return b"R " + f[1] + b" 1" if answer_r else None
        return b"S active " + me.encode() + b" 0"

    return answer


def lines(log: List[bytes], prefix: bytes) -> List[bytes]:
    return [line for line in list(log) if line.startswith(prefix)]


def test_an_m_naming_a_node_without_a_connection_dials_it_at_once(make_fake):
    """b is down when the client starts; a standby names it. Once b is up,
    a request meeting M b completes at b at once, not at the next redial
    (here 60 s away)."""
    b_sock = reserve_port()
    b_addr = "127.0.0.1:%d" % b_sock.getsockname()[1]
    a = make_fake()
    a_log = serve_all(a, standby_naming(b_addr))

    async def main() -> None:
        async with AsyncClient([a.addr, b_addr], redial_interval=60) as client:
            assert client.connected() == 1
            b = make_fake(sock=b_sock)
            b_log = serve_all(b, active_node(b_addr))
            started = time.monotonic()
            grant = await client.acquire("k", 5, wait=1)
            took = time.monotonic() - started
            assert grant is not None and grant.token == 9
            assert took < 0.5, took
            assert len(lines(a_log, b"A k")) == 1
            assert len(lines(b_log, b"A k")) == 1
            assert len(b.accepted_at) == 1
            # b is preferred now: the release goes straight there.
            assert await client.release("k", 9) is True
            assert lines(a_log, b"R ") == []
            assert lines(b_log, b"R k 9") == [b"R k 9"]

    run(main())


def test_a_release_and_a_renew_that_meet_m_complete_at_the_named_node(make_fake):
    b_sock = reserve_port()
    b_addr = "127.0.0.1:%d" % b_sock.getsockname()[1]
    a = make_fake()
    a_log = serve_all(a, standby_naming(b_addr))
    with Client([a.addr, b_addr], redial_interval=60) as client:
        b = make_fake(sock=b_sock)
        b_log = serve_all(b, active_node(b_addr))
        started = time.monotonic()
        assert client.release("k", 7) is True
        assert time.monotonic() - started < 0.5
        assert lines(a_log, b"R k 7") == [b"R k 7"]
        assert lines(b_log, b"R k 7") == [b"R k 7"]
        started = time.monotonic()
        assert client.renew("k", 7, 2) is True
        assert time.monotonic() - started < 0.5
        assert lines(b_log, b"N k 7 2") == [b"N k 7 2"]


def test_an_m_storm_naming_a_hung_node_is_not_a_dial_storm(make_fake):
    """50 releases keep meeting M b; b accepts connections but never answers
    the hello. One dial of b is under way at a time (the requests share its
    outcome), and redirect dials that fail are spaced out."""
    b = make_fake(hello=False)
    a = make_fake()
    a_log = serve_all(a, standby_naming(b.addr))

    async def main() -> None:
        async with AsyncClient([a.addr, b.addr], redial_interval=60, probe_timeout=0.3, retry_for=2.5) as client:
            poll("b's first dial", lambda: len(b.accepted_at) == 1, 5)
            await asyncio.sleep(0.5)  # its hello has timed out
            started = time.monotonic()
            results = await asyncio.gather(*(client.release(f"k{i}", 5) for i in range(50)), return_exceptions=True)
            for r in results:
                assert isinstance(r, ConnectionFailed), r
            dials = b.accepted_at[1:]
            ms = len(lines(a_log, b"R k"))
            assert ms >= 50 * 5, ms
            assert 1 <= len(dials) <= 6, [round(t - started, 3) for t in dials]
            assert dials[0] - started < 0.2
            # Each dial waited 0.3 s for the hello; the requests waiting for
            # it share its failure and retry 0.2 s later, which dials again.
            for x, y in zip(dials, dials[1:]):
                assert y - x >= 0.45, [round(t - started, 3) for t in dials]

    run(main())


def test_a_renewing_lock_survives_the_role_moving_to_a_node_just_started(make_fake):
    """a is active; b is down. 0.6 s into the block b comes back and takes
    the role back at once (a answers M b from then on). The lock's next
    renewal meets M b and is confirmed by b."""
    b_sock = reserve_port()
    b_addr = "127.0.0.1:%d" % b_sock.getsockname()[1]
    handed_back = threading.Event()
    a = make_fake()
    as_active = active_node("a")
    as_standby = standby_naming(b_addr)
    a_log = serve_all(a, lambda line: as_standby(line) if handed_back.is_set() else as_active(line))
    with Client([b_addr, a.addr], redial_interval=60) as client:
        with client.lock("k", lease=1.5) as lock:
            assert lock.token == 9
            time.sleep(0.6)
            b = make_fake(sock=b_sock)
            b_log = serve_all(b, active_node(b_addr))
            handed_back.set()
            time.sleep(2.5)
            assert not lock.is_lost(), lock.lost
            assert len(lines(b_log, b"N k 9 1.5")) >= 4, b_log
            assert len(b.accepted_at) == 1
        assert lines(b_log, b"R k 9") == [b"R k 9"]
        assert lines(a_log, b"R ") == []


def test_the_end_of_a_with_block_is_immediate_once_the_lock_is_lost(make_fake):
    """The node stops answering renewals and releases (still answering
    probes): the lock is lost at its deadline, and the end of the block
    raises LockLost at once; the release goes out in the background."""
    fake = make_fake()
    log = serve_all(fake, active_node("n", answer_r=False, answer_n=False))
    with Client(fake.addr, redial_interval=60) as client:
        with pytest.raises(LockLost) as info:
            with client.lock("k", lease=1) as lock:
                lost = lock.wait_lost(5)
                assert lost is not None and not lost.refused
                started = time.monotonic()
        took = time.monotonic() - started
        assert took < 0.2, took
        assert info.value.token == 9
        poll("the background release", lambda: lines(log, b"R k 9"), 2)


def test_the_end_of_an_async_with_block_is_immediate_once_the_lock_is_lost(make_fake):
    fake = make_fake()
    log = serve_all(fake, active_node("n", answer_r=False, answer_n=False))
    refused = make_fake()
    refused_log = serve_all(refused, active_node("r", renewed=b"0"))

    async def main() -> None:
        async with AsyncClient(fake.addr, redial_interval=60) as client:
            with pytest.raises(LockLost):
                async with client.lock("k", lease=1) as lock:
                    lost = await asyncio.wait_for(lock.wait_lost(), 5)
                    assert lost is not None and not lost.refused
                    started = time.monotonic()
            assert time.monotonic() - started < 0.2
            for _ in range(100):
                if lines(log, b"R k 9"):
                    break
                await asyncio.sleep(0.02)
            assert lines(log, b"R k 9") == [b"R k 9"]
        # N k 0: nothing to release, nothing sent.
        async with AsyncClient(refused.addr, redial_interval=60) as client:
            with pytest.raises(LockLost):
                async with client.lock("k", lease=1) as lock:
                    lost = await asyncio.wait_for(lock.wait_lost(), 5)
                    assert lost is not None and lost.refused
                    started = time.monotonic()
            assert time.monotonic() - started < 0.2
            await asyncio.sleep(0.3)
            assert lines(refused_log, b"R ") == []

    run(main())


def test_redirect_dials_that_keep_failing_are_spaced_out(make_fake):
    """b accepts connections and closes them at once (each dial fails at
    its hello, at once). Requests meeting M b retry every 0.2 s; the dials
    they cause wait 50 ms after a failed one, doubling up to 1 s."""
    b = make_fake(max_conns=0)
    a = make_fake()
    serve_all(a, standby_naming(b.addr))

    async def main() -> None:
        async with AsyncClient([a.addr, b.addr], redial_interval=60, retry_for=3) as client:
            poll("b's first dial", lambda: len(b.accepted_at) == 1, 5)
            await asyncio.sleep(0.1)
            started = time.monotonic()
            results = await asyncio.gather(*(client.release(f"k{i}", 5) for i in range(20)), return_exceptions=True)
            for r in results:
                assert isinstance(r, ConnectionFailed), r
            dials = [round(t - started, 3) for t in b.accepted_at[1:]]
            # Retries every 0.2 s for 3 s would be 15 dials without the
            # spacing; with it: about 0, 0.2, 0.4, 0.6 or 0.8, 1.2, 2.2.
            assert 3 <= len(dials) <= 8, dials
            gaps = [y - x for x, y in zip(dials, dials[1:])]
            assert max(gaps) >= 0.75, dials

    run(main())


def test_a_named_node_that_drops_every_connection_is_not_dialled_per_m(make_fake):
    """b answers the hello, then closes the connection. A connection that a
    redirect made and that dropped at once counts as a failed redirect
    dial: the dials are spaced as above, not one per M."""
    b = make_fake()

    def close_all() -> None:
        seen = 0
        while not b.closed:
            with b.cond:
                b.cond.wait_for(lambda: len(b.conns) > seen or b.closed, 0.1)
                new = b.conns[seen:]
            seen += len(new)
            for c in new:
                c.close()

    threading.Thread(target=close_all, daemon=True).start()
    a = make_fake()
    serve_all(a, standby_naming(b.addr))

    async def main() -> None:
        async with AsyncClient([a.addr, b.addr], redial_interval=60, retry_for=3) as client:
            poll("b's first dial", lambda: len(b.accepted_at) == 1, 5)
            await asyncio.sleep(0.1)
            started = time.monotonic()
            results = await asyncio.gather(*(client.release(f"k{i}", 5) for i in range(20)), return_exceptions=True)
            for r in results:
                assert isinstance(r, ConnectionFailed), r
            dials = [round(t - started, 3) for t in b.accepted_at if t >= started]
            assert 3 <= len(dials) <= 8, dials
            gaps = [y - x for x, y in zip(dials, dials[1:])]
            assert max(gaps) >= 0.75, dials

    run(main())


def test_a_try_lock_asks_even_when_finding_a_connection_took_longer_than_its_wait():
    # The try's wait (1 ms) is the server's to count: with every connection
    # dropped and being redialled, the one attempt still goes out once a
    # connection is back, and a free key is granted, not reported held.
    fake = FakeServer(max_conns=2)
    log = serve_all(fake, lambda line: b"A free 7" if line.startswith(b"A ") else b"S active - 0")
    try:
        with Client(fake.addr, redial_interval=0.3) as client:
            first, second = fake.conn(0), fake.conn(1)
            # Redials are closed at once until the server takes more.
            # (shutdown, not close: serve_all's threads are blocked reading them)
            first.sock.shutdown(socket.SHUT_RDWR)
            second.sock.shutdown(socket.SHUT_RDWR)
            poll("the client saw both connections drop", lambda: client.connected() == 0, 5)
            threading.Timer(0.1, lambda: setattr(fake, "max_conns", 10)).start()
            started = time.monotonic()
            grant = client.try_acquire("free", 5)
            assert grant is not None and grant.token == 7
            assert time.monotonic() - started >= 0.05
            assert [l for l in log if l.startswith(b"A ")] == [b"A free 5 0.001"]
    finally:
        fake.close()


def test_an_acquire_redirected_to_a_node_it_cannot_reach_fails_rather_than_times_out(make_fake):
    """a keeps naming b, which refuses connections: an acquire whose wait
    runs out meanwhile raises ConnectionFailed naming b (no node said the
    wait ran out: None would mean the lock is held), by its wait plus the
    grace."""
    b_sock = reserve_port()
    b_addr = "127.0.0.1:%d" % b_sock.getsockname()[1]
    a = make_fake()
    serve_all(a, standby_naming(b_addr))
    with Client([a.addr, b_addr]) as client:
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(ConnectionFailed, match=b_addr):
                client.acquire("k", 5, wait=0.5)
            assert time.monotonic() - started < 1.5 + 0.3


def test_close_ends_a_release_and_a_renew_in_flight_at_once(make_fake):
    """close() while a release and a renew wait on a node that does not
    answer them (and one redirected to a node that refuses): they raise
    at once, not after their 5 s of retries."""
    b_sock = reserve_port()
    b_addr = "127.0.0.1:%d" % b_sock.getsockname()[1]
    a = make_fake()
    serve_all(a, lambda line: b"M " + line.split(b" ")[1] + b" " + b_addr.encode() if line.startswith(b"N") else None)

    async def main() -> None:
        client = await AsyncClient([a.addr]).connect()
        release = asyncio.ensure_future(client.release("k", 5))
        renew = asyncio.ensure_future(client.renew("j", 5, 2))
        await asyncio.sleep(0.3)
        started = time.monotonic()
        await client.close()
        for call in (release, renew):
            with pytest.raises(RinglockError):
                await asyncio.wait_for(call, 10)
        assert time.monotonic() - started < 0.5

    run(main())


def black_hole():
    """A loopback address whose connects never complete: a listener that
    accepts nothing, its accept queue filled, so that new SYNs are dropped.
    Returns the address and what must be kept open."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    fill = []
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(listener.getsockname())
        except BlockingIOError:
            pass
        fill.append(s)
    probe = socket.socket()
    probe.settimeout(0.3)
    with pytest.raises(socket.timeout):
        probe.connect(listener.getsockname())
    probe.close()
    return "127.0.0.1:%d" % listener.getsockname()[1], [listener, *fill]


def test_an_m_naming_a_black_hole_keeps_the_blocking_clients_bounds(make_fake):
    """a names a node whose connects never complete: an acquire ends by its
    wait plus the grace (raising: no node said the wait ran out), a release
    by its 5 s, and close() during the dial at once."""
    bh, keep = black_hole()
    a = make_fake()
    serve_all(a, standby_naming(bh))
    client = Client([a.addr])
    try:
        started = time.monotonic()
        with pytest.raises(ConnectionFailed, match=bh):
            client.acquire("k", 5, wait=0.5)
        assert time.monotonic() - started < 1.5 + 0.3
        started = time.monotonic()
        with pytest.raises(ConnectionFailed):
            client.release("k", 5)
        assert time.monotonic() - started < 5.0 + 0.3
        failed: List[BaseException] = []

        def release() -> None:
            try:
                client.release("j", 5)
            except BaseException as e:
                failed.append(e)

        caller = threading.Thread(target=release)
        caller.start()
        time.sleep(0.3)
    finally:
        started = time.monotonic()
        client.close()
    assert time.monotonic() - started < 1.0
    caller.join(2)
    assert not caller.is_alive()
    assert len(failed) == 1 and isinstance(failed[0], RinglockError), failed
    for s in keep:
        s.close()
