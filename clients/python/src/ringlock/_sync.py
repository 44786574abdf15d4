"""The blocking client: the asyncio client run on a private event loop
thread, one per Client. Every call submits a coroutine to that loop and
waits for it; the coroutines carry the deadlines (docs/python.md,
"Timeouts"), so no call blocks longer than they allow."""

from __future__ import annotations

import asyncio
import concurrent.futures
import ssl
import threading
from typing import Any, Callable, Coroutine, Iterable, List, Optional, TypeVar, Union

from . import _proto
from ._aio import AddrStatus, AsyncClient, AsyncLock, Grant, LockInfo, NodeStatus, QueueInfo, node_problem as _anode_problem, node_status as _anode_status
from ._aio import list_locks as _alist_locks, lock_queue as _alock_queue, locks as _alocks
from ._proto import Key, Seconds
from ._tls import TlsConfig
from .errors import LockLost, RinglockError

__all__ = ["Client", "Lock", "node_status", "node_problem", "list_locks", "locks", "lock_queue"]

T = TypeVar("T")


class _LoopThread:
    """An event loop running on a daemon thread of its own."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def run(self, coro: "Coroutine[Any, Any, T]") -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RinglockError("a blocking ringlock call from the client's own event loop thread (an on_lost callback?) would deadlock")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result()
        except concurrent.futures.CancelledError:
            raise RinglockError("the client was closed during the call") from None
        except BaseException:
            # KeyboardInterrupt and the like: do not leave the call running.
            fut.cancel()
            raise

    def stop(self) -> None:
        """Cancels what still runs on the loop (calls blocked in other
        threads then raise), then stops it and joins the thread."""
        if self.loop.is_closed():
            return

        async def cancel_all() -> None:
            me = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not me]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            asyncio.get_running_loop().stop()

        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), self.loop)
        except RuntimeError:
            return
        if threading.current_thread() is not self._thread:
            self._thread.join(5)


class Client:
    """A blocking client of a ringlock node or cluster.

    ``addrs``: the cluster's ``--peers`` list (a list of ``host:port`` or one
    comma-separated string). Connects at construction (raises
    ConnectionFailed if no node can be reached within the connect timeout).
    Thread-safe: any number of threads may use one Client at once; their
    requests are pipelined on the shared connections. Keyword arguments are
    the timeouts of AsyncClient (docs/python.md, "Timeouts") and ``tls``, a
    TlsConfig (or an ``ssl.SSLContext``) for nodes that speak TLS.
    """

    def __init__(self, addrs: Union[str, Iterable[str]], **settings: Any) -> None:
        self._aclient = AsyncClient(addrs, **settings)
        self._thread = _LoopThread("ringlock-client")
        self._closed = False
        try:
            self._thread.run(self._aclient.connect())
        except BaseException:
            self._thread.stop()
            raise

    @property
    def timeouts(self) -> Any:
        return self._aclient.timeouts

    def _run(self, coro: "Coroutine[Any, Any, T]") -> T:
        if self._closed:
            coro.close()
            raise RinglockError("the client is closed")
        return self._thread.run(coro)

    def close(self) -> None:
        """Closes the connections and stops the client's thread."""
        if self._closed:
            return
        try:
            self._thread.run(self._aclient.close())
        finally:
            self._closed = True
            self._thread.stop()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- monitoring
    def addresses(self) -> List[str]:
        return self._aclient.addresses()

    def connected(self) -> int:
        return self._aclient.connected()

    def connections(self) -> int:
        return self._aclient.connections()

    def pending_requests(self) -> int:
        return self._aclient.pending_requests()

    # -- locks
    def acquire(
        self,
        key: Key,
        lease: Seconds,
        wait: Optional[Seconds] = None,
        *,
        shared: bool = False,
        permits: Optional[int] = None,
    ) -> Optional[Grant]:
        """See AsyncClient.acquire: a Grant, or None if the wait ran out.
        ``shared=True``: a read lock; ``permits=N``: one permit of a
        semaphore of N."""
        return self._run(self._aclient.acquire(key, lease, wait, shared=shared, permits=permits))

    def try_acquire(self, key: Key, lease: Seconds, *, shared: bool = False, permits: Optional[int] = None) -> Optional[Grant]:
        return self._run(self._aclient.try_acquire(key, lease, shared=shared, permits=permits))

    def release(self, key: Key, token: int) -> bool:
        return self._run(self._aclient.release(key, token))

    def renew(self, key: Key, token: int, lease: Seconds) -> bool:
        return self._run(self._aclient.renew(key, token, lease))

    def lock(
        self,
        key: Key,
        lease: Seconds = 30,
        wait: Optional[Seconds] = None,
        *,
        renew: bool = True,
        on_lost: Optional[Callable[[LockLost], None]] = None,
        shared: bool = False,
        permits: Optional[int] = None,
    ) -> "Lock":
        """Acquires ``key`` (waiting at most ``wait`` seconds, None: no limit)
        and gives a Lock; raises LockTimeout if the wait ran out. Use it as
        ``with client.lock(...) as lock:``. With ``renew`` (the default) the
        lease is renewed every third of it while the lock is held;
        ``on_lost`` is called (on the client's thread: keep it short, make
        no blocking ringlock call in it) if it is lost. ``shared`` and
        ``permits`` as for acquire."""
        call = self._aclient.lock(key, lease, wait, renew=renew, on_lost=on_lost, shared=shared, permits=permits)

        async def get() -> AsyncLock:
            return await call

        return Lock(self, self._run(get()))

    def try_lock(
        self,
        key: Key,
        lease: Seconds = 30,
        *,
        renew: bool = True,
        on_lost: Optional[Callable[[LockLost], None]] = None,
        shared: bool = False,
        permits: Optional[int] = None,
    ) -> "Optional[Lock]":
        """One attempt: a Lock, or None if someone else holds it."""
        alock = self._run(self._aclient.try_lock(key, lease, renew=renew, on_lost=on_lost, shared=shared, permits=permits))
        return None if alock is None else Lock(self, alock)

    def status(self) -> List[AddrStatus]:
        return self._run(self._aclient.status())

    def sync(self) -> None:
        self._run(self._aclient.sync())


class Lock:
    """A lock held (blocking API). ``token`` is the fencing token. The end of
    a ``with`` block releases it, and raises LockLost if it was lost while
    the block ran (and nothing else was raised)."""

    def __init__(self, client: Client, alock: AsyncLock) -> None:
        self._client = client
        self._alock = alock
        event = self._lost_event = threading.Event()
        state = alock._state

        # (The callback holds the event, not this object: the renewal task
        # holds the state, and a lock dropped unreleased must be collectable.)
        def signal(_: Optional[LockLost]) -> None:
            event.set()

        # Registered on the loop thread's state; the event is set when the
        # lock is lost, released or no longer renewed.
        state.callbacks.append(signal)
        if state.done.is_set():
            self._lost_event.set()

    @property
    def key(self) -> bytes:
        return self._alock.key

    @property
    def token(self) -> int:
        return self._alock.token

    @property
    def lease(self) -> float:
        return self._alock.lease

    @property
    def deadline(self) -> float:
        return self._alock.deadline

    @property
    def renewals(self) -> int:
        return self._alock.renewals

    @property
    def lost(self) -> Optional[LockLost]:
        return self._alock.lost

    def is_lost(self) -> bool:
        return self._alock.is_lost()

    def check(self) -> None:
        """Raises LockLost if the lock was lost: call it between steps of
        long work."""
        self._alock.check()

    def wait_lost(self, timeout: Optional[float] = None) -> Optional[LockLost]:
        """Blocks until the lock is lost (gives the LockLost), released
        (None), or ``timeout`` seconds passed (None)."""
        self._lost_event.wait(timeout)
        return self._alock.lost

    def renew(self, lease: Optional[Seconds] = None) -> bool:
        return self._client._run(self._alock.renew(lease))

    def release(self) -> bool:
        return self._client._run(self._alock.release())

    def detach(self) -> Grant:
        async def detach() -> Grant:
            return self._alock.detach()

        return self._client._run(detach())

    def __enter__(self) -> "Lock":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._client._run(self._alock.__aexit__(exc_type, exc, tb))

    def __repr__(self) -> str:
        return f"<Lock key={self.key.decode('utf-8', 'backslashreplace')!r} token={self.token} lost={self.is_lost()}>"


def node_status(addr: str, timeout: float = 3.0, *, tls: "Union[TlsConfig, ssl.SSLContext, None]" = None) -> NodeStatus:
    """One node's status (``S``) on a one-off connection (``timeout`` for the
    whole exchange, TLS handshake included; ``tls`` as for Client)."""
    _proto.split_addr(addr)
    return asyncio.run(_anode_status(addr, timeout, tls=tls))


def node_problem(addr: str, timeout: float = 3.0, *, tls: "Union[TlsConfig, ssl.SSLContext, None]" = None) -> Optional[str]:
    """One node's problem report (``H``) on a one-off connection; None: none.
    ``tls`` as for Client."""
    _proto.split_addr(addr)
    return asyncio.run(_anode_problem(addr, timeout, tls=tls))



def list_locks(addr: str, prefix: Key = b"", cursor: int = 0, limit: int = 1000, timeout: float = 3.0, *, tls: "Union[TlsConfig, ssl.SSLContext, None]" = None) -> "tuple[List[LockInfo], int]":
    """One page of a node's lock table with each lock's holder (``W``; ``L``
    from an older node, holders None): the locks and the next cursor (0:
    complete). ``tls`` as for Client."""
    _proto.split_addr(addr)
    return asyncio.run(_alist_locks(addr, prefix, cursor, limit, timeout, tls=tls))


def locks(addr: str, prefix: Key = b"", max: int = 10_000, timeout: float = 3.0, *, tls: "Union[TlsConfig, ssl.SSLContext, None]" = None) -> List[LockInfo]:
    """Every lock whose key starts with ``prefix`` (at most ``max``), page by
    page. ``tls`` as for Client."""
    _proto.split_addr(addr)
    return asyncio.run(_alocks(addr, prefix, max, timeout, tls=tls))


def lock_queue(addr: str, key: Key, timeout: float = 3.0, *, tls: "Union[TlsConfig, ssl.SSLContext, None]" = None) -> QueueInfo:
    """Who holds ``key`` and who waits for it (``Q``). ``tls`` as for Client."""
    _proto.split_addr(addr)
    return asyncio.run(_alock_queue(addr, key, timeout, tls=tls))
