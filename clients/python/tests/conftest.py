"""Fixtures: the real ringlock server (single nodes and clusters) on free
loopback ports, a TCP proxy that can cut connections, and a fake server
whose answers the test writes by hand. Every process and thread started
here is stopped at teardown; every wait is bounded."""

from __future__ import annotations

import faulthandler
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, List, Optional, TypeVar

import pytest

from ringlock import node_status

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[3]


def poll(what: str, check: Callable[[], Optional[T]], within: float = 10.0, every: float = 0.02) -> T:
    """Calls ``check`` until it returns something truthy; fails the test
    after ``within`` seconds."""
    until = time.monotonic() + within
    last: Optional[T] = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() >= until:
            pytest.fail(f"{what}: not within {within}s (last: {last!r})")
        time.sleep(every)


_REAL_STDERR = None


@pytest.fixture(autouse=True)
def watchdog(request):
    """A test that hangs is a failure, not a stuck CI run: after 120 s the
    process dumps every thread's stack and exits (non-zero)."""
    global _REAL_STDERR
    if _REAL_STDERR is None:
        # fd 2 is captured during tests: keep a copy of the real one.
        capman = request.config.pluginmanager.getplugin("capturemanager")
        with capman.global_and_fixture_disabled():
            _REAL_STDERR = os.fdopen(os.dup(2), "w")
    out = _REAL_STDERR
    faulthandler.dump_traceback_later(120, exit=True, file=out)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="session")
def ringlock_bin() -> str:
    env = os.environ.get("RINGLOCK_BIN")
    if env:
        assert os.access(env, os.X_OK), f"RINGLOCK_BIN={env} is not an executable"
        return env
    path = REPO / "target" / "debug" / "ringlock"
    if not path.exists():
        subprocess.run(["cargo", "build", "--bin", "ringlock"], cwd=REPO, check=True, timeout=1800)
    return str(path)


def loopback_ip() -> str:
    """A loopback address of its own (127.x.y.z): ports picked on it cannot
    be taken by other tests' outgoing connections from 127.0.0.1."""
    return f"127.{random.randint(1, 254)}.{random.randint(0, 255)}.{random.randint(1, 254)}"


def free_ports(ip: str, n: int) -> List[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((ip, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the test process ends, even
    if it ends without its fixtures' teardown (the watchdog's exit)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class Server:
    """A ``ringlock serve`` child process."""

    def __init__(self, binary: str, args: List[str]) -> None:
        self.args = args
        self.proc = subprocess.Popen(
            [binary, "serve", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent,
        )
        self.log: List[str] = []
        found = threading.Event()
        self.addr = ""

        def drain() -> None:
            assert self.proc.stderr is not None
            for raw in self.proc.stderr:
                line = raw.decode("utf-8", "replace")
                self.log.append(line)
                if not found.is_set() and "listening on " in line:
                    self.addr = line.split("listening on ", 1)[1].split()[0]
                    found.set()
            found.set()

        self._drain = threading.Thread(target=drain, daemon=True)
        self._drain.start()
        if not found.wait(15) or not self.addr:
            self.kill()
            raise RuntimeError(f"ringlock serve {args} did not start:\n{''.join(self.log)}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.running():
            self.proc.send_signal(sig)

    def stop(self) -> None:
        self.signal(signal.SIGSTOP)

    def cont(self) -> None:
        self.signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.running():
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(10)
        self._drain.join(5)  # the pipe ends with the process
        if self.proc.stderr is not None:
            self.proc.stderr.close()

    def wait(self, timeout: float) -> Optional[int]:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


@pytest.fixture
def start_server(ringlock_bin: str):
    started: List[Server] = []

    def start(*extra: str) -> Server:
        server = Server(ringlock_bin, ["--listen", "127.0.0.1:0", *extra])
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


@pytest.fixture
def server(start_server) -> Server:
    return start_server()


class Cluster:
    """``n`` nodes with the same ``--peers`` list (node 0 first: highest
    priority) on a loopback address of their own."""

    #: What node_status() is given to reach the nodes (a TLS cluster's).
    tls: object = None

    def __init__(self, binary: str, n: int, secret: str) -> None:
        self.binary = binary
        ip = loopback_ip()
        self.addrs = [f"{ip}:{p}" for p in free_ports(ip, n)]
        self.secret = secret
        self.nodes: List[Optional[Server]] = [None] * n
        for i in range(n):
            self.start_node(i)

    def node_args(self, i: int) -> List[str]:
        return [
            "--listen", self.addrs[i],
            "--peers", ",".join(self.addrs),
            "--heartbeat-ms", "50",
            "--peer-timeout-ms", "500",
            "--cluster-secret-file", self.secret,
        ]

    def start_node(self, i: int) -> None:
        assert self.nodes[i] is None or not self.nodes[i].running()  # type: ignore[union-attr]
        self.nodes[i] = Server(self.binary, self.node_args(i))

    def node(self, i: int) -> Server:
        node = self.nodes[i]
        assert node is not None
        return node

    def role(self, i: int) -> Optional[str]:
        try:
            st = node_status(self.addrs[i], 0.5, tls=self.tls)
        except Exception:
            return None
        return st.role if st.role == "standby" else f"active:{st.active}"

    def node_status_token(self, i: int) -> int:
        try:
            return node_status(self.addrs[i], 0.5, tls=self.tls).token
        except Exception:
            return -1

    def settled_on(self, active: int, alive: Optional[List[int]] = None) -> bool:
        alive = list(range(len(self.addrs))) if alive is None else alive
        for i in alive:
            try:
                st = node_status(self.addrs[i], 0.5, tls=self.tls)
            except Exception:
                return False
            if st.active != self.addrs[active]:
                return False
            if (st.role == "active") != (i == active):
                return False
        return True

    def wait_settled(self, active: int, alive: Optional[List[int]] = None, within: float = 10.0) -> None:
        poll(f"cluster settled on node {active}", lambda: self.settled_on(active, alive), within, 0.05)

    def stop_all(self) -> None:
        for node in self.nodes:
            if node is not None:
                node.kill()


@pytest.fixture(scope="session")
def secret_file(ringlock_bin: str, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("secret") / "cluster.secret"
    subprocess.run([ringlock_bin, "keygen", str(path)], check=True, stderr=subprocess.DEVNULL, timeout=30)
    return str(path)


@pytest.fixture
def make_cluster(ringlock_bin: str, secret_file: str):
    clusters: List[Cluster] = []

    def make(n: int = 3) -> Cluster:
        cluster = Cluster(ringlock_bin, n, secret_file)
        clusters.append(cluster)
        cluster.wait_settled(0)
        return cluster

    yield make
    for cluster in clusters:
        cluster.stop_all()


class Proxy:
    """A TCP forwarder in front of one address. ``cut_where(b)`` closes the
    connections whose client sent bytes containing ``b``; ``cut_all()``
    closes every connection; ``refuse`` makes it close new ones at once."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.listener.settimeout(0.1)
        self.addr = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.refuse = False
        self.lock = threading.Lock()
        self.pairs: List[dict] = []
        self.accepted = 0
        self.closed = False
        self.threads: List[threading.Thread] = []
        self._spawn(self._accept_loop)

    def _spawn(self, fn: Callable[..., None], *args: object) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True)
        t.start()
        self.threads.append(t)

    def _accept_loop(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.accepted += 1
            if self.refuse:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=2)
            except OSError:
                client.close()
                continue
            pair = {"client": client, "upstream": upstream, "sent": b"", "open": True}
            with self.lock:
                self.pairs.append(pair)
            self._spawn(self._pump, pair, client, upstream, True)
            self._spawn(self._pump, pair, upstream, client, False)

    def _pump(self, pair: dict, src: socket.socket, dst: socket.socket, upward: bool) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                self._close(pair)
                return
            if upward:
                with self.lock:
                    pair["sent"] += data
            try:
                dst.sendall(data)
            except OSError:
                self._close(pair)
                return

    def _close(self, pair: dict) -> None:
        with self.lock:
            if not pair["open"]:
                return
            pair["open"] = False
        for s in (pair["client"], pair["upstream"]):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def open_pairs(self) -> List[dict]:
        with self.lock:
            return [p for p in self.pairs if p["open"]]

    def carrying(self, needle: bytes) -> List[dict]:
        with self.lock:
            return [p for p in self.pairs if p["open"] and needle in p["sent"]]

    def cut_where(self, needle: bytes) -> int:
        pairs = self.carrying(needle)
        for p in pairs:
            self._close(p)
        return len(pairs)

    def cut_all(self) -> None:
        for p in self.open_pairs():
            self._close(p)

    def close(self) -> None:
        self.closed = True
        self.cut_all()
        self.listener.close()
        for t in self.threads:
            t.join(2)


@pytest.fixture
def make_proxy():
    proxies: List[Proxy] = []

    def make(target: str) -> Proxy:
        proxy = Proxy(target)
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.close()


class FakeConn:
    """One connection to the fake server, as the test drives it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def line(self, within: float = 5.0) -> bytes:
        """The next line the client sent (without ``\\n``)."""
        until = time.monotonic() + within
        while b"\n" not in self.buf:
            left = until - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line from the client within {within}s (have {self.buf!r})")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                continue
            if not data:
                raise AssertionError(f"the client closed the connection (have {self.buf!r})")
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def closed_by_client(self, within: float = 5.0) -> bool:
        """True once the client closed its side (EOF), reading and
        discarding what it still sends; False if not within ``within``."""
        until = time.monotonic() + within
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return False
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                return False
            except OSError:
                return True
            if not data:
                return True

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class FakeServer:
    """A listening socket; ``hello`` answers the client's first ``S``
    automatically. ``max_conns``: later connections are closed at once.
    ``sock``: a socket already bound (see ``reserve_port``) to listen on.
    ``accepted_at`` has the time (monotonic) of every accepted connection."""

    def __init__(self, hello: bool = True, max_conns: int = 1000, sock: Optional[socket.socket] = None) -> None:
        if sock is None:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", 0))
        self.listener = sock
        self.listener.listen(64)
        self.accepted_at: List[float] = []
        self.listener.settimeout(0.1)
        self.addr = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.hello = hello
        self.max_conns = max_conns
        self.conns: List[FakeConn] = []
        self.cond = threading.Condition()
        self.closed = False
        self.thread = threading.Thread(target=self._accept_loop, daemon=True)
        self.thread.start()

    def _accept_loop(self) -> None:
        while not self.closed:
            try:
                sock, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.accepted_at.append(time.monotonic())
            with self.cond:
                if len(self.conns) >= self.max_conns:
                    sock.close()
                    continue
            conn = FakeConn(sock)
            if self.hello:
                try:
                    assert conn.line() == b"S"
                    conn.send(b"S active - 0\n")
                except (AssertionError, OSError):
                    conn.close()
                    continue
            with self.cond:
                self.conns.append(conn)
                self.cond.notify_all()

    def conn(self, i: int = 0, within: float = 5.0) -> FakeConn:
        with self.cond:
            ok = self.cond.wait_for(lambda: len(self.conns) > i, within)
            assert ok, f"no connection #{i} within {within}s"
            return self.conns[i]

    def close(self) -> None:
        self.closed = True
        self.listener.close()
        self.thread.join(2)
        for c in self.conns:
            c.close()


def reserve_port() -> socket.socket:
    """A socket bound to a free loopback port and not listening: dials to
    it are refused until a FakeServer listens on it (``sock=``)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@pytest.fixture
def make_fake():
    fakes: List[FakeServer] = []

    def make(**kw: object) -> FakeServer:
        fake = FakeServer(**kw)  # type: ignore[arg-type]
        fakes.append(fake)
        return fake

    yield make
    for fake in fakes:
        fake.close()
