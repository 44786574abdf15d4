"""Faults on one real node: a cut connection, a release through an
outage, a stopped (SIGSTOP) node. No call may hang."""

from __future__ import annotations

import threading
import time

import pytest

from conftest import poll
from ringlock import Client, ConnectionFailed


def test_a_cut_connection_moves_the_waiting_acquire_and_is_redialled(server, make_proxy):
    proxy = make_proxy(server.addr)
    with Client(server.addr) as holder, Client(proxy.addr) as client:
        poll("two connections through the proxy", lambda: client.connected() == 2 and len(proxy.open_pairs()) == 2, 5)
        held = holder.lock("cut", lease=30, renew=False)
        result = {}

        def wait_for_it() -> None:
            try:
                result["grant"] = client.acquire("cut", 10, wait=15)
            except Exception as e:  # reported below
                result["error"] = e

        t = threading.Thread(target=wait_for_it)
        t.start()
        poll("the acquire went through the proxy", lambda: proxy.carrying(b"A cut 10 "), 5)
        assert proxy.cut_where(b"A cut 10 ") == 1
        # The acquire is sent again on the other connection, with what is
        # left of its wait (the server withdrew the first one).
        poll("the acquire sent again", lambda: any(b"A cut 10 " in p["sent"] for p in proxy.open_pairs()), 5)
        assert client.connected() == 1
        held.release()
        t.join(10)
        assert not t.is_alive()
        assert "error" not in result, result
        grant = result["grant"]
        assert grant is not None and grant.token > held.token
        # The cut connection is redialled in the background (every 3 s).
        poll("redialled", lambda: client.connected() == 2, 5)
        assert client.release("cut", grant.token) is True


def test_a_release_is_retried_through_an_outage(server, make_proxy):
    proxy = make_proxy(server.addr)
    with Client(proxy.addr) as client, Client(server.addr) as observer:
        grant = client.acquire("outage", 30)
        proxy.refuse = True
        proxy.cut_all()
        poll("connections down", lambda: client.connected() == 0, 5)

        def heal() -> None:
            # Let the release meet the outage for a while first.
            time.sleep(0.8)
            proxy.refuse = False

        healer = threading.Thread(target=heal)
        healer.start()
        started = time.monotonic()
        assert client.release("outage", grant.token) is True
        took = time.monotonic() - started
        healer.join()
        assert 0.7 < took < 5.5, took
        assert observer.try_lock("outage", 5) is not None


def test_a_release_gives_up_after_five_seconds(server, make_proxy):
    proxy = make_proxy(server.addr)
    with Client(proxy.addr) as client:
        grant = client.acquire("gone", 30)
        proxy.refuse = True
        proxy.cut_all()
        started = time.monotonic()
        with pytest.raises(ConnectionFailed):
            client.release("gone", grant.token)
        assert 4.5 < time.monotonic() - started < 6.5


def test_a_stopped_node_costs_bounded_time(server):
    with Client(server.addr) as client:
        held = client.lock("frozen", lease=30, renew=False)
        server.stop()  # SIGSTOP: connections stay open, nothing answers
        try:
            started = time.monotonic()
            with pytest.raises(ConnectionFailed) as info:
                # No wait limit, and still bounded: each connection is
                # probed and found dead (at most 1 s each), then the
                # acquire has tried every connection.
                client.acquire("other", 5)
            assert time.monotonic() - started < 2.5
            assert "probe" in str(info.value)
            started = time.monotonic()
            with pytest.raises(ConnectionFailed):
                client.acquire("other", 5, wait=1)  # ends by wait + grace
            assert time.monotonic() - started < 2.5
            started = time.monotonic()
            with pytest.raises(ConnectionFailed):
                held.release()
            assert time.monotonic() - started < 6.5
            # A new client does not get past the hello of a stopped node.
            started = time.monotonic()
            with pytest.raises(ConnectionFailed):
                Client(server.addr)
            assert time.monotonic() - started < 2
        finally:
            server.cont()
        with Client(server.addr) as fresh:
            assert fresh.release("frozen", held.token) is True
