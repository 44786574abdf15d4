"""The scripted fake ringlock node of the conformance suite.

A Node speaks the client protocol (docs/protocol.md) well enough for a
client: a lock table with FIFO waiters, leases, waits that run out (``T``,
held back behind an earlier acquire of the same key on the same connection
until that one is answered: docs/protocol.md section 6, rule 3), ``R``,
``N``, ``S``, ``H``. Rules from the scenario make it misbehave on cue
(answer late, never, out of order, cut the connection, send ``M``, ``T`` or
``E``, go silent), and the runner changes its mode while a scenario runs
(refuse connections, accept and stay silent, close every connection).

Every connection accepted, line received and line sent is logged with the
time on the runner's clock (time.monotonic), so that scenarios check what
the client did on the wire, on which connection, and when.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
import time
from typing import Any, Deque, Dict, List, Optional, Tuple

TOKEN_BASE = 1796000000000000000


def now() -> float:
    return time.monotonic()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def duration_ms(text: str) -> int:
    """A duration of the protocol (seconds, at most three decimals) in ms."""
    whole, _, frac = text.partition(".")
    if not whole.isdigit() or len(frac) > 3 or (frac and not frac.isdigit()) or text.endswith("."):
        raise ValueError(text)
    return int(whole) * 1000 + int((frac + "000")[:3])


class Log:
    """What every fake node of a scenario saw and did, in time order."""

    def __init__(self) -> None:
        self.entries: List[Dict[str, Any]] = []
        self.t0 = now()
        self.changed = asyncio.Event()
        self.grants: List[Tuple[str, str, int]] = []  # node, key, token
        self.next_cid = 1
        self.next_token = TOKEN_BASE
        self.global_hits: Dict[str, int] = collections.Counter()

    def add(self, **entry: Any) -> None:
        entry.setdefault("t", now())
        self.entries.append(entry)
        self.changed.set()
        self.changed = asyncio.Event()

    def token(self) -> int:
        self.next_token += 1
        return self.next_token

    def dump(self, limit: int = 200) -> str:
        out = []
        for e in self.entries[-limit:]:
            t = (e["t"] - self.t0) * 1000
            what = e.get("text", "")
            out.append(f"  {t:9.1f} ms  {e['node']}#{e.get('cid', '-')}  {e['kind']:6} {what}")
        return "\n".join(out)


class Rule:
    """``{"on": "A k", "do": "close", "times": 1, "scope": "global", ...}``:
    what to do with a request that matches (op, and key unless ``*``)."""

    def __init__(self, spec: Dict[str, Any], index: int, node: str) -> None:
        on = spec.get("on", "*").split()
        self.op = on[0] if on else "*"
        self.key = on[1] if len(on) > 1 else "*"
        self.do = spec.get("do", "normal")
        self.times = spec.get("times")
        self.skip = spec.get("skip", 0)
        self.scope = spec.get("scope", "node")
        self.spec = spec
        self.id = spec.get("id", f"{node}/{index}")
        self.hits = 0
        self.seen = 0

    def matches(self, op: str, key: str) -> bool:
        return (self.op == "*" or self.op == op) and (self.key == "*" or self.key == key)


class Acq:
    """One acquire the lock table took: waiting in the queue, or out of it
    (granted, or its wait ran out) with its answer sent or held back."""

    def __init__(self, conn: "Conn", key: str, lease_ms: int) -> None:
        self.conn = conn
        self.key = key
        self.lease_ms = lease_ms
        self.timer: Optional[asyncio.TimerHandle] = None
        # The answer, once decided; sent when no earlier acquire of the key
        # on the connection is still unanswered.
        self.answer: Optional[str] = None


class Lock:
    def __init__(self) -> None:
        self.token = 0
        self.expiry: Optional[asyncio.TimerHandle] = None
        self.waiters: Deque[Acq] = collections.deque()
        self.lease_ms = 0


class Conn:
    def __init__(self, node: "Node", cid: int, writer: asyncio.StreamWriter) -> None:
        self.node = node
        self.cid = cid
        self.writer = writer
        self.closed = False
        # Per key, the acquires the lock table took on this connection that
        # are not answered yet, oldest first (rule 3 of docs/protocol.md
        # section 6: answers of one op and key go out in arrival order).
        self.acqs: Dict[str, Deque[Acq]] = {}

    def answer(self, acq: Acq, line: str) -> None:
        """Decides ``acq``'s answer and sends every decided answer of its key
        that no undecided earlier acquire holds back."""
        acq.answer = line
        queue = self.acqs.get(acq.key)
        while queue and queue[0].answer is not None:
            self.send(queue.popleft().answer or "")
        if queue is not None and not queue:
            del self.acqs[acq.key]

    def send(self, line: str) -> None:
        if self.closed:
            return
        self.node.log.add(node=self.node.name, cid=self.cid, kind="sent", text=line)
        try:
            self.writer.write(line.encode() + b"\n")
        except Exception:
            pass

    def close(self, why: str = "") -> None:
        if self.closed:
            return
        self.closed = True
        self.node.log.add(node=self.node.name, cid=self.cid, kind="cut", text=why)
        try:
            transport = self.writer.transport
            if self.node.abort_close:
                transport.abort()
            else:
                self.writer.close()
        except Exception:
            pass


class Node:
    """One fake node: a name, a loopback port, a mode, rules."""

    def __init__(self, name: str, spec: Dict[str, Any], log: Log, nodes: Dict[str, "Node"], tls: Optional[ssl.SSLContext]) -> None:
        self.name = name
        self.spec = spec
        self.log = log
        self.nodes = nodes
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.mode = spec.get("mode", "normal")  # normal | silent | refuse
        self.hello = spec.get("hello", "normal")  # normal | silent
        self.role = spec.get("role", "active")
        self.abort_close = spec.get("abort", False)
        self.rules = [Rule(r, i, name) for i, r in enumerate(spec.get("rules", []))]
        self.locks: Dict[str, Lock] = {}
        self.conns: List[Conn] = []
        self.held: List[Tuple[Conn, str]] = []
        self.server: Optional[asyncio.AbstractServer] = None
        self.tls = tls

    # -- life cycle
    async def start(self) -> None:
        if self.mode != "refuse":
            await self.listen()

    async def listen(self) -> None:
        if self.server is None:
            self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, ssl=self.tls, reuse_address=True)
        if self.mode == "refuse":
            self.mode = "normal"

    async def refuse(self) -> None:
        self.mode = "refuse"
        if self.server is not None:
            self.server.close()
            self.server = None
        self.close_conns("refusing")

    def close_conns(self, why: str = "closed by the scenario", which: str = "all") -> None:
        live = [c for c in self.conns if not c.closed]
        if which == "first":
            live = live[:1]
        elif which == "last":
            live = live[-1:]
        for c in live:
            c.close(why)

    def close_conns_at(self, at: float) -> None:
        """Closes every connection at ``at`` as exactly as this process can:
        the loop's timer to within 2 ms, then a short spin."""

        def spin() -> None:
            while now() < at:
                pass
            self.close_conns("rule: close every connection at the appointed time")

        loop = asyncio.get_running_loop()
        loop.call_later(max(0.0, at - now() - 0.002), spin)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        self.close_conns("scenario over")
        for lock in self.locks.values():
            if lock.expiry is not None:
                lock.expiry.cancel()
            for w in lock.waiters:
                if w.timer is not None:
                    w.timer.cancel()

    # -- connections
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        cid = self.log.next_cid
        self.log.next_cid += 1
        conn = Conn(self, cid, writer)
        self.conns.append(conn)
        self.log.add(node=self.name, cid=cid, kind="accept")
        if self.mode == "refuse":
            conn.close("refusing")
            return
        first = True
        try:
            while not conn.closed:
                try:
                    raw = await reader.readline()
                except (ConnectionError, OSError, ssl.SSLError):
                    break
                if not raw:
                    break
                text = raw.decode("utf-8", "replace").rstrip("\n").rstrip("\r")
                self.log.add(node=self.name, cid=cid, kind="line", text=text, first=first)
                hello = first
                first = False
                if self.mode == "silent" or (hello and self.hello == "silent"):
                    continue
                self.handle(conn, text)
        finally:
            if not conn.closed:
                conn.closed = True
                self.log.add(node=self.name, cid=cid, kind="closed")
            self._forget(conn)
            try:
                writer.close()
            except Exception:
                pass

    def _forget(self, conn: Conn) -> None:
        for lock in self.locks.values():
            kept = collections.deque()
            for w in lock.waiters:
                if w.conn is conn:
                    if w.timer is not None:
                        w.timer.cancel()
                else:
                    kept.append(w)
            lock.waiters = kept
        conn.acqs.clear()

    # -- requests
    def _rule(self, op: str, key: str) -> Optional[Rule]:
        for r in self.rules:
            if not r.matches(op, key):
                continue
            if r.scope == "global":
                seen = self.log.global_hits[r.id + "/seen"]
                self.log.global_hits[r.id + "/seen"] = seen + 1
                hits = self.log.global_hits[r.id]
            else:
                seen = r.seen
                r.seen += 1
                hits = r.hits
            if seen < r.skip:
                continue
            if r.times is not None and hits >= r.times:
                continue
            if r.scope == "global":
                self.log.global_hits[r.id] = hits + 1
            else:
                r.hits += 1
            return r
        return None

    def handle(self, conn: Conn, text: str) -> None:
        fields = text.split(" ")
        op = fields[0] if fields else ""
        key = fields[1] if len(fields) > 1 and op in ("A", "R", "N") else ""
        rule = self._rule(op, key)
        if rule is None:
            self.normal(conn, fields)
            return
        also = rule.spec.get("close_all_after_ms")
        if also is not None:
            self.close_conns_at(now() + also / 1000)
        after = rule.spec.get("after_ms")
        if after:
            asyncio.get_running_loop().call_later(after / 1000, self._act, conn, rule, fields, text, key)
        else:
            self._act(conn, rule, fields, text, key)

    def _act(self, conn: Conn, rule: Rule, fields: List[str], text: str, key: str) -> None:
        if conn.closed:
            return
        do = rule.do
        spec = rule.spec
        if do == "normal":
            self.normal(conn, fields)
        elif do == "ignore":
            pass
        elif do == "close":
            conn.close(f"rule: cut on {text}")
        elif do == "silence":
            self.mode = "silent"
            self.log.add(node=self.name, cid=conn.cid, kind="mode", text="silent")
        elif do == "hold":
            self.held.append((conn, text))
        elif do == "delay":
            asyncio.get_running_loop().call_later(spec.get("delay_ms", 0) / 1000, self.normal, conn, fields)
        elif do == "reply":
            conn.send(self._subst(spec["line"], key))
            if spec.get("then") == "close":
                conn.close("rule: close after reply")
        elif do == "M":
            to = spec.get("to")
            conn.send(f"M {key} {self.nodes[to].addr if to else '-'}")
        elif do == "grant_close":
            self.normal(conn, fields)
            conn.close("rule: close after the answer")
        else:
            raise ValueError(f"unknown rule action {do!r}")

    def _subst(self, line: str, key: str) -> str:
        out = line.replace("{key}", key)
        for name, node in self.nodes.items():
            out = out.replace("{addr:" + name + "}", node.addr)
        if "{token}" in out:
            out = out.replace("{token}", str(self.log.token()))
        return out

    def release_held(self, match: str = "*", order: str = "fifo", count: Optional[int] = None) -> int:
        want = match.split()
        picked = []
        for item in self.held:
            f = item[1].split(" ")
            if want and want[0] != "*" and f[0] != want[0]:
                continue
            if len(want) > 1 and want[1] != "*" and (len(f) < 2 or f[1] != want[1]):
                continue
            picked.append(item)
        if count is not None:
            picked = picked[:count]
        for item in picked:
            self.held.remove(item)
        if order == "reverse":
            picked.reverse()
        for conn, text in picked:
            self.normal(conn, text.split(" "))
        return len(picked)

    # -- the lock table
    def normal(self, conn: Conn, f: List[str]) -> None:
        if conn.closed:
            return
        op = f[0] if f else ""
        try:
            if op == "S" and len(f) == 1:
                active = self.addr if self.role == "active" else self.spec.get("active", "-")
                if active in self.nodes:
                    active = self.nodes[active].addr
                conn.send(f"S {self.role} {active} {self.log.next_token}")
            elif op == "H" and len(f) == 1:
                conn.send("H ok")
            elif op == "A" and len(f) == 4:
                self.acquire(conn, f[1], duration_ms(f[2]), duration_ms(f[3]))
            elif op == "R" and len(f) == 3:
                self.release(conn, f[1], int(f[2]))
            elif op == "N" and len(f) == 4:
                self.renew(conn, f[1], int(f[2]), duration_ms(f[3]))
            else:
                raise ValueError(op)
        except ValueError:
            conn.send(f"E bad request {' '.join(f)[:100]}")
            conn.close("bad request")

    def _grant(self, acq: Acq) -> None:
        key = acq.key
        lock = self.locks.setdefault(key, Lock())
        lock.token = self.log.token()
        lock.lease_ms = acq.lease_ms
        self.log.grants.append((self.name, key, lock.token))
        lock.expiry = asyncio.get_running_loop().call_later(acq.lease_ms / 1000, self._expire, key, lock.token)
        # The queue is FIFO: every earlier acquire of the key on this
        # connection was granted or ran out before, so nothing holds this
        # grant back (a T held back behind it goes out right after it).
        queue = acq.conn.acqs.get(key)
        assert queue is not None and queue[0] is acq, "a grant held back behind an earlier acquire"
        acq.conn.answer(acq, f"A {key} {lock.token}")

    def _expire(self, key: str, token: int) -> None:
        lock = self.locks.get(key)
        if lock is not None and lock.token == token:
            self._free(key)

    def _free(self, key: str) -> None:
        lock = self.locks[key]
        if lock.expiry is not None:
            lock.expiry.cancel()
        lock.token = 0
        lock.expiry = None
        while lock.waiters:
            acq = lock.waiters.popleft()
            if acq.timer is not None:
                acq.timer.cancel()
            if not acq.conn.closed:
                self._grant(acq)
                return

    def acquire(self, conn: Conn, key: str, lease_ms: int, wait_ms: int) -> None:
        lock = self.locks.setdefault(key, Lock())
        acq = Acq(conn, key, lease_ms)
        conn.acqs.setdefault(key, collections.deque()).append(acq)
        if lock.token == 0:
            self._grant(acq)
            return
        if wait_ms > 0:
            acq.timer = asyncio.get_running_loop().call_later(wait_ms / 1000, self._ran_out, acq)
        lock.waiters.append(acq)

    def _ran_out(self, acq: Acq) -> None:
        """``acq``'s wait ran out: out of the queue, and its ``T`` sent, or
        held back until the earlier acquires of the key on its connection
        are answered."""
        lock = self.locks[acq.key]
        lock.waiters.remove(acq)
        acq.conn.answer(acq, f"T {acq.key}")

    def release(self, conn: Conn, key: str, token: int) -> None:
        lock = self.locks.get(key)
        if lock is not None and lock.token != 0 and lock.token == token:
            self._free(key)
            conn.send(f"R {key} 1")
        else:
            conn.send(f"R {key} 0")

    def renew(self, conn: Conn, key: str, token: int, lease_ms: int) -> None:
        lock = self.locks.get(key)
        if lock is not None and lock.token != 0 and lock.token == token:
            if lock.expiry is not None:
                lock.expiry.cancel()
            lock.expiry = asyncio.get_running_loop().call_later(lease_ms / 1000, self._expire, key, token)
            conn.send(f"N {key} 1")
        else:
            conn.send(f"N {key} 0")
