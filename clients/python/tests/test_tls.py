"""TLS against the real server: round trips (blocking and asyncio), mutual
TLS, a wrong CA, an expired certificate, the server-name override, plain
text and TLS on the wrong ports, a stalled handshake, and a three-node TLS
cluster's failover. Every certificate is made here with the ``openssl``
command (none is checked in); without it these tests skip, saying so."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path
from typing import List, Optional, Tuple

import pytest

from conftest import Cluster, Server, loopback_ip, poll
from ringlock import (
    AsyncClient,
    Client,
    ConnectionFailed,
    InvalidArgument,
    NotAllowed,
    ProtocolError,
    TlsConfig,
    async_node_status,
    node_problem,
    node_status,
)

OPENSSL = shutil.which("openssl")


def _openssl(*args: str, cwd: Path) -> None:
    assert OPENSSL is not None
    out = subprocess.run([OPENSSL, *args], cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {out.stderr.decode(errors='replace')}")


class Ca:
    """A certificate authority (ECDSA P-256) in ``dir``, issuing
    certificates for the names given."""

    def __init__(self, dir: Path, name: str) -> None:
        self.dir = dir
        self.name = name
        self.pem = str(dir / f"{name}.pem")
        self.key = str(dir / f"{name}.key")
        _openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", self.key, "-out", self.pem, "-days", "2", "-subj", f"/CN=ringlock test {name}",
            # Key usage: Python 3.13's create_default_context() wants it.
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            cwd=dir,
        )  # fmt: skip

    def issue(self, file: str, names: List[str], expired: bool = False) -> Tuple[str, str]:
        """A certificate (serverAuth and clientAuth) naming ``names`` (IP
        addresses or DNS names); ``expired``: valid in 2020 only."""
        d = self.dir
        key, csr, pem = str(d / f"{file}.key"), str(d / f"{file}.csr"), str(d / f"{file}.pem")
        _openssl(
            "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", key, "-out", csr, "-subj", f"/CN={file}",
            cwd=d,
        )  # fmt: skip
        ext = d / f"{file}.ext"
        sans = ",".join(f"IP:{n}" if n.replace(".", "").isdigit() else f"DNS:{n}" for n in names)
        ext.write_text(f"subjectAltName={sans}\nextendedKeyUsage=serverAuth,clientAuth\n")
        if not expired:
            serial = "0x" + os.urandom(8).hex()
            _openssl(
                "x509", "-req", "-in", csr, "-CA", self.pem, "-CAkey", self.key, "-set_serial", serial,
                "-days", "2", "-out", pem, "-extfile", str(ext),
                cwd=d,
            )  # fmt: skip
        else:
            # Only `openssl ca` sets both dates of a certificate (OpenSSL 3.0).
            db = d / f"{file}.db"
            db.mkdir()
            (db / "index.txt").write_text("")
            (db / "serial").write_text(os.urandom(8).hex() + "\n")
            conf = db / "ca.cnf"
            conf.write_text(
                f"[ca]\ndefault_ca=d\n[d]\ndatabase={db}/index.txt\nnew_certs_dir={db}\nserial={db}/serial\n"
                "default_md=sha256\npolicy=p\n[p]\ncommonName=supplied\n"
            )
            _openssl(
                "ca", "-batch", "-config", str(conf), "-cert", self.pem, "-keyfile", self.key, "-in", csr,
                "-out", pem, "-startdate", "20200101000000Z", "-enddate", "20210101000000Z",
                "-extfile", str(ext), "-notext",
                cwd=d,
            )  # fmt: skip
        return pem, key


class Pki:
    """The node CA and its node certificate (127.0.0.1 and localhost), a
    client CA and a client certificate, and a CA that signed neither."""

    def __init__(self, dir: Path) -> None:
        self.dir = dir
        self.node_ca = Ca(dir, "node-ca")
        self.node_cert, self.node_key = self.node_ca.issue("node", ["127.0.0.1", "localhost"])
        self.client_ca = Ca(dir, "client-ca")
        self.client_cert, self.client_key = self.client_ca.issue("client", ["client.example"])
        self.other_ca = Ca(dir, "other-ca")


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    if OPENSSL is None:
        pytest.skip("TLS tests: no `openssl` command on PATH to make test certificates")
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def tls_server(start_server, pki: Pki):
    """A node speaking TLS with the node certificate; extra flags appended."""

    def start(*extra: str, cert: Optional[str] = None, key: Optional[str] = None) -> Server:
        return start_server("--tls-cert", cert or pki.node_cert, "--tls-key", key or pki.node_key, *extra)

    return start


def _timed(fn):
    started = time.monotonic()
    try:
        fn()
    except Exception as e:  # the caller checks what it is
        return e, time.monotonic() - started
    pytest.fail("expected an exception")


def test_round_trip_blocking_and_asyncio(tls_server, pki: Pki):
    server = tls_server()
    tls = TlsConfig(pki.node_ca.pem)
    with Client(server.addr, tls=tls) as client:
        with client.lock("tls-key", lease=5, wait=5) as lock:
            assert lock.token > 0
            assert client.try_acquire("tls-key", 5) is None
        statuses = client.status()
        assert statuses[0].status is not None and statuses[0].status.role == "active"
        client.sync()
    st = node_status(server.addr, tls=tls)
    assert st.role == "active" and st.token > 0
    assert node_problem(server.addr, tls=tls) is None

    # An ssl.SSLContext made by the application does too.
    ctx = ssl.create_default_context(cafile=pki.node_ca.pem)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2

    async def main() -> None:
        async with AsyncClient([server.addr], tls=ctx) as client:
            grant = await client.acquire("tls-async", 5, wait=5)
            assert grant is not None
            assert await client.release("tls-async", grant.token) is True
            async with client.lock("tls-async", lease=1) as lock:
                # Renewed over TLS past its lease.
                await asyncio.sleep(1.5)
                assert lock.renewals >= 2 and not lock.is_lost()
        st = await async_node_status(server.addr, tls=ctx)
        assert st.token >= grant.token

    asyncio.run(main())


def test_mutual_tls_with_and_without_a_client_certificate(tls_server, pki: Pki):
    server = tls_server("--tls-client-ca", pki.client_ca.pem)
    with Client(server.addr, tls=TlsConfig(pki.node_ca.pem, pki.client_cert, pki.client_key)) as client:
        grant = client.acquire("mtls", 5, wait=5)
        assert grant is not None and client.release("mtls", grant.token)

    with pytest.raises(ConnectionFailed, match="the server requires a client certificate"):
        Client(server.addr, tls=TlsConfig(pki.node_ca.pem))
    with pytest.raises(ConnectionFailed, match="the server requires a client certificate"):
        node_status(server.addr, tls=TlsConfig(pki.node_ca.pem))

    # A certificate from a CA the server does not know.
    stranger_cert, stranger_key = pki.other_ca.issue("stranger", ["client.example"])
    with pytest.raises(ConnectionFailed, match="does not accept our client certificate"):
        Client(server.addr, tls=TlsConfig(pki.node_ca.pem, stranger_cert, stranger_key))


def test_an_acquire_outside_the_rules_is_not_allowed_and_not_retried(tls_server, pki: Pki, tmp_path):
    # The client certificate's identity is its DNS name, client.example.
    acl = tmp_path / "acl"
    acl.write_text("client.example a/ lock\n")
    server = tls_server("--tls-client-ca", pki.client_ca.pem, "--acl", str(acl))
    tls = TlsConfig(pki.node_ca.pem, pki.client_cert, pki.client_key)
    with Client(server.addr, tls=tls) as client:
        e, took = _timed(lambda: client.acquire("b/x", 5, wait=5))
        assert isinstance(e, NotAllowed) and not isinstance(e, ProtocolError), repr(e)
        assert 'not allowed: identity "client.example" may not lock "b/x"' in str(e), str(e)
        assert took < 2, f"not retried: {took:.1f} s"
        grant = client.acquire("a/x", 5, wait=5)
        assert grant is not None and client.release("a/x", grant.token)

    async def main() -> None:
        async with AsyncClient([server.addr], tls=tls) as client:
            with pytest.raises(NotAllowed, match="may not lock"):
                await client.acquire("b/y", 5, wait=5)
            grant = await client.acquire("a/y", 5, wait=5)
            assert grant is not None

    asyncio.run(main())


def test_wrong_ca_and_expired_server_certificate(tls_server, pki: Pki):
    server = tls_server()
    with pytest.raises(ConnectionFailed, match=r"certificate is not signed by the CA given"):
        Client(server.addr, tls=TlsConfig(pki.other_ca.pem))
    with pytest.raises(ConnectionFailed, match=r"certificate is not signed by the CA given"):
        node_status(server.addr, tls=TlsConfig(pki.other_ca.pem))

    cert, key = pki.node_ca.issue("old-node", ["127.0.0.1"], expired=True)
    old = tls_server(cert=cert, key=key)
    with pytest.raises(ConnectionFailed, match=r"the server's certificate has expired"):
        Client(old.addr, tls=TlsConfig(pki.node_ca.pem))


def test_server_name_is_the_host_unless_overridden(tls_server, pki: Pki):
    cert, key = pki.node_ca.issue("named", ["lock1.example"])
    server = tls_server(cert=cert, key=key)
    # Dialled by 127.0.0.1, which the certificate does not name.
    with pytest.raises(ConnectionFailed, match="does not name the address dialed"):
        Client(server.addr, tls=TlsConfig(pki.node_ca.pem))
    with Client(server.addr, tls=TlsConfig(pki.node_ca.pem, server_name="lock1.example")) as client:
        assert client.acquire("named", 5, wait=5) is not None
    # And the default: the certificate names 127.0.0.1 and localhost.
    plain_name = tls_server()
    port = plain_name.addr.rsplit(":", 1)[1]
    for addr in (plain_name.addr, f"localhost:{port}"):
        assert node_status(addr, tls=TlsConfig(pki.node_ca.pem)).role == "active"
    with pytest.raises(ConnectionFailed, match="does not name the address dialed"):
        node_status(plain_name.addr, tls=TlsConfig(pki.node_ca.pem, server_name="lock1.example"))


def test_plain_text_client_to_a_tls_port(tls_server):
    server = tls_server()
    e, took = _timed(lambda: Client(server.addr))
    assert isinstance(e, ConnectionFailed) and "this port speaks TLS" in str(e), e
    # What a Python program does about it, not the command line's flag.
    assert "tls=TlsConfig(ca)" in str(e) and "--tls-ca" not in str(e), e
    assert took < 2.0, took
    with pytest.raises(ProtocolError, match=r"this port speaks TLS: connect with tls=TlsConfig\(ca\)"):
        node_status(server.addr)


def test_tls_client_to_a_plain_port(server, pki: Pki):
    e, took = _timed(lambda: Client(server.addr, tls=TlsConfig(pki.node_ca.pem)))
    assert isinstance(e, ConnectionFailed) and "the server did not answer in TLS" in str(e), e
    assert took < 2.0, took
    e, took = _timed(lambda: node_status(server.addr, tls=TlsConfig(pki.node_ca.pem)))
    assert isinstance(e, ConnectionFailed) and "the server did not answer in TLS" in str(e), e
    assert took < 2.0, took


def test_stalled_handshake_is_bounded_by_the_connect_timeout(pki: Pki):
    # A port that accepts TCP (the kernel's backlog) and never answers.
    ip = loopback_ip()
    sock = socket.socket()
    try:
        sock.bind((ip, 0))
        sock.listen(16)
        addr = f"{ip}:{sock.getsockname()[1]}"
        tls = TlsConfig(pki.node_ca.pem)
        e, took = _timed(lambda: Client(addr, tls=tls, connect_timeout=0.5))
        assert isinstance(e, ConnectionFailed) and "TLS handshake" in str(e) and "0.5s" in str(e), e
        assert 0.4 < took < 3.0, took
        e, took = _timed(lambda: node_status(addr, 0.5, tls=tls))
        assert isinstance(e, ConnectionFailed) and "TLS handshake within 0.5s" in str(e), e
        assert 0.4 < took < 3.0, took
    finally:
        sock.close()


def test_configuration_errors(pki: Pki, tmp_path: Path):
    with pytest.raises(InvalidArgument, match="go together"):
        TlsConfig(pki.node_ca.pem, cert=pki.client_cert)
    with pytest.raises(InvalidArgument, match="cannot read CA certificates"):
        TlsConfig(str(tmp_path / "missing.pem"))
    with pytest.raises(InvalidArgument, match="do not make a usable client certificate"):
        TlsConfig(pki.node_ca.pem, pki.client_cert, pki.node_key)  # someone else's key
    encrypted = str(tmp_path / "encrypted.key")
    _openssl("ec", "-in", pki.client_key, "-out", encrypted, "-aes256", "-passout", "pass:secret", cwd=tmp_path)
    with pytest.raises(InvalidArgument, match="is encrypted"):
        TlsConfig(pki.node_ca.pem, pki.client_cert, encrypted)
    with pytest.raises(InvalidArgument, match="must verify"):
        Client("127.0.0.1:1", tls=ssl._create_unverified_context())
    with pytest.raises(InvalidArgument, match="TlsConfig or an ssl.SSLContext"):
        AsyncClient("127.0.0.1:1", tls="ca.pem")  # type: ignore[arg-type]

    assert TlsConfig.from_env({}) is None
    assert TlsConfig.from_env({"RINGLOCK_TLS_CA": ""}) is None
    with pytest.raises(InvalidArgument, match="RINGLOCK_TLS_CA"):
        TlsConfig.from_env({"RINGLOCK_TLS_SERVER_NAME": "x.example"})
    with pytest.raises(InvalidArgument, match="go together"):
        TlsConfig.from_env({"RINGLOCK_TLS_CA": pki.node_ca.pem, "RINGLOCK_TLS_KEY": pki.client_key})
    tls = TlsConfig.from_env(
        {
            "RINGLOCK_TLS_CA": pki.node_ca.pem,
            "RINGLOCK_TLS_CERT": pki.client_cert,
            "RINGLOCK_TLS_KEY": pki.client_key,
            "RINGLOCK_TLS_SERVER_NAME": "lock1.example",
        }
    )
    assert tls is not None
    assert (tls.ca, tls.cert, tls.key, tls.server_name) == (pki.node_ca.pem, pki.client_cert, pki.client_key, "lock1.example")
    assert tls.context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert tls.context.verify_mode == ssl.CERT_REQUIRED and tls.context.check_hostname


class TlsCluster(Cluster):
    """Three nodes with TLS on the client port and the peer links: each
    node's certificate (from the node CA, which is the peer CA) names the
    loopback address its peers dial."""

    def __init__(self, binary: str, secret: str, pki: Pki) -> None:
        self.pki = pki
        self.tls = TlsConfig(pki.node_ca.pem)
        self.certs: dict = {}
        super().__init__(binary, 3, secret)

    def node_args(self, i: int) -> List[str]:
        if i not in self.certs:
            ip = self.addrs[i].rsplit(":", 1)[0]
            self.certs[i] = self.pki.node_ca.issue(f"node{i}-{ip}", [ip])
        cert, key = self.certs[i]
        return [*super().node_args(i), "--tls-cert", cert, "--tls-key", key, "--tls-peer-ca", self.pki.node_ca.pem]


def test_tls_cluster_fails_over(ringlock_bin: str, secret_file: str, pki: Pki):
    cluster = TlsCluster(ringlock_bin, secret_file, pki)
    try:
        cluster.wait_settled(0)
        with Client(cluster.addrs, tls=cluster.tls) as client:
            lock = client.lock("tls-survivor", lease=1.5)
            poll("replicated", lambda: all(cluster.node_status_token(i) >= lock.token for i in (1, 2)), 5)
            cluster.node(0).signal(signal.SIGKILL)
            cluster.wait_settled(1, [1, 2])
            renewals = lock.renewals
            poll("renewed on the new active", lambda: lock.renewals >= renewals + 2, 10)
            assert not lock.is_lost()
            grant = client.acquire("after-failover", 5, wait=5)
            assert grant is not None and grant.token > lock.token
            assert lock.release() is True
    finally:
        cluster.stop_all()

