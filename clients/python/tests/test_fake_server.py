"""Against a fake server whose answers the test writes: pipelined requests
answered out of order, malformed and hostile answers, silent nodes."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from conftest import poll, reserve_port
from ringlock import AsyncClient, Client, ConnectionFailed, NoActiveNode, ProtocolError


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def _whole_wait(line: bytes, wait: int) -> bytes:
    """An `A` line with its wait field checked to be at most `wait` seconds
    and less than one second short of it, then written as `wait`."""
    fields = line.split(b" ")
    if fields[0] != b"A":
        return line
    sent = float(fields[3])
    assert wait - 1 < sent <= wait, line
    return b" ".join(fields[:3] + [str(wait).encode()])


def test_pipelined_answers_in_scrambled_order(make_fake):
    """Requests go out without waiting; answers in any order are matched by
    op and key, and answers of one (op, key) pair in send order."""
    fake = make_fake(max_conns=1)  # the client's second connection is refused

    async def main() -> None:
        async with AsyncClient(fake.addr, redial_interval=60) as client:
            conn = fake.conn(0)
            calls = {
                "a5": client.acquire("a", 5, wait=9),   # first A a
                "a6": client.acquire("a", 6, wait=9),   # second A a
                "b": client.acquire("b", 7, wait=9),
                "rel_a": client.release("a", 42),
                "ren_a": client.renew("a", 43, 8),
                "rel_c": client.release("c", 44),
                "key_é": client.acquire("é", 9, wait=9),
                "m_d": client.acquire("d", 10, wait=9),
            }
            tasks = {name: asyncio.ensure_future(c) for name, c in calls.items()}
            lines = []
            for _ in range(len(tasks)):
                lines.append(await asyncio.get_running_loop().run_in_executor(None, conn.line))
            # An acquire carries what is left of its wait when it goes out: 9
            # seconds, or a few ms less on a loaded machine.
            lines = [_whole_wait(line, 9) for line in lines]
            # Every request went out before any answer.
            assert sorted(lines) == sorted([
                b"A a 5 9", b"A a 6 9", b"A b 7 9", b"R a 42", b"N a 43 8",
                b"R c 44", "A é 9 9".encode(), b"A d 10 9",
            ])
            first_a = 5 if lines.index(b"A a 5 9") < lines.index(b"A a 6 9") else 6
            # Scrambled: the renew and releases first, then b, the second
            # acquire's answer for a (T), ... The client matches by op and key.
            conn.send(b"N a 1\n")
            conn.send(b"R c 0\n")
            conn.send("A é 77\n".encode())
            conn.send(b"A a 1001\n")   # the oldest A of a
            conn.send(b"A b 1002\n")
            conn.send(b"T a\n")        # the next A of a
            conn.send(b"R a 1\n")
            # M answers the oldest request of d; the retry (on the only
            # connection) is answered with a grant.
            conn.send(b"M d -\n")
            retry = await asyncio.get_running_loop().run_in_executor(None, conn.line)
            assert retry.startswith(b"A d 10 ")
            conn.send(b"A d 1003\n")
            results = {name: await t for name, t in tasks.items()}
            granted_a = results["a5"] if first_a == 5 else results["a6"]
            timed_out_a = results["a6"] if first_a == 5 else results["a5"]
            assert granted_a is not None and granted_a.token == 1001
            assert timed_out_a is None
            assert results["b"].token == 1002
            assert results["key_é"].token == 77 and results["key_é"].key == "é".encode()
            assert results["rel_a"] is True
            assert results["ren_a"] is True
            assert results["rel_c"] is False
            assert results["m_d"].token == 1003
            assert client.pending_requests() == 0

    run(main())


MALFORMED = [
    b"A k notanumber\n",
    b"A k 0\n",                                # token 0
    b"A k 18446744073709551616\n",             # over u64
    b"A k +5\n",
    b"A k 1_000\n",
    "A k ５\n".encode(),                        # a non-ASCII digit
    b"A k 5 6\n",                              # a field too many
    b"A  k 5\n",                               # empty field
    b"X k 5\n",                                # unknown op
    b"\xff\xfe\x00garbage\n",
    b"A other 5\n",                            # matches no request
    b"R k 1\n",                                # no R pending
    b"S bogus - 0\n",                          # bad role
    b"H ok\n",                                 # H was never sent
    b"A k\x01 5\n",                            # forbidden byte in the key
    b"E something went wrong in line 1\n",
    b"A k " + b"9" * 5000 + b"\n",             # a line beyond the bound
    b"A k 5",                                  # then EOF mid-line (not a protocol error)
]


@pytest.mark.parametrize("answer", MALFORMED, ids=range(len(MALFORMED)))
def test_malformed_answers_are_protocol_errors_and_drop_the_connection(make_fake, answer):
    fake = make_fake(max_conns=1)

    async def main() -> None:
        async with AsyncClient(fake.addr, redial_interval=60) as client:
            conn = fake.conn(0)
            task = asyncio.ensure_future(client.acquire("k", 5, wait=3))
            line = await asyncio.get_running_loop().run_in_executor(None, conn.line)
            assert _whole_wait(line, 3) == b"A k 5 3"
            conn.send(answer)
            if answer == b"A k 5":
                conn.sock.shutdown(2)
                with pytest.raises(ConnectionFailed):
                    await task
                return
            with pytest.raises(ProtocolError):
                await task
            # The client dropped the connection.
            closed = await asyncio.get_running_loop().run_in_executor(None, conn.closed_by_client)
            assert closed
            assert client.connected() == 0

    run(main())


def test_a_node_that_accepts_but_never_answers(make_fake):
    """connect() gives up on a silent node after the probe timeout."""
    fake = make_fake(hello=False)
    started = time.monotonic()
    with pytest.raises(ConnectionFailed) as info:
        Client(fake.addr)
    assert time.monotonic() - started < 2
    assert "did not answer S" in str(info.value)


def test_a_node_that_goes_silent_is_probed_and_given_up(make_fake):
    """A connection with a request outstanding and nothing received is
    probed with S; no answer within the probe timeout and it is dead."""
    fake = make_fake()

    async def main() -> None:
        async with AsyncClient(fake.addr, redial_interval=60) as client:
            poll("both connections", lambda: len(fake.conns) == 2, 5)
            started = time.monotonic()
            with pytest.raises(ConnectionFailed) as info:
                await client.acquire("k", 5)  # no wait limit: still bounded
            took = time.monotonic() - started
            assert took < 3, took
            assert "probe" in str(info.value)
            # Each connection saw the acquire, then a probe.
            for c in fake.conns:
                assert c.line(1) == b"A k 5 0"
                assert c.line(1) == b"S"
            started = time.monotonic()
            with pytest.raises(ConnectionFailed):
                await client.release("k", 5)
            assert time.monotonic() - started < 6

    run(main())


def test_no_active_node_is_retried_then_reported(make_fake):
    fake = make_fake(max_conns=1)

    def answer_m() -> None:
        conn = fake.conn(0)
        try:
            while True:
                line = conn.line(15)
                conn.send(b"M " + line.split(b" ")[1] + b" -\n")
        except (AssertionError, OSError):
            pass

    t = threading.Thread(target=answer_m, daemon=True)
    t.start()
    with Client(fake.addr, redial_interval=60, no_active_timeout=1.0) as client:
        started = time.monotonic()
        with pytest.raises(NoActiveNode):
            client.acquire("k", 5)
        assert 0.9 < time.monotonic() - started < 3
    t.join(5)


def _grant_then_silence(fake, delay: float, seen: dict) -> None:
    """Answers the acquire of k with token 5 after ``delay`` (a grant that
    waited in the queue; probes meanwhile are answered), then answers
    nothing more; records when the acquire and the first renewal came."""
    conn = fake.conn(0)
    try:
        line = conn.line(5)
        seen["acquire"] = (time.monotonic(), line)
        until = time.monotonic() + delay
        while time.monotonic() < until:
            try:
                probe = conn.line(max(0.001, until - time.monotonic()))
            except AssertionError:
                break
            assert probe == b"S", probe
            conn.send(b"S active - 0\n")
        conn.send(b"A k 5\n")
        seen["granted"] = time.monotonic()
        while True:
            line = conn.line(10)
            if line.startswith(b"N ") and "renewal" not in seen:
                seen["renewal"] = time.monotonic()
    except (AssertionError, OSError):
        pass


@pytest.mark.parametrize("delay", [0.0, 3.0], ids=["granted_at_once", "granted_after_a_wait"])
def test_a_short_lease_is_lost_no_later_than_it_can_have_run_out(make_fake, delay):
    """A 1.2 s lease (under the request timeout plus a third of the lease),
    the node silent after the grant: granted at once, the loss comes when
    the lease could have run out, 1.2 s after the acquire was sent;
    granted after a wait (its deadline long past), the renewal sent at once
    has a third of the lease, 0.4 s, to be confirmed."""
    fake = make_fake(max_conns=1)
    seen: dict = {}
    t = threading.Thread(target=_grant_then_silence, args=(fake, delay, seen), daemon=True)

    async def main() -> None:
        async with AsyncClient(fake.addr, redial_interval=60) as client:
            t.start()
            lock = await client.lock("k", 1.2, wait=10)
            lost = await asyncio.wait_for(lock.wait_lost(), 5)
            at = time.monotonic()
            assert lost is not None and not lost.refused, lost
            if delay == 0.0:
                took = at - seen["acquire"][0]
                assert 1.15 < took < 1.45, f"lost {took:.3f}s after the acquire was sent"
                assert 0.35 < seen["renewal"] - seen["acquire"][0] < 0.6
            else:
                took = at - seen["granted"]
                assert 0.35 < took < 0.65, f"lost {took:.3f}s after the grant"
                assert seen["renewal"] - seen["granted"] < 0.2

    run(main())
    t.join(15)

