"""The asyncio client: the core of the package (the blocking Client runs it
on a private event loop thread).

How it works (docs/protocol.md, "12. The official clients"; the same as
the Rust client, docs/client.md):

- One persistent connection per address (two when one address is given),
  each run by a task of its own: dial, hello (``S`` answered within the
  probe timeout), then a reader task and a liveness watch; when it ends, it
  is out of the rotation and redialled every ``redial_interval``.
- An ``M`` answer naming a node the client has no live connection to wakes
  that node's slot out of its redial wait: it is dialled now, and the
  request waits for that dial (one under way per slot at most; after a
  failed one, the next waits 50 ms, doubling up to 1 s).
- Requests are written at once (pipelined) and registered per key in send
  order; answers are matched by op and key (section 6 of the protocol).
- A connection with requests outstanding that received nothing for
  ``probe_interval`` sends ``S``; nothing received within ``probe_timeout``
  after that and it is dead: its acquires move on to the next connection.
"""

from __future__ import annotations

import asyncio
import collections
import math
import ssl
import time
import weakref
from dataclasses import dataclass
from typing import (
    Any,
    Awaitable,
    Callable,
    Deque,
    Dict,
    Generator,
    Iterable,
    List,
    Optional,
    TypeVar,
    Union,
)

from . import _proto
from ._proto import Answer, Key, MalformedAnswer, Seconds
from ._tls import TlsConfig, explain as _explain_tls, tls_config as _tls_config
from .errors import (
    ConnectionFailed,
    InvalidArgument,
    LockLost,
    LockTimeout,
    NoActiveNode,
    ProtocolError,
    broken_error,
    RinglockError,
    WrongKind,
)

__all__ = [
    "AsyncClient",
    "AsyncLock",
    "Grant",
    "NodeStatus",
    "AddrStatus",
    "Timeouts",
    "node_status",
    "node_problem",
    "HolderInfo",
    "LockInfo",
    "QueueInfo",
    "list_locks",
    "locks",
    "lock_queue",
]

#: A cluster has at most 16 nodes: addresses named by ``M`` answers beyond
#: that many are not followed.
MAX_REDIRECT_ADDRS = 16
#: After a dial that an ``M`` answer asked for failed, the next one for the
#: same slot waits this long, doubling while they keep failing...
KICK_BACKOFF_MIN = 0.05
#: ... up to this.
KICK_BACKOFF_MAX = 1.0


def _now() -> float:
    return time.monotonic()


def _show(key: bytes) -> str:
    return key.decode("utf-8", "backslashreplace")


T = TypeVar("T")


async def _wait_for(aw: "Awaitable[T]", timeout: float) -> T:
    """``asyncio.wait_for`` without its flaw before Python 3.12: there, a
    cancellation that arrives just as the awaited thing completes is
    swallowed (CPython issue 86296). An acquire whose deadline (its wait plus
    the grace) fired while it waited for a connection to come up, in the
    same turn of the loop as a redial or a dropped connection woke that
    wait, then ran on until the connect timeout (3 s) instead. Here a
    cancellation always propagates; when ``timeout`` runs out the awaited
    thing is cancelled and ``asyncio.TimeoutError`` raised (or its result
    returned, if it finished regardless)."""
    loop = asyncio.get_running_loop()
    fut = asyncio.ensure_future(aw)
    waiter: "asyncio.Future[None]" = loop.create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    handle = loop.call_later(max(0.0, timeout), wake)
    fut.add_done_callback(wake)
    try:
        await waiter
    except asyncio.CancelledError:
        fut.cancel()
        raise
    finally:
        handle.cancel()
        fut.remove_done_callback(wake)
    if not fut.done():
        fut.cancel()
        await asyncio.wait({fut})
        if fut.cancelled():
            raise asyncio.TimeoutError()
    return fut.result()


@dataclass(frozen=True)
class Timeouts:
    """Every deadline of the client, in seconds (docs/python.md, "Timeouts")."""

    connect_timeout: float = 3.0
    probe_interval: float = 0.5
    probe_timeout: float = 0.5
    acquire_grace: float = 1.0
    request_timeout: float = 2.0
    retry_every: float = 0.2
    retry_for: float = 5.0
    redial_interval: float = 3.0
    no_active_timeout: float = 10.0

    def __post_init__(self) -> None:
        for name, value in self.__dict__.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise InvalidArgument(f"{name} must be a positive number of seconds, not {value!r}")


@dataclass(frozen=True)
class Grant:
    """A lock held: its key, fencing token, lease, and the deadline (on
    ``time.monotonic()``) by which the lease runs out at the latest as far as
    the client can tell (sending time of the acquire or last renewal, plus
    the lease)."""

    key: bytes
    token: int
    lease: float
    deadline: float

    def remaining(self) -> float:
        return max(0.0, self.deadline - _now())


@dataclass(frozen=True)
class NodeStatus:
    """A node's answer to ``S``: its role, the active node it names (None: it
    knows none) and the highest token it issued or saw."""

    role: str
    active: Optional[str]
    token: int


@dataclass(frozen=True)
class HolderInfo:
    """Who holds a lock, or waits for one: what the node knows of the
    connection that asked. ``addr``: its address as the node saw it
    (``host:port``; None if not known, a grant replicated by an older
    node); ``owner``: its owner label (None: it set none); ``seconds``: how
    long it has held the lock (a waiter: waited)."""

    addr: Optional[str]
    owner: Optional[str]
    seconds: float


@dataclass(frozen=True)
class LockInfo:
    """One lock of a node's table (``list_locks``). ``token``: the holder's
    fencing token, 0 when nobody holds it; ``lease_left``: seconds;
    ``waiters``: acquires waiting; ``holder``: None from a node older than
    the ``W`` request (or when nobody holds it)."""

    key: bytes
    token: int
    lease_left: float
    waiters: int
    holder: Optional[HolderInfo]


@dataclass(frozen=True)
class QueueInfo:
    """One key's queue (``lock_queue``): its lock with the holder (None: the
    key has no lock), the first waiters (at most 100) oldest first, and how
    many wait in all."""

    lock: Optional[LockInfo]
    waiters: List[HolderInfo]
    waiting: int


@dataclass(frozen=True)
class AddrStatus:
    """``status()`` gives one per address: a status or the error."""

    addr: str
    status: Optional[NodeStatus]
    error: Optional[RinglockError]


# Failure replies handed to waiting requests (server answers are Answer).
class _Lost:
    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why


class _Broken:
    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why


Reply = Union[Answer, _Lost, _Broken]


class _Request:
    __slots__ = ("op", "key", "line", "fut", "probe", "permit")

    def __init__(self, op: str, key: bytes, line: bytes, fut: "Optional[asyncio.Future[Reply]]", probe: bool = False, permit: bool = False) -> None:
        self.op = op
        self.key = key
        self.line = line
        self.fut = fut
        self.probe = probe
        self.permit = permit


class _OwnerRefused(Exception):
    """The node answered E to ``O``: it predates owner labels."""


class _End(Exception):
    def __init__(self, why: str, protocol: bool) -> None:
        super().__init__(why)
        self.why = why
        self.protocol = protocol


class _Conn:
    """One live connection: pending requests by key in send order, the
    reader, the liveness watch, and the local queue of waiting acquires."""

    def __init__(self, client: "AsyncClient", addr: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.client = client
        self.addr = addr
        self.reader = reader
        self.writer = writer
        self.by_key: Dict[bytes, Deque[_Request]] = {}
        self.status: Deque[_Request] = collections.deque()
        self.outstanding = 0
        self.last_rx = _now()
        self.probe_at: Optional[float] = None
        self.busy = asyncio.Event()
        self.closed = False
        self.acq_free = client._max_waiting
        self.acq_waiters: "Deque[asyncio.Future[bool]]" = collections.deque()
        self.out: List[bytes] = []
        self.flush_scheduled = False

    # -- local queueing of waiting acquires (at most max_waiting per conn)
    def try_take_slot(self) -> bool:
        if not self.closed and self.acq_free > 0 and not self.acq_waiters:
            self.acq_free -= 1
            return True
        return False

    async def take_slot(self) -> bool:
        """Waits for room for one more acquire; False if the connection
        closed meanwhile."""
        if self.try_take_slot():
            return True
        if self.closed:
            return False
        fut: "asyncio.Future[bool]" = asyncio.get_running_loop().create_future()
        self.acq_waiters.append(fut)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.result():
                self.give_slot()
            raise

    def give_slot(self) -> None:
        while self.acq_waiters:
            fut = self.acq_waiters.popleft()
            if not fut.done():
                fut.set_result(True)
                return
        self.acq_free += 1

    # -- requests
    def submit(self, req: _Request) -> bool:
        if self.closed or self.writer.is_closing():
            return False
        if req.op == "S":
            self.status.append(req)
        else:
            queue = self.by_key.get(req.key)
            if queue is None:
                queue = self.by_key[req.key] = collections.deque()
            queue.append(req)
        was_idle = self.outstanding == 0 and not self.out
        if not req.probe:
            self.outstanding += 1
            if self.outstanding == 1:
                self.busy.set()
        if was_idle:
            # Nothing to batch with: out at once.
            try:
                self.writer.write(req.line)
            except Exception:  # a transport that just failed: the reader will see it
                pass
            return True
        # Coalesced: every further request submitted in this turn of the
        # event loop goes out in one write (one system call, not one each).
        self.out.append(req.line)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return True

    def _flush(self) -> None:
        self.flush_scheduled = False
        if not self.out or self.closed:
            self.out.clear()
            return
        data = b"".join(self.out)
        self.out.clear()
        try:
            self.writer.write(data)
        except Exception:  # a transport that just failed: the reader will see it
            pass

    async def call(self, op: str, key: bytes, line: bytes, permit: bool = False) -> Reply:
        fut: "asyncio.Future[Reply]" = asyncio.get_running_loop().create_future()
        if not self.submit(_Request(op, key, line, fut, permit=permit)):
            if permit:
                self.give_slot()
            return _Lost(f"{self.addr}: the connection closed")
        return await fut

    def _take(self, key: bytes, op: Optional[str]) -> Optional[_Request]:
        queue = self.by_key.get(key)
        if not queue:
            return None
        if op is None:
            req = queue.popleft()
        else:
            for i, r in enumerate(queue):
                if r.op == op:
                    req = r
                    del queue[i]
                    break
            else:
                return None
        if not queue:
            del self.by_key[key]
        return req

    def _answer(self, req: _Request, reply: Reply) -> None:
        if not req.probe:
            self.outstanding -= 1
        if req.permit:
            self.give_slot()
        fut = req.fut
        if fut is None:
            return
        if fut.done():
            # Whoever asked is gone (cancelled): do not leave a grant held
            # until its lease runs out.
            if isinstance(reply, Answer) and reply.op in ("A", "G", "C") and isinstance(reply.value, int) and reply.value > 0:
                self.client._release_in_background(reply.key, reply.value)
            return
        fut.set_result(reply)

    def dispatch(self, line: bytes) -> None:
        """Hands one answer line to the request it answers; raises _End on
        an ``E``, a malformed line or an answer matching nothing."""
        self.last_rx = _now()
        self.probe_at = None
        try:
            ans = _proto.parse_answer(line)
        except MalformedAnswer as e:
            raise _End(f"{self.addr}: {e}", True) from None
        if ans.op == "E":
            raise _End(f"{self.addr} says: E {ans.key.decode('ascii', 'backslashreplace')}", True)
        if ans.op in ("A", "T"):
            req = self._take(ans.key, "A")
        elif ans.op == "M":
            req = self._take(ans.key, None)
        elif ans.op in ("R", "N", "G", "C"):
            req = self._take(ans.key, ans.op)
        elif ans.op == "S":
            req = self.status.popleft() if self.status else None
        else:  # H: never sent on a pooled connection
            req = None
        if req is None:
            raise _End(f"{self.addr}: answer {line[:200]!r} matches no pending request", True)
        self._answer(req, ans)

    async def _read_loop(self) -> _End:
        while True:
            try:
                line = await self.reader.readuntil(b"\n")
            except asyncio.IncompleteReadError as e:
                if e.partial:
                    return _End(f"{self.addr} closed the connection mid-line", False)
                return _End(f"{self.addr} closed the connection", False)
            except asyncio.LimitOverrunError:
                return _End(f"answer line from {self.addr} longer than {_proto.MAX_ANSWER_LINE} bytes", True)
            except (OSError, EOFError) as e:
                return _End(f"read from {self.addr}: {_explain_tls(e) or e}", False)
            try:
                self.dispatch(line[:-1])
            except _End as end:
                return end
            except Exception as e:  # defence in depth: a bug here must not kill the slot
                return _End(f"{self.addr}: answer {line[:200]!r} could not be handled: {e!r}", True)

    async def _liveness(self) -> _End:
        t = self.client.timeouts
        while True:
            now = _now()
            if self.probe_at is not None:
                dead_at = self.probe_at + t.probe_timeout
                if now >= dead_at:
                    return _End(f"{self.addr} stopped answering: no answer to a probe within {t.probe_timeout:g}s", False)
                await asyncio.sleep(dead_at - now)
            elif self.outstanding == 0:
                self.busy.clear()
                await self.busy.wait()
            else:
                # Silence counts from the last answer: a request sent on a
                # connection quiet for the interval is probed at once.
                probe_at = self.last_rx + t.probe_interval
                if now >= probe_at:
                    self.probe_at = now
                    self.submit(_Request("S", b"", b"S\n", None, probe=True))
                    await asyncio.sleep(t.probe_timeout)
                else:
                    await asyncio.sleep(probe_at - now)

    async def serve(self) -> str:
        """Runs the connection until it ends; returns why."""
        reader = asyncio.ensure_future(self._read_loop())
        watch = asyncio.ensure_future(self._liveness())
        end = _End("the client was closed", False)
        try:
            done, _ = await asyncio.wait({reader, watch}, return_when=asyncio.FIRST_COMPLETED)
            # The reader first: answers already received count before the
            # liveness watch judges the connection.
            task = reader if reader in done else watch
            try:
                end = task.result()
            except Exception as e:  # defence in depth
                end = _End(f"{self.addr}: connection failed: {e!r}", True)
        finally:
            for task in (reader, watch):
                task.cancel()
            self._finish(end)
        return end.why

    def _finish(self, end: _End) -> None:
        """Out of the rotation first, so that retries go elsewhere; then
        fail what was waiting here."""
        self.closed = True
        try:
            self.writer.close()
        except Exception:
            pass
        pending: List[_Request] = list(self.status)
        for queue in self.by_key.values():
            pending.extend(queue)
        self.status.clear()
        self.by_key.clear()
        self.outstanding = 0
        reply: Reply = _Broken(end.why) if end.protocol else _Lost(end.why)
        for req in pending:
            if req.fut is not None and not req.fut.done():
                req.fut.set_result(reply)
        while self.acq_waiters:
            fut = self.acq_waiters.popleft()
            if not fut.done():
                fut.set_result(False)


class _Slot:
    """One address's connection, dialled and redialled in the background,
    or at once when an ``M`` answer names it (``dial_now``)."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        #: The node answered E to the owner label (a server older than it).
        self.owner_refused = False
        self.live: Optional[_Conn] = None
        self.last_error: Optional[str] = None
        self.failures = 0
        self.dialing_since: Optional[float] = None
        self.task: "Optional[asyncio.Task[None]]" = None
        # Dials started and ended so far (the one under way is ``started``).
        self.started = 0
        self.ended = 0
        # A redirect asked for a dial not started yet.
        self.kicked = False
        self.kick = asyncio.Event()
        # Redirect dials that failed in a row (a connection one made that
        # lasted less than KICK_BACKOFF_MAX counts as failed; one that lasted
        # longer resets this), and when the last one ended.
        self.kick_failures = 0
        self.kick_failed_at: Optional[float] = None

    def dial_now(self) -> Optional[int]:
        """An ``M`` named this slot's node and it has no connection: dial it
        now rather than at the next redial tick. Gives the number of the
        dial that decides (the one under way, or the next), or None if a
        redirect dial failed too recently (the request backs off instead)."""
        if self.dialing_since is not None:
            return self.started
        if self.kicked:
            return self.started + 1
        if self.kick_failed_at is not None:
            gap = min(KICK_BACKOFF_MIN * 2 ** min(self.kick_failures - 1, 8), KICK_BACKOFF_MAX)
            if _now() < self.kick_failed_at + gap:
                return None
        self.kicked = True
        self.kick.set()
        return self.started + 1


class _AcqState:
    __slots__ = ("doing", "asking", "failure")

    def __init__(self) -> None:
        self.doing = "connecting"  # connecting | queueing | asking | redirected
        self.asking = ""
        self.failure: Optional[RinglockError] = None


class _Moves:
    """Bounds the time spent following ``M`` answers for one request."""

    def __init__(self, bound: float) -> None:
        self.first: Optional[float] = None
        self.named: List[str] = []
        self.bound = bound
        self.backoff = 0.05

    async def moved(self, client: "AsyncClient", to: Optional[str]) -> bool:
        """Handles one ``M``; True: the named node is up (see ``_follow``)."""
        if self.first is None:
            self.first = _now()
        first = self.first
        if _now() - first >= self.bound:
            raise NoActiveNode(f"no active node: the cluster kept redirecting or answered 'no active node' for {self.bound:g}s")
        news = to is not None and to not in self.named and len(self.named) <= MAX_REDIRECT_ADDRS
        if news:
            self.named.append(to)  # type: ignore[arg-type]
        else:
            left = max(0.0, self.bound - (_now() - first))
            await asyncio.sleep(min(self.backoff, left))
            self.backoff = min(self.backoff * 2, 1.0)
        if to is None:
            return False
        left = max(0.0, self.bound - (_now() - first))
        return await client._follow(to, min(left, client.timeouts.connect_timeout))


def _split_addrs(addrs: Union[str, Iterable[str]]) -> List[str]:
    if isinstance(addrs, str):
        items = [a.strip() for a in addrs.split(",")]
    else:
        items = [str(a).strip() for a in addrs]
    out: List[str] = []
    for a in items:
        if not a:
            continue
        _proto.split_addr(a)
        if a not in out:
            out.append(a)
    if not out:
        raise InvalidArgument("no server address given")
    return out


class AsyncClient:
    """A client of a ringlock node or cluster, for asyncio.

    ``addrs``: the cluster's ``--peers`` list (a list of ``host:port``, or one
    comma-separated string), spelled as the nodes spell it. Use it as
    ``async with AsyncClient(addrs) as client:`` or ``client = await
    AsyncClient(addrs).connect()`` ... ``await client.close()``.

    ``tls``: a TlsConfig (or an ``ssl.SSLContext``) for nodes that speak TLS;
    None (the default): plain text.
    """

    def __init__(
        self,
        addrs: Union[str, Iterable[str]],
        *,
        connect_timeout: float = 3.0,
        probe_interval: float = 0.5,
        probe_timeout: float = 0.5,
        acquire_grace: float = 1.0,
        request_timeout: float = 2.0,
        retry_every: float = 0.2,
        retry_for: float = 5.0,
        redial_interval: float = 3.0,
        no_active_timeout: float = 10.0,
        max_waiting_acquires: int = 4096,
        tls: "Union[TlsConfig, ssl.SSLContext, None]" = None,
        owner: Optional[str] = None,
    ) -> None:
        self._addrs = _split_addrs(addrs)
        self._owner = None if owner is None else _proto.check_owner(owner)
        self.tls = _tls_config(tls)
        self.timeouts = Timeouts(
            connect_timeout=connect_timeout,
            probe_interval=probe_interval,
            probe_timeout=probe_timeout,
            acquire_grace=acquire_grace,
            request_timeout=request_timeout,
            retry_every=retry_every,
            retry_for=retry_for,
            redial_interval=redial_interval,
            no_active_timeout=no_active_timeout,
        )
        if not isinstance(max_waiting_acquires, int) or not 1 <= max_waiting_acquires <= 4096:
            raise InvalidArgument("max_waiting_acquires must be from 1 to 4096")
        self._max_waiting = max_waiting_acquires
        self._slots: List[_Slot] = []
        self._rr = 0
        self._active: Optional[str] = None
        self._changed: Optional[asyncio.Event] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._closed = False
        self._background: "set[asyncio.Task[Any]]" = set()

    # -- life cycle
    async def connect(self) -> "AsyncClient":
        """Starts the connections and returns once one is up. Raises
        ConnectionFailed if every address failed its first dial, or none
        connected within the connect timeout."""
        if self._loop is not None:
            return self
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        addrs = self._addrs * 2 if len(self._addrs) == 1 else self._addrs
        for addr in addrs:
            self._add_slot(addr)
        until = _now() + self.timeouts.connect_timeout
        while True:
            changed = self._changed
            if any(s.live for s in self._slots):
                return self
            if all(s.failures > 0 for s in self._slots):
                await self.close()
                raise ConnectionFailed(self._why_no_connection())
            left = until - _now()
            if left <= 0:
                await self.close()
                raise ConnectionFailed(f"no connection within {self.timeouts.connect_timeout:g}s: {self._why_no_connection()}")
            try:
                await _wait_for(changed.wait(), left)
            except asyncio.TimeoutError:
                pass

    async def close(self) -> None:
        """Closes every connection; requests still waiting fail."""
        if self._closed:
            return
        self._closed = True
        self._bump()  # callers waiting for a connection see the close
        tasks = [s.task for s in self._slots if s.task is not None]
        tasks.extend(self._background)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def __aenter__(self) -> "AsyncClient":
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- monitoring
    def addresses(self) -> List[str]:
        out: List[str] = []
        for s in self._slots:
            if s.addr not in out:
                out.append(s.addr)
        return out

    def connected(self) -> int:
        """Connections up right now."""
        return sum(1 for s in self._slots if s.live is not None)

    def connections(self) -> int:
        """Connections the client keeps (up or being redialled)."""
        return len(self._slots)

    def pending_requests(self) -> int:
        """Requests written and not yet answered (probes not counted)."""
        return sum(s.live.outstanding for s in self._slots if s.live is not None)

    # -- connections
    def _bump(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    def _add_slot(self, addr: str) -> _Slot:
        slot = _Slot(addr)
        self._slots.append(slot)
        slot.task = asyncio.ensure_future(self._run_slot(slot))
        return slot

    async def _run_slot(self, slot: _Slot) -> None:
        t = self.timeouts
        while not self._closed:
            dialed_at = _now()
            slot.dialing_since = dialed_at
            slot.started += 1
            kicked, slot.kicked = slot.kicked, False
            try:
                conn = await self._dial_slot(slot)
            except Exception as e:  # _End, or anything: never let the slot's task die
                slot.dialing_since = None
                slot.ended = slot.started
                slot.last_error = e.why if isinstance(e, _End) else f"connect to {slot.addr}: {e!r}"
                slot.failures += 1
                if kicked:
                    slot.kick_failures += 1
                    slot.kick_failed_at = _now()
            else:
                slot.dialing_since = None
                slot.ended = slot.started
                if self._closed:
                    # close() cancelled this task as the dial finished: on
                    # Python before 3.12, asyncio.wait_for then returns the
                    # result and drops the cancellation. Serving now would
                    # wait for ever on a healthy idle connection.
                    conn.writer.close()
                    return
                slot.live = conn
                self._bump()
                up_at = _now()
                try:
                    why = await conn.serve()
                except Exception as e:
                    why = f"{slot.addr}: connection failed: {e!r}"
                finally:
                    slot.live = None
                slot.last_error = why
                if _now() - up_at >= KICK_BACKOFF_MAX:
                    slot.kick_failures = 0
                    slot.kick_failed_at = None
                elif kicked:
                    # A node that answers the hello and drops the connection
                    # does not get a dial per M.
                    slot.kick_failures += 1
                    slot.kick_failed_at = _now()
            self._bump()
            # The next dial: at the redial tick, or at once if an M names
            # this node meanwhile.
            redial_at = dialed_at + t.redial_interval
            while not slot.kicked:
                left = redial_at - _now()
                if left <= 0:
                    break
                slot.kick.clear()
                try:
                    await _wait_for(slot.kick.wait(), left)
                except asyncio.TimeoutError:
                    break

    async def _dial_slot(self, slot: _Slot) -> _Conn:
        """``_dial`` with the owner label, unless the node refused it: a node
        that answers E to ``O`` (a server older than owner labels) is dialled
        again at once without it, and so from then on."""
        owner = None if slot.owner_refused else self._owner
        try:
            return await self._dial(slot.addr, owner)
        except _OwnerRefused:
            slot.owner_refused = True
            return await self._dial(slot.addr, None)

    async def _dial(self, addr: str, owner: Optional[bytes] = None) -> _Conn:
        """Dials ``addr`` and checks that the node answers ``S`` within the
        probe timeout: a node that accepts connections but is hung never
        gets a request. With an ``owner``, ``O <owner>`` goes first, and its
        answer must come before the ``S`` one."""
        t = self.timeouts
        try:
            reader, writer = await _wait_for(_open(addr, _proto.MAX_ANSWER_LINE, self.tls, t.connect_timeout), t.connect_timeout)
        except asyncio.TimeoutError:
            raise _End(f"connect to {addr}: {_timed_out(self.tls, t.connect_timeout)}", False) from None
        except (OSError, ValueError, UnicodeError) as e:
            raise _End(f"connect to {addr}: {_explain_tls(e) or e}", False) from None
        try:
            writer.write((b"" if owner is None else b"O " + owner + b"\n") + b"S\n")
            if owner is not None:
                line = await _wait_for(reader.readuntil(b"\n"), t.probe_timeout)
                if line.startswith(b"E "):
                    raise _OwnerRefused()
                if line[:-1].rstrip(b"\r") != b"O " + owner:
                    raise MalformedAnswer(f"answer to O: {line[:200]!r}")
            line = await _wait_for(reader.readuntil(b"\n"), t.probe_timeout)
            ans = _proto.parse_answer(line[:-1])
        except asyncio.TimeoutError:
            writer.close()
            raise _End(f"{addr} accepted the connection but did not answer S within {t.probe_timeout:g}s (hung?)", False) from None
        except (OSError, EOFError, asyncio.LimitOverrunError, MalformedAnswer) as e:
            writer.close()
            # With TLS 1.3 a refused client certificate shows at the first read.
            why = _explain_tls(e)
            if why is not None:
                raise _End(f"read from {addr}: {why}", False) from None
            raise _End(f"{addr} did not answer S properly: {e}", False) from None
        except BaseException:
            # _OwnerRefused too: the node closes after its E.
            writer.close()
            raise
        if ans.op == "S":
            return _Conn(self, addr, reader, writer)
        writer.close()
        if ans.op == "E":
            raise _End(f"{addr} refused the connection: {_refusal(ans.key)}", False)
        raise _End(f"{addr} answered S with {line[:200]!r}: not a ringlock node?", False)

    def _pick(self, addr: Optional[str] = None) -> Optional[_Conn]:
        """A live connection: round-robin over the preferred (active) node's
        connections if it has any up, else over all. With ``addr``, only
        that address's."""
        slots = self._slots
        n = len(slots)
        if n == 0:
            return None
        start = self._rr
        self._rr += 1
        want = addr if addr is not None else self._active
        if want is not None:
            for i in range(n):
                s = slots[(start + i) % n]
                if s.addr == want and s.live is not None and not s.live.closed:
                    return s.live
            if addr is not None:
                return None
        for i in range(n):
            s = slots[(start + i) % n]
            if s.live is not None and not s.live.closed:
                return s.live
        return None

    async def _wait_live(self, addr: Optional[str], within: float) -> Optional[_Conn]:
        self._check_open()
        until = _now() + within
        while True:
            changed = self._changed
            if self._closed:
                raise RinglockError("the client is closed")
            conn = self._pick(addr)
            if conn is not None:
                return conn
            left = until - _now()
            if left <= 0 or changed is None:
                return None
            try:
                await _wait_for(changed.wait(), left)
            except asyncio.TimeoutError:
                return self._pick(addr)

    async def _follow(self, addr: str, within: float) -> bool:
        """Follows an ``M`` naming ``addr``: makes it the preferred node and
        waits up to ``within`` for a live connection to it. A node with no
        live connection is dialled now (a new address gets a slot; a known
        one's slot is woken out of its redial wait, see ``_Slot.dial_now``)
        and the request waits for that dial, hello included. If it fails
        (or a redirect dial failed too recently), the preference is dropped
        and the request goes on by its own back-off."""
        mine = [s for s in self._slots if s.addr == addr]
        if any(s.live is not None for s in mine):
            self._active = addr
            return True
        if not mine:
            if len(self.addresses()) - len(self._addrs) >= MAX_REDIRECT_ADDRS:
                return False
            try:
                _proto.split_addr(addr)
            except InvalidArgument:
                return False
            slot = self._add_slot(addr)
            n: Optional[int] = 1
        else:
            slot = next((s for s in mine if s.dialing_since is not None), mine[0])
            n = slot.dial_now()
            if n is None:
                return False
        self._active = addr
        if await self._wait_dial(slot, n, within) is not None:
            return True
        if self._active == addr:
            self._active = None
        return False

    async def _wait_dial(self, slot: _Slot, n: int, within: float) -> Optional[_Conn]:
        """Waits up to ``within`` for a live connection to ``slot``'s address,
        or until its dial number ``n`` ended without one."""
        until = _now() + within
        while True:
            changed = self._changed
            if self._closed:
                raise RinglockError("the client is closed")
            conn = self._pick(slot.addr)
            if conn is not None:
                return conn
            if slot.ended >= n:
                return None
            left = until - _now()
            if left <= 0 or changed is None:
                return None
            try:
                await _wait_for(changed.wait(), left)
            except asyncio.TimeoutError:
                return self._pick(slot.addr)

    def _unreached(self, addr: str) -> ConnectionFailed:
        """The error of an acquire redirected to ``addr`` that could not
        reach it."""
        why = next((s.last_error for s in self._slots if s.addr == addr and s.last_error), None)
        return ConnectionFailed(f"redirected to {addr}, which could not be reached ({why or addr + ': not connected yet'})")

    def _why_no_connection(self) -> str:
        errors: List[str] = []
        for s in self._slots:
            why = s.last_error
            if why is None and s.dialing_since is not None:
                # The first dial, under way: say for how long.
                what = "TCP connection and TLS handshake" if self.tls is not None else "TCP connection"
                why = f"connect to {s.addr}: {what} not finished after {_now() - s.dialing_since:.1f}s"
                if self.tls is not None:
                    why += " (a stalled node, or a port that does not speak TLS?)"
            if why is None:
                why = f"{s.addr}: not connected yet"
            if why not in errors:
                errors.append(why)
        return f"no live connection ({'; '.join(errors)})"

    def _check_open(self) -> None:
        if self._loop is None:
            raise RinglockError("the client is not connected: use 'async with AsyncClient(...)' or 'await client.connect()'")
        if self._closed:
            raise RinglockError("the client is closed")

    def _release_in_background(self, key: bytes, token: int) -> None:
        if self._closed or self._loop is None:
            return

        async def release() -> None:
            try:
                await self.release(key, token)
            except Exception:
                pass

        task = asyncio.ensure_future(release())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- locks
    async def acquire(
        self,
        key: Key,
        lease: Seconds,
        wait: Optional[Seconds] = None,
        *,
        shared: bool = False,
        permits: Optional[int] = None,
    ) -> Optional[Grant]:
        """Acquires ``key`` for ``lease`` seconds, waiting in the queue at most
        ``wait`` seconds (None: no limit). Returns the Grant, or None if the
        wait ran out (nothing is held).

        By default the key is held alone (exclusive). ``shared=True`` holds
        it beside other shared holders (a read lock; it waits behind a
        waiting exclusive acquire); ``permits=N`` takes one of at most N
        permits of the key (a counting semaphore, N from 1 to 65536). Each
        kind's grant has its own token and is released and renewed alike.

        With a wait, the call ends by the wait plus the acquire grace (1 s)
        whatever the nodes do. Raises ConnectionFailed, NoActiveNode,
        ProtocolError, InvalidArgument, and WrongKind when the key is held
        or waited for as another kind (nothing changed).
        """
        k = _proto.check_key(key)
        lms = _proto.lease_ms(lease)
        wms = _proto.wait_ms(wait)
        return await self._acquire(k, lms, wms, _proto.check_kind(shared, permits))

    async def _acquire(self, k: bytes, lms: int, wms: int, kind: "tuple[str, int]" = ("A", 0)) -> Optional[Grant]:
        self._check_open()
        started = _now()
        state = _AcqState()
        if wms == 0:
            return await self._acquire_loop(k, lms, 0, started, state, kind)
        t = self.timeouts
        wait = wms / 1000
        try:
            return await _wait_for(self._acquire_loop(k, lms, wms, started, state, kind), wait + t.acquire_grace)
        except asyncio.TimeoutError:
            within = f"{wait + t.acquire_grace:g}s (its wait, {wait:g}s, plus {t.acquire_grace:g}s of grace)"
            if state.doing == "asking":
                raise ConnectionFailed(f"{state.asking} did not answer the acquire of {_show(k)} within {within}") from None
            if state.doing == "connecting":
                raise ConnectionFailed(f"no connection within {within}: {self._why_no_connection()}") from None
            if state.doing == "redirected":
                raise (state.failure or NoActiveNode()) from None
            return None

    async def _acquire_loop(self, key: bytes, lms: int, wms: int, started: float, state: _AcqState, kind: "tuple[str, int]") -> Optional[Grant]:
        op, limit = kind
        t = self.timeouts
        total = wms / 1000

        def ran_out() -> Optional[Grant]:
            if state.failure is not None:
                raise state.failure
            return None

        failed = 0
        asked = False
        moves = _Moves(t.no_active_timeout)
        while True:
            state.doing = "connecting"
            conn = await self._wait_live(None, t.connect_timeout)
            if conn is None:
                raise ConnectionFailed(self._why_no_connection())
            # Local queueing: wait for room on this connection (within the
            # wait, if there is one).
            state.doing = "queueing"
            if conn.try_take_slot():
                ok = True
            elif wms == 0:
                ok = await conn.take_slot()
            else:
                left = started + total - _now()
                if left <= 0:
                    return ran_out()
                try:
                    ok = await _wait_for(conn.take_slot(), left)
                except asyncio.TimeoutError:
                    return ran_out()
            if not ok:
                failed += 1
                why = f"{conn.addr}: the connection closed"
                if failed >= self.connections():
                    raise self._cut_off(failed, why)
                state.failure = ConnectionFailed(why)
                continue
            # The wait is the server's to count: the first attempt always
            # goes out (with at least the shortest wait), however long
            # finding a connection took, so that a free key is granted
            # rather than reported held. Later attempts carry what is left.
            if wms == 0:
                wait_now = 0
            else:
                elapsed = _now() - started
                if elapsed < total:
                    wait_now = max(1, math.ceil((total - elapsed) * 1000 - 1e-6))
                elif asked:
                    conn.give_slot()
                    return ran_out()
                else:
                    wait_now = 1
            asked = True
            line = _proto.acquire_kind_line(op, key, limit, lms, wait_now)
            sent = _now()
            state.doing = "asking"
            state.asking = conn.addr
            reply = await conn.call(op, key, line, permit=True)
            if isinstance(reply, Answer):
                if reply.op == op and op != "A":
                    if isinstance(reply.value, tuple):
                        raise _wrong_kind(key, op, reply.value)
                    if reply.value == 0:
                        return None
                    lease = lms / 1000
                    return Grant(key, int(reply.value), lease, sent + lease)  # type: ignore[call-overload]
                if reply.op == "A":
                    lease = lms / 1000
                    return Grant(key, int(reply.value), lease, sent + lease)  # type: ignore[call-overload]
                if reply.op == "T":
                    return None
                if reply.op == "M":
                    # No node said the wait ran out: if it runs out before
                    # another node answers, the acquire ends with
                    # NoActiveNode (M key - or M key addr alike), or an error
                    # naming a named node that could not be reached.
                    state.doing = "redirected"
                    # A node that redirects decided nothing: the attempt at
                    # the node it names goes out (with at least the shortest
                    # wait) even if the wait ran out meanwhile, so a
                    # try-lock during a failover asks the new active.
                    asked = False
                    to: Optional[str] = reply.value  # type: ignore[assignment]
                    state.failure = NoActiveNode() if to is None else self._unreached(to)
                    if await moves.moved(self, to):
                        state.failure = NoActiveNode(f"redirected to {to}, which had not answered when the wait ran out")
                    elif to is not None:
                        state.failure = self._unreached(to)
                    continue
                raise ProtocolError(f"unexpected answer to {op}: {reply.op}")
            if isinstance(reply, _Broken):
                raise broken_error(reply.why)
            failed += 1
            if failed >= self.connections():
                raise self._cut_off(failed, reply.why)
            state.failure = ConnectionFailed(reply.why)

    def _cut_off(self, failed: int, last: str) -> ConnectionFailed:
        return ConnectionFailed(f"no answer on {failed} connection(s) in a row; the last: {last}")

    async def try_acquire(self, key: Key, lease: Seconds, *, shared: bool = False, permits: Optional[int] = None) -> Optional[Grant]:
        """One attempt with the shortest wait the protocol allows (1 ms),
        like ``flock -n``: None if someone else holds the lock (``shared``
        and ``permits`` as for acquire)."""
        k = _proto.check_key(key)
        lms = _proto.lease_ms(lease)
        return await self._acquire(k, lms, _proto.TRY_WAIT_MS, _proto.check_kind(shared, permits))

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
    ) -> "_LockCall":
        """Acquires ``key`` and gives an AsyncLock; raises LockTimeout if the
        wait ran out. Use it as ``async with client.lock(...) as lock:`` (the
        lock is released at the end of the block) or ``lock = await
        client.lock(...)``. With ``renew`` (the default) the lease is renewed
        every third of it for as long as the lock is held; ``on_lost`` is
        called (on the event loop) if it is lost. ``shared`` and ``permits``
        as for acquire: a read lock, or one permit of a semaphore."""
        k = _proto.check_key(key)
        lms = _proto.lease_ms(lease)
        wms = _proto.wait_ms(wait)
        kind = _proto.check_kind(shared, permits)
        return _LockCall(self, k, lms, wms, renew, on_lost, wait, kind)

    async def try_lock(
        self,
        key: Key,
        lease: Seconds = 30,
        *,
        renew: bool = True,
        on_lost: Optional[Callable[[LockLost], None]] = None,
        shared: bool = False,
        permits: Optional[int] = None,
    ) -> "Optional[AsyncLock]":
        """One attempt (see try_acquire): an AsyncLock, or None if the lock is
        held by someone else."""
        k = _proto.check_key(key)
        lms = _proto.lease_ms(lease)
        grant = await self._acquire(k, lms, _proto.TRY_WAIT_MS, _proto.check_kind(shared, permits))
        if grant is None:
            return None
        return AsyncLock(self, grant, renew=renew, on_lost=on_lost)

    async def release(self, key: Key, token: int) -> bool:
        """Releases the grant of ``key`` that carries ``token``. True: it was
        held and is released; False: no grant of ``key`` carries ``token``
        (after a retried attempt False can also mean the first attempt had
        landed). Retried every 200 ms for 5 s on connection trouble."""
        k = _proto.check_key(key)
        _proto.check_token(token)
        until = _now() + self.timeouts.retry_for
        held, _ = await self._retrying("R", k, _proto.release_line(k, token), until)
        return held

    async def renew(self, key: Key, token: int, lease: Seconds) -> bool:
        """Renews the grant of ``key`` with ``token``: it now expires ``lease``
        seconds from when the server reads this. False: no such grant.
        Retried like a release."""
        k = _proto.check_key(key)
        _proto.check_token(token)
        lms = _proto.lease_ms(lease)
        until = _now() + self.timeouts.retry_for
        held, _ = await self._retrying("N", k, _proto.renew_line(k, token, lms), until)
        return held

    async def _retrying(
        self,
        op: str,
        key: bytes,
        line: bytes,
        until: float,
        trouble: Optional[Callable[[str], None]] = None,
    ) -> "tuple[bool, float]":
        """A release or renew, retried every ``retry_every`` until ``until``
        when no connection carries it, following ``M``. Each attempt is
        bounded by the request timeout. Gives the flag and when the attempt
        that got it was sent."""
        self._check_open()
        t = self.timeouts
        what = "release" if op == "R" else "renew"
        last = "no attempt could be made"
        # The nodes M answers named for this request: a new one is tried at
        # once, a repeated one after the usual retry delay.
        named: List[str] = []
        no_active = False
        started = _now()
        while True:
            if self._closed:
                # close() fails what is still waiting, as it does acquires.
                raise RinglockError("the client is closed")
            now = _now()
            if now >= until:
                break
            conn = self._pick(None)
            if conn is not None:
                sent = now
                bound = min(t.request_timeout, until - now)
                try:
                    reply: Reply = await _wait_for(conn.call(op, key, line), bound)
                except asyncio.TimeoutError:
                    reply = _Lost(f"{conn.addr} did not answer within {bound:g}s")
                no_active = False
                if isinstance(reply, Answer):
                    if reply.op == op:
                        return bool(reply.value), sent
                    if reply.op == "M":
                        if reply.value is not None:
                            addr: str = reply.value  # type: ignore[assignment]
                            left = max(0.0, until - _now())
                            last = f"redirected to {addr}"
                            news = addr not in named and len(named) <= MAX_REDIRECT_ADDRS
                            if news:
                                named.append(addr)
                            if await self._follow(addr, min(left, t.connect_timeout)) and news:
                                continue
                        else:
                            last = "no active node"
                            no_active = True
                    else:
                        raise ProtocolError(f"unexpected answer to {op}: {reply.op}")
                elif isinstance(reply, _Broken):
                    raise broken_error(reply.why)
                else:
                    last = reply.why
            else:
                last = self._why_no_connection()
            if trouble is not None:
                trouble(last)
            if _now() + t.retry_every > until:
                break
            await asyncio.sleep(t.retry_every)
        if no_active:
            raise NoActiveNode(f"{what}: no active node in the cluster")
        raise ConnectionFailed(f"{what} gave up after {_now() - started:.1f}s: {last}")

    # -- status
    async def status(self) -> List[AddrStatus]:
        """Asks every known address for its status (``S``), on its live
        connection or a one-off one. Never raises as a whole: each address
        gets a status or an error."""
        self._check_open()

        async def one(addr: str) -> AddrStatus:
            try:
                return AddrStatus(addr, await self._status_of(addr), None)
            except RinglockError as e:
                return AddrStatus(addr, None, e)

        return list(await asyncio.gather(*(one(a) for a in self.addresses())))

    async def _status_of(self, addr: str) -> NodeStatus:
        conn = self._pick(addr)
        if conn is not None:
            limit = self.timeouts.request_timeout
            try:
                reply = await _wait_for(conn.call("S", b"", b"S\n"), limit)
            except asyncio.TimeoutError:
                raise ConnectionFailed(f"{addr}: no answer to S within {limit:g}s") from None
            if isinstance(reply, Answer) and reply.op == "S":
                return NodeStatus(reply.key.decode(), reply.addr, int(reply.value))  # type: ignore[call-overload]
            if isinstance(reply, _Broken):
                raise broken_error(reply.why)
        return await node_status(addr, self.timeouts.connect_timeout, tls=self.tls)

    async def sync(self) -> None:
        """A barrier: ``S`` on every live connection. When it returns, every
        request handed to a connection before the call has been read by its
        server."""
        self._check_open()
        conns = [s.live for s in self._slots if s.live is not None and not s.live.closed]
        if not conns:
            raise ConnectionFailed(self._why_no_connection())
        limit = self.timeouts.request_timeout
        try:
            replies = await _wait_for(asyncio.gather(*(c.call("S", b"", b"S\n") for c in conns)), limit)
        except asyncio.TimeoutError:
            raise ConnectionFailed(f"sync: a node did not answer S within {limit:g}s") from None
        for reply in replies:
            if isinstance(reply, _Broken):
                raise broken_error(reply.why)
            if isinstance(reply, _Lost):
                raise ConnectionFailed(f"a connection dropped during sync: {reply.why}")


class _LockCall:
    """What ``AsyncClient.lock()`` returns: await it for an AsyncLock, or use
    it in ``async with`` (released at the end of the block)."""

    def __init__(
        self,
        client: AsyncClient,
        key: bytes,
        lms: int,
        wms: int,
        renew: bool,
        on_lost: Optional[Callable[[LockLost], None]],
        wait: Optional[Seconds],
        kind: "tuple[str, int]" = ("A", 0),
    ) -> None:
        self._client = client
        self._kind = kind
        self._key = key
        self._lms = lms
        self._wms = wms
        self._renew = renew
        self._on_lost = on_lost
        self._wait = wait
        self._lock: Optional[AsyncLock] = None

    async def _get(self) -> "AsyncLock":
        grant = await self._client._acquire(self._key, self._lms, self._wms, self._kind)
        if grant is None:
            raise LockTimeout(self._key, self._wms / 1000)
        self._lock = AsyncLock(self._client, grant, renew=self._renew, on_lost=self._on_lost)
        return self._lock

    def __await__(self) -> Generator[Any, None, "AsyncLock"]:
        return self._get().__await__()

    async def __aenter__(self) -> "AsyncLock":
        return await self._get()

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        assert self._lock is not None
        await self._lock.__aexit__(exc_type, exc, tb)


class _LockState:
    """What the renewal task shares with its lock (the task holds no
    reference to the lock object, so a lock dropped unreleased is seen)."""

    def __init__(self, grant: Grant, on_lost: Optional[Callable[[LockLost], None]]) -> None:
        self.grant = grant
        self.deadline = grant.deadline
        self.renewals = 0
        self.failed_attempts = 0
        self.last_error: Optional[str] = None
        self.lost: Optional[LockLost] = None
        self.done = asyncio.Event()  # lost, released or stopped
        self.callbacks: List[Callable[[Optional[LockLost]], None]] = []
        if on_lost is not None:
            cb = on_lost
            self.callbacks.append(lambda lost: cb(lost) if lost is not None else None)

    def finish(self, lost: Optional[LockLost]) -> None:
        if self.done.is_set():
            return
        self.lost = lost
        self.done.set()
        for cb in self.callbacks:
            try:
                cb(lost)
            except Exception:
                pass


def _dropped(client_ref: "weakref.ref[AsyncClient]", loop: asyncio.AbstractEventLoop, task: "Optional[asyncio.Task[None]]", key: bytes, token: int) -> None:
    """A lock object was garbage-collected unreleased: stop renewing it and
    release it in the background."""

    def later() -> None:
        if task is not None:
            task.cancel()
        client = client_ref()
        if client is not None:
            client._release_in_background(key, token)

    try:
        loop.call_soon_threadsafe(later)
    except RuntimeError:  # the loop is closed: the lease will run out
        pass


class AsyncLock:
    """A lock held, as ``AsyncClient.lock()``/``try_lock()`` give it.

    ``token`` is the fencing token. With renewal on, the lease is renewed
    every third of it; ``lost`` is set (and ``wait_lost()`` returns) if the
    lock is lost. ``release()`` (or the end of an ``async with`` block)
    releases it; a lock object dropped unreleased is released in the
    background.
    """

    def __init__(self, client: AsyncClient, grant: Grant, *, renew: bool = True, on_lost: Optional[Callable[[LockLost], None]] = None) -> None:
        self._client = client
        self._state = _LockState(grant, on_lost)
        self._released = False
        self._task: "Optional[asyncio.Task[None]]" = None
        if renew:
            self._task = asyncio.ensure_future(_renew_loop(client, self._state))
            # Stopped by client.close() like every background task.
            client._background.add(self._task)
            self._task.add_done_callback(client._background.discard)
        loop = asyncio.get_running_loop()
        self._finalizer = weakref.finalize(self, _dropped, weakref.ref(client), loop, self._task, grant.key, grant.token)

    @property
    def key(self) -> bytes:
        return self._state.grant.key

    @property
    def token(self) -> int:
        """The fencing token: pass it with every write to the protected
        resource, which refuses tokens lower than the highest it has seen."""
        return self._state.grant.token

    @property
    def lease(self) -> float:
        return self._state.grant.lease

    @property
    def deadline(self) -> float:
        """When the lease runs out at the latest as far as the client can tell
        (``time.monotonic()`` clock)."""
        return self._state.deadline

    @property
    def renewals(self) -> int:
        return self._state.renewals

    @property
    def renewing(self) -> bool:
        return self._task is not None

    @property
    def lost(self) -> Optional[LockLost]:
        """None while the lock is held (or after a release), else why it was
        lost."""
        return self._state.lost

    def is_lost(self) -> bool:
        return self._state.lost is not None

    def check(self) -> None:
        """Raises LockLost if the lock was lost."""
        if self._state.lost is not None:
            raise self._state.lost

    async def wait_lost(self) -> Optional[LockLost]:
        """Waits until the lock is lost (returns the LockLost) or released or
        no longer renewed (returns None). Cancel-safe: race it against your
        work with asyncio.wait."""
        await self._state.done.wait()
        return self._state.lost

    def _stop(self) -> None:
        self._finalizer.detach()
        if self._task is not None:
            self._task.cancel()

    async def renew(self, lease: Optional[Seconds] = None) -> bool:
        """Renews once now (with ``lease``, or the lease it was taken with).
        False: the lock is no longer held."""
        lms = _proto.lease_ms(self.lease if lease is None else lease)
        g = self._state.grant
        until = _now() + self._client.timeouts.retry_for
        held, sent = await self._client._retrying("N", g.key, _proto.renew_line(g.key, g.token, lms), until)
        if held:
            self._state.deadline = max(self._state.deadline, sent + lms / 1000)
        return held

    async def release(self) -> bool:
        """Stops renewing and releases the lock (retried for 5 s). True: it
        was held until now; False: it was already gone.

        A lock already known lost returns False at once: after ``N key 0``
        (``refused``) nothing is sent; after no renewal could be confirmed
        the release is sent in the background (the usual retries bound it;
        the grant may still be held on a node that could not be reached)."""
        if self._released:
            return False
        self._released = True
        self._stop()
        g = self._state.grant
        lost = self._state.lost
        if lost is not None:
            if not lost.refused:
                self._client._release_in_background(g.key, g.token)
            self._state.finish(lost)
            return False
        try:
            return await self._client.release(g.key, g.token)
        finally:
            self._state.finish(self._state.lost)

    def detach(self) -> Grant:
        """Stops renewing and keeps the lock held without releasing it (it
        ends by an explicit release or its lease)."""
        self._released = True
        self._stop()
        self._state.finish(self._state.lost)
        g = self._state.grant
        return Grant(g.key, g.token, g.lease, self._state.deadline)

    async def __aenter__(self) -> "AsyncLock":
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        lost = self._state.lost
        try:
            await self.release()
        except RinglockError:
            if exc_type is None and lost is None:
                raise
        if lost is not None and exc_type is None:
            raise lost

    def __repr__(self) -> str:
        return f"<AsyncLock key={_show(self.key)!r} token={self.token} lost={self.is_lost()}>"


async def _renew_loop(client: AsyncClient, state: _LockState) -> None:
    """Renews a third of a lease after the last confirmed renewal was sent;
    the lock is lost on ``N key 0`` or when no renewal was confirmed before
    the deadline (docs/client.md, "The renewing guard")."""
    t = client.timeouts
    g = state.grant
    lease = g.lease
    every = lease / 3
    line = _proto.renew_line(g.key, g.token, int(round(lease * 1000)))
    first = True
    try:
        while True:
            await asyncio.sleep(max(0.0, state.deadline - (lease - every) - _now()))
            # A grant that waited in the queue may come with its deadline
            # already past: its first renewal gets a request timeout, at most
            # a third of the lease, to be confirmed. A grant made at once
            # keeps its deadline, so a short lease is not stretched.
            loss_at = max(state.deadline, _now() + min(t.request_timeout, every)) if first else state.deadline
            first = False
            outcome: Optional[str] = None
            sent = 0.0
            while outcome is None:
                now = _now()
                if now >= loss_at:
                    outcome = "expired"
                    break

                def trouble(why: str) -> None:
                    state.failed_attempts += 1
                    state.last_error = why

                try:
                    held, sent = await _wait_for(client._retrying("N", g.key, line, loss_at, trouble), max(0.0, loss_at - now))
                    outcome = "renewed" if held else "refused"
                except asyncio.TimeoutError:
                    outcome = "expired"
                except RinglockError as e:
                    # A protocol error, or the retries gave up: try again
                    # (another connection may do) until the deadline.
                    trouble(str(e))
                    await asyncio.sleep(min(t.retry_every, max(0.0, loss_at - _now())))
            if outcome == "renewed":
                state.deadline = max(state.deadline, sent + lease)
                state.renewals += 1
                state.last_error = None
                continue
            if outcome == "refused":
                state.finish(LockLost(g.key, g.token, True))
            else:
                state.finish(LockLost(g.key, g.token, False, state.last_error or "the last attempt was not answered in time"))
            return
    except asyncio.CancelledError:
        state.finish(state.lost)
        raise


def _timed_out(tls: Optional[TlsConfig], timeout: float) -> str:
    if tls is None:
        return f"timed out after {timeout:g}s"
    return f"no TCP connection and TLS handshake within {timeout:g}s (a stalled node, or a port that does not speak TLS?)"


async def _open(addr: str, limit: int, tls: Optional[TlsConfig], timeout: float) -> "tuple[asyncio.StreamReader, asyncio.StreamWriter]":
    """Dials ``addr``, with the TLS handshake if ``tls`` (the caller bounds
    the whole; the handshake has ``timeout`` too)."""
    host, port = _proto.split_addr(addr)
    if tls is None:
        return await asyncio.open_connection(host, port, limit=limit)
    return await asyncio.open_connection(
        host,
        port,
        limit=limit,
        ssl=tls.context,
        server_hostname=tls.name_for(host),
        ssl_handshake_timeout=timeout,
    )


async def _one_off(addr: str, request: bytes, limit: int, timeout: float, tls: Optional[TlsConfig]) -> bytes:
    _proto.split_addr(addr)
    connected = False

    async def exchange() -> bytes:
        nonlocal connected
        try:
            reader, writer = await _open(addr, limit, tls, timeout)
        except (OSError, ValueError, UnicodeError) as e:
            raise ConnectionFailed(f"connect to {addr}: {_explain_tls(e) or e}") from None
        connected = True
        try:
            writer.write(request)
            line = await reader.readuntil(b"\n")
            return line[:-1]
        except asyncio.IncompleteReadError:
            raise ConnectionFailed(f"{addr} closed the connection") from None
        except asyncio.LimitOverrunError:
            raise ProtocolError(f"answer line from {addr} longer than {limit} bytes") from None
        except OSError as e:
            raise ConnectionFailed(f"read from {addr}: {_explain_tls(e) or e}") from None
        finally:
            writer.close()

    try:
        return await _wait_for(exchange(), timeout)
    except asyncio.TimeoutError:
        if not connected and tls is not None:
            raise ConnectionFailed(f"connect to {addr}: {_timed_out(tls, timeout)}") from None
        raise ConnectionFailed(f"{addr}: no answer within {timeout:g}s") from None


async def node_status(addr: str, timeout: float = 3.0, *, tls: "Union[TlsConfig, ssl.SSLContext, None]" = None) -> NodeStatus:
    """Asks one node for its status on a one-off connection (``timeout`` for
    the whole exchange, TLS handshake included; ``tls`` as for AsyncClient)."""
    line = await _one_off(addr, b"S\n", _proto.MAX_ANSWER_LINE, timeout, _tls_config(tls))
    try:
        ans = _proto.parse_answer(line)
    except MalformedAnswer as e:
        raise ProtocolError(f"{addr}: {e}") from None
    if ans.op == "S":
        return NodeStatus(ans.key.decode(), ans.addr, int(ans.value))  # type: ignore[call-overload]
    if ans.op == "E":
        raise ProtocolError(f"{addr} says: {_refusal(ans.key)}")
    raise ProtocolError(f"{addr} answered S with {line[:200]!r}")


def _wrong_kind(key: bytes, op: str, refusal: "tuple[str, int]") -> WrongKind:
    what, limit = refusal
    asked = "a shared acquire" if op == "G" else "a permit"
    if what == "semaphore":
        return WrongKind(f"{asked} of {_show(key)} refused: it is a semaphore of {limit} permits", limit)
    return WrongKind(f"{asked} of {_show(key)} refused: it is held or waited for as a lock")


def _refusal(why: bytes) -> str:
    """A node's ``E`` reason, as this client reports it. A TLS port answers
    a plain-text client with a hint for the ``ringlock`` command line (its
    ``--tls-ca`` flag); a Python program turns TLS on another way."""
    text = why.decode("ascii", "backslashreplace")
    if text.startswith("this port speaks TLS"):
        return "this port speaks TLS: connect with tls=TlsConfig(ca) (or tls=TlsConfig.from_env())"
    return f"E {text}"


async def node_problem(addr: str, timeout: float = 3.0, *, tls: "Union[TlsConfig, ssl.SSLContext, None]" = None) -> Optional[str]:
    """Asks one node whether it knows of a problem in its cluster (``H``), on
    a one-off connection: None when it knows of none (or predates ``H``).
    ``tls`` as for AsyncClient."""
    line = await _one_off(addr, b"H\n", _proto.MAX_HEALTH_LINE, timeout, _tls_config(tls))
    try:
        ans = _proto.parse_answer(line)
    except MalformedAnswer as e:
        raise ProtocolError(f"{addr}: {e}") from None
    if ans.op == "H":
        return None if ans.key == b"ok" else ans.key.decode("utf-8", "backslashreplace")
    if ans.op == "E":
        return None
    raise ProtocolError(f"{addr} answered H with {line[:200]!r}")



async def _lines_off(addr: str, request: bytes, max_lines: int, timeout: float, tls: Optional[TlsConfig], what: str, take: "Callable[[_proto.ListLine], bool]") -> None:
    """Sends ``request`` on a one-off connection and hands each answer line
    to ``take`` until it returns True (the end line), at most ``max_lines``
    lines of at most MAX_LIST_LINE bytes, all within ``timeout``."""
    _proto.split_addr(addr)
    connected = False

    async def exchange() -> None:
        nonlocal connected
        try:
            reader, writer = await _open(addr, _proto.MAX_LIST_LINE, tls, timeout)
        except (OSError, ValueError, UnicodeError) as e:
            raise ConnectionFailed(f"connect to {addr}: {_explain_tls(e) or e}") from None
        connected = True
        try:
            writer.write(request)
            for _ in range(max_lines):
                line = await reader.readuntil(b"\n")
                try:
                    parsed = _proto.parse_list_line(line[:-1])
                except MalformedAnswer as e:
                    raise ProtocolError(f"{addr}: {e}") from None
                if parsed.kind == "E":
                    raise ProtocolError(f"{addr} says: E {parsed.key.decode('ascii', 'backslashreplace')}")
                if take(parsed):
                    return
            raise ProtocolError(f"{addr} answered {what} with more than {max_lines} lines")
        except asyncio.IncompleteReadError:
            raise ConnectionFailed(f"{addr} closed the connection in the middle of a {what} answer") from None
        except asyncio.LimitOverrunError:
            raise ProtocolError(f"answer line from {addr} longer than {_proto.MAX_LIST_LINE} bytes") from None
        except OSError as e:
            raise ConnectionFailed(f"read from {addr}: {_explain_tls(e) or e}") from None
        finally:
            writer.close()

    try:
        await _wait_for(exchange(), timeout)
    except asyncio.TimeoutError:
        if not connected and tls is not None:
            raise ConnectionFailed(f"connect to {addr}: {_timed_out(tls, timeout)}") from None
        raise ConnectionFailed(f"{addr}: no answer within {timeout:g}s") from None


def _lock_info(line: "_proto.ListLine") -> LockInfo:
    n = line.numbers
    holder = HolderInfo(line.addr, line.owner, n[3] / 1000) if line.with_holder and n[0] != 0 else None
    return LockInfo(line.key, n[0], n[1] / 1000, n[2], holder)


async def _page(addr: str, op: bytes, prefix: bytes, cursor: int, limit: int, timeout: float, tls: Optional[TlsConfig]) -> "tuple[List[LockInfo], int]":
    request = op + b" " + str(cursor).encode() + b" " + str(limit).encode() + (b" " + prefix if prefix else b"") + b"\n"
    found: List[LockInfo] = []
    end: List[int] = []
    want = op.decode()

    def take(line: "_proto.ListLine") -> bool:
        if line.kind == "K" and line.with_holder == (op == b"W") and len(found) < limit:
            found.append(_lock_info(line))
            return False
        if line.kind == want:
            end.append(line.numbers[0])
            return True
        raise ProtocolError(f"{addr} answered {want} with an unexpected {line.kind} line")

    await _lines_off(addr, request, limit + 1, timeout, tls, want, take)
    return found, end[0]


async def list_locks(addr: str, prefix: Key = b"", cursor: int = 0, limit: int = 1000, timeout: float = 3.0, *, tls: "Union[TlsConfig, ssl.SSLContext, None]" = None) -> "tuple[List[LockInfo], int]":
    """One page of a node's lock table with each lock's holder (``W cursor
    limit [prefix]``) on a one-off connection: the locks, and the cursor of
    the next page (0: the listing is complete). A node older than ``W``
    answers E: the page is then asked again with ``L``, and its locks come
    with ``holder`` None. ``tls`` as for AsyncClient."""
    raw = _proto.check_key(prefix) if prefix else b""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise InvalidArgument("limit must be from 1 to 1000")
    if isinstance(cursor, bool) or not isinstance(cursor, int) or not 0 <= cursor <= _proto.MAX_TOKEN:
        raise InvalidArgument("cursor must be a u64")
    config = _tls_config(tls)
    try:
        return await _page(addr, b"W", raw, cursor, limit, timeout, config)
    except ProtocolError as e:
        if " says: E " not in str(e):
            raise
        return await _page(addr, b"L", raw, cursor, limit, timeout, config)


async def locks(addr: str, prefix: Key = b"", max: int = 10_000, timeout: float = 3.0, *, tls: "Union[TlsConfig, ssl.SSLContext, None]" = None) -> List[LockInfo]:
    """Every lock of a node's table whose key starts with ``prefix`` (at
    most ``max``), page by page with ``list_locks`` (``timeout`` per page,
    60 s in all). Ask the active node: a standby lists the grants it holds
    replicated, without waiters."""
    out: List[LockInfo] = []
    cursor = 0
    until = _now() + 60.0
    while len(out) < max:
        page, following = await list_locks(addr, prefix, cursor, min(1000, max - len(out)), timeout, tls=tls)
        out.extend(page)
        if following == 0:
            break
        if following <= cursor:
            raise ProtocolError(f"{addr} answered with cursor {following} after {cursor}: it does not move on")
        if _now() > until:
            raise ConnectionFailed(f"{addr}: the listing took longer than 60s")
        cursor = following
    return out


async def lock_queue(addr: str, key: Key, timeout: float = 3.0, *, tls: "Union[TlsConfig, ssl.SSLContext, None]" = None) -> QueueInfo:
    """Who holds ``key`` and who waits for it (``Q key``) on a one-off
    connection. Ask the active node (a standby has no waiters). A node older
    than ``Q`` answers E: ProtocolError. ``tls`` as for AsyncClient."""
    raw = _proto.check_key(key)
    found: List[Optional[LockInfo]] = [None]
    waiters: List[HolderInfo] = []
    waiting: List[int] = []

    def take(line: "_proto.ListLine") -> bool:
        if line.kind == "K" and line.with_holder and line.key == raw and found[0] is None and not waiters:
            found[0] = _lock_info(line)
            return False
        if line.kind == "J" and len(waiters) < 100:
            waiters.append(HolderInfo(line.addr, line.owner, line.numbers[0] / 1000))
            return False
        if line.kind == "Q" and line.key == raw:
            waiting.append(line.numbers[0])
            return True
        raise ProtocolError(f"{addr} answered Q with an unexpected {line.kind} line")

    await _lines_off(addr, b"Q " + raw + b"\n", 102, timeout, _tls_config(tls), "Q", take)
    return QueueInfo(found[0], waiters, waiting[0])
