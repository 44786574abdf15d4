"""Against a real three-node cluster: M followed to the active, failover
after a crash and after a hang, a graceful hand-off (SIGTERM), and a
failback (the crashed node restarts and takes the role back)."""

from __future__ import annotations

import signal
import threading
import time

from conftest import poll
from ringlock import Client


def test_m_is_followed_to_the_active(make_cluster):
    cluster = make_cluster(3)
    # Only a standby's address: its M names the active, which is dialled.
    with Client(cluster.addrs[2]) as client:
        grant = client.acquire("follow", 10, wait=5)
        assert grant is not None
        assert cluster.addrs[0] in client.addresses()
        assert client.release("follow", grant.token) is True


def test_failover_after_a_crash_keeps_a_renewed_lock(make_cluster):
    cluster = make_cluster(3)
    with Client(cluster.addrs) as client:
        lock = client.lock("survivor", lease=1.5)
        # Let the grant reach the standbys (replication is asynchronous).
        poll("replicated", lambda: all(cluster.node_status_token(i) >= lock.token for i in (1, 2)), 5)
        renewals = lock.renewals
        cluster.node(0).kill()  # SIGKILL
        cluster.wait_settled(1, alive=[1, 2])
        # Renewals go on on the new active, with the same token.
        poll("renewed on the new active", lambda: lock.renewals >= renewals + 3, 6)
        assert lock.lost is None
        other = client.try_lock("survivor", 5)
        assert other is None
        fresh = client.acquire("after", 5, wait=3)
        assert fresh is not None and fresh.token > lock.token
        assert lock.release() is True


def test_failover_from_a_hung_active_is_bounded(make_cluster):
    cluster = make_cluster(3)
    with Client(cluster.addrs) as client:
        before = client.acquire("warmup", 5)
        assert before is not None
        cluster.node(0).stop()  # SIGSTOP: the active hangs
        try:
            started = time.monotonic()
            grant = client.acquire("during-hang", 5, wait=5)
            took = time.monotonic() - started
            assert grant is not None and grant.token > before.token
            # Found dead by the probes (about 1 s), then the new active.
            assert took < 4, took
            assert cluster.settled_on(1, alive=[1, 2])
        finally:
            cluster.node(0).cont()


def test_graceful_hand_off_moves_waiting_acquires(make_cluster):
    cluster = make_cluster(3)
    with Client(cluster.addrs) as holder, Client(cluster.addrs) as waiter:
        held = holder.lock("handoff", lease=30, renew=False)
        result = {}

        def wait_for_it() -> None:
            try:
                result["grant"] = waiter.acquire("handoff", 10, wait=20)
            except Exception as e:
                result["error"] = e

        t = threading.Thread(target=wait_for_it)
        t.start()
        poll("waiting", lambda: waiter.pending_requests() == 1, 5)
        waiter.sync()
        poll("replicated", lambda: all(cluster.node_status_token(i) >= held.token for i in (1, 2)), 5)
        cluster.node(0).signal(signal.SIGTERM)
        assert cluster.node(0).wait(10) == 0
        cluster.wait_settled(1, alive=[1, 2])
        # The waiting acquire was answered M and sent again to node 1; the
        # grant was handed over, so its release works there.
        poll("the acquire re-sent to the new active", lambda: waiter.pending_requests() == 1, 5)
        assert holder.release("handoff", held.token) is True
        t.join(10)
        assert not t.is_alive()
        assert "error" not in result, result
        grant = result["grant"]
        assert grant is not None and grant.token > held.token
        assert waiter.release("handoff", grant.token) is True


def test_a_renewed_lock_survives_a_failback(make_cluster):
    """The active crashes, node 1 takes over; the crashed node restarts,
    follows node 1 and takes the role back by hand-off once it has been
    synced for the server's failback delay (--failback-delay-ms, 5 s by
    default, which these nodes keep). Renewals that meet M naming it are
    renewed there (the client dials a node an M names at once, if its 3 s
    redial has not reached it yet): the lock (lease 2 s) is kept."""
    cluster = make_cluster(3)
    with Client(cluster.addrs) as client:
        with client.lock("failback", lease=2) as lock:
            poll("replicated", lambda: all(cluster.node_status_token(i) >= lock.token for i in (1, 2)), 5)
            cluster.node(0).kill()  # SIGKILL
            cluster.wait_settled(1, alive=[1, 2])
            time.sleep(0.7)
            cluster.start_node(0)
            # The start-up wait, a snapshot, then the 5 s delay.
            cluster.wait_settled(0, within=15)
            renewals = lock.renewals
            # Longer than the lease after the hand-back.
            time.sleep(2.5)
            assert lock.lost is None
            assert lock.renewals >= renewals + 3
            assert client.try_lock("failback", 5, renew=False) is None
        fresh = client.acquire("failback", 5, wait=3)
        assert fresh is not None and fresh.token > lock.token
