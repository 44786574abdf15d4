#!/usr/bin/env python3
"""The conformance runner: every scenario (scenarios/*.json) against every
registered client adapter (adapters.json), one table, scenario x client.

    python3 clients/conformance/run.py                       # everything
    python3 clients/conformance/run.py -s round_robin_three  # one scenario
    python3 clients/conformance/run.py -a python-async -v    # one client, with logs

Per scenario it starts the fake nodes on free loopback ports, starts the
adapter, drives it with the commands of ADAPTER.md, and checks what the
client sent on the wire (which lines, on which connection, when) and what
it reported, with every time taken on this process's clock. README.md says
how scenarios are written.

Exit status: 0 when every cell passed (or is marked as a known difference
that showed, or skipped with its reason); 1 otherwise; 2 on a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fake  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


class Fail(Exception):
    pass


class Skip(Exception):
    pass


def now() -> float:
    return time.monotonic()


# ---------------------------------------------------------------- certificates
def make_certs(dir_: Path) -> Optional[str]:
    """A CA and a node certificate for 127.0.0.1, made with openssl; None
    when openssl is missing (TLS scenarios are then skipped)."""
    if shutil.which("openssl") is None:
        return "openssl is not on PATH"

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=dir_, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    try:
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=conformance CA",
            "-keyout", "ca.key", "-out", "ca.pem", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=node", "-keyout", "node.key", "-out", "node.csr")
        (dir_ / "node.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:node\nbasicConstraints=CA:FALSE\n"
                                       "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
        run("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-out", "node.pem", "-extfile", "node.ext")
        # A second CA that signed nothing of ours: "the wrong CA".
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=other CA",
            "-keyout", "other.key", "-out", "other.pem", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    except (subprocess.CalledProcessError, OSError) as e:
        return f"openssl failed: {e}"
    return None


# ---------------------------------------------------------------- one run
class Run:
    """One scenario against one adapter."""

    def __init__(self, scenario: Dict[str, Any], adapter: Dict[str, Any], certs: Path, verbose: bool) -> None:
        self.sc = scenario
        self.adapter = adapter
        self.certs = certs
        self.verbose = verbose
        self.log = fake.Log()
        self.nodes: Dict[str, fake.Node] = {}
        self.proc: Optional[asyncio.subprocess.Process] = None
        self.replies: Dict[int, Tuple[Dict[str, Any], float]] = {}
        self.events: List[Tuple[Dict[str, Any], float]] = []
        self.got = asyncio.Event()
        self.labels: Dict[str, Tuple[int, float]] = {}
        self.marks: Dict[str, float] = {}
        self.next_id = 1
        self.stderr: List[str] = []
        self.trace: List[str] = []

    # -- helpers
    def t(self, at: float) -> float:
        return (at - self.log.t0) * 1000

    def note(self, msg: str) -> None:
        self.trace.append(f"  {self.t(now()):9.1f} ms  runner {msg}")

    def _tls_ctx(self, spec: Dict[str, Any]):  # type: ignore[no-untyped-def]
        if not spec.get("tls"):
            return None
        import ssl
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(str(self.certs / "node.pem"), str(self.certs / "node.key"))
        return ctx

    def subst(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: self.subst(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.subst(v) for v in value]
        if not isinstance(value, str):
            return value
        if value.startswith("@node:"):
            return self.nodes[value[6:]].addr
        if value.startswith("@grant:"):
            parts = value.split(":")
            grants = [str(tok) for (_, key, tok) in self.log.grants if key == parts[1]]
            n = int(parts[2]) if len(parts) > 2 else len(grants)
            if not 1 <= n <= len(grants):
                raise Fail(f"{value}: the fake nodes granted {parts[1]!r} {len(grants)} time(s)")
            return grants[n - 1]
        if value.startswith("@cert:"):
            return str(self.certs / value[6:])
        if value.startswith("$"):
            name, _, field = value[1:].partition(".")
            if name not in self.labels:
                raise Fail(f"{value}: no command labelled {name!r}")
            cid, _ = self.labels[name]
            if not field:
                return cid
            reply = self.replies.get(cid)
            if reply is None or field not in reply[0]:
                raise Fail(f"{value}: command {name!r} has no reply with {field!r}")
            return reply[0][field]
        return value

    # -- the adapter
    async def start_adapter(self) -> None:
        cmd = [fill(c) for c in self.adapter["run"]]
        env = dict(os.environ)
        for k, v in self.adapter.get("env", {}).items():
            env[k] = fill(v)
        self.proc = await asyncio.create_subprocess_exec(
            *cmd, cwd=str(ROOT), env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, limit=1 << 20)
        asyncio.ensure_future(self._read_stdout())
        asyncio.ensure_future(self._read_stderr())

    async def _read_stdout(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                break
            at = now()
            try:
                msg = json.loads(line)
            except ValueError:
                self.stderr.append(f"(stdout, not JSON) {line[:300]!r}")
                continue
            self.trace.append(f"  {self.t(at):9.1f} ms  adapter <- {line.decode(errors='replace').strip()[:300]}")
            if "event" in msg:
                self.events.append((msg, at))
            elif isinstance(msg.get("id"), int):
                self.replies[msg["id"]] = (msg, at)
            self.got.set()
            self.got = asyncio.Event()

    async def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while True:
            line = await self.proc.stderr.readline()
            if not line:
                break
            if len(self.stderr) < 400:
                self.stderr.append(line.decode(errors="replace").rstrip())

    def send(self, cmd: Dict[str, Any], label: Optional[str]) -> int:
        assert self.proc is not None and self.proc.stdin is not None
        cid = self.next_id
        self.next_id += 1
        msg = {"id": cid, **self.subst(cmd)}
        line = json.dumps(msg)
        at = now()
        self.trace.append(f"  {self.t(at):9.1f} ms  adapter -> {line[:300]}")
        self.proc.stdin.write(line.encode() + b"\n")
        if label:
            self.labels[label] = (cid, at)
        self.labels["_last"] = (cid, at)
        return cid

    async def wait_reply(self, cid: int, timeout: float) -> Tuple[Dict[str, Any], float]:
        until = now() + timeout
        while cid not in self.replies:
            got = self.got
            left = until - now()
            if left <= 0:
                raise Fail(f"no reply to command {cid} within {timeout * 1000:.0f} ms")
            try:
                await asyncio.wait_for(got.wait(), left)
            except asyncio.TimeoutError:
                pass
        return self.replies[cid]

    # -- checks
    def since(self, name: Optional[str]) -> float:
        if name is None:
            return self.log.t0
        if name in self.marks:
            return self.marks[name]
        if name in self.labels:
            return self.labels[name][1]
        raise Fail(f"no mark or command labelled {name!r}")

    @staticmethod
    def in_range(value: float, want: Any) -> bool:
        if isinstance(want, list):
            lo, hi = want
            return (lo is None or value >= lo) and (hi is None or value <= hi)
        return value == want

    def check_expect(self, what: str, msg: Dict[str, Any], expect: Dict[str, Any]) -> None:
        for k, want in self.subst(expect).items():
            if k == "message_has":
                # Text the reply's message must contain (each of a list).
                message = msg.get("message") or ""
                for part in want if isinstance(want, list) else [want]:
                    if part not in message:
                        raise Fail(f"{what}: the message does not contain {part!r} (reply {json.dumps(msg)[:300]})")
                continue
            got = msg.get(k)
            if got != want:
                raise Fail(f"{what}: {k} is {got!r}, expected {want!r} (reply {json.dumps(msg)[:300]})")

    def lines(self, spec: Dict[str, Any]) -> List[Dict[str, Any]]:
        node = spec.get("node", "*")
        want = spec.get("match", "*").split()
        t_from = self.since(spec.get("since"))
        hello = spec.get("hello")  # None: both; False: no hellos; True: only hellos
        out = []
        for e in self.log.entries:
            if e["kind"] != spec.get("kind", "line") or e["t"] < t_from:
                continue
            if node != "*" and e["node"] not in (node if isinstance(node, list) else [node]):
                continue
            if e["kind"] == "line":
                f = e["text"].split(" ")
                if want and want[0] != "*" and f[0] != want[0]:
                    continue
                if len(want) > 1 and want[1] != "*" and (len(f) < 2 or f[1] != want[1]):
                    continue
                if hello is not None and bool(e.get("first")) != hello:
                    continue
            out.append(e)
        if "index" in spec:
            i = spec["index"]
            return out[i:i + 1] if -len(out) <= i < len(out) else []
        return out

    def check_wire(self, step: Dict[str, Any]) -> None:
        spec = step["check_wire"]
        got = self.lines(spec)
        desc = f"wire {json.dumps(spec)}"
        t_from = self.since(spec.get("since"))
        if "count" in step and not self.in_range(len(got), step["count"]):
            raise Fail(f"{desc}: {len(got)} seen, expected {step['count']}")
        if "conns" in step:
            n = len({(e["node"], e.get("cid")) for e in got})
            if not self.in_range(n, step["conns"]):
                raise Fail(f"{desc}: on {n} distinct connection(s), expected {step['conns']}")
        if "nodes" in step:
            n = len({e["node"] for e in got})
            if not self.in_range(n, step["nodes"]):
                raise Fail(f"{desc}: on {n} distinct node(s), expected {step['nodes']}")
        if "per_node" in step:
            for name in self.nodes:
                n = sum(1 for e in got if e["node"] == name)
                want = step["per_node"].get(name) if isinstance(step["per_node"], dict) else step["per_node"]
                if want is not None and not self.in_range(n, want):
                    raise Fail(f"{desc}: node {name} saw {n}, expected {want}")
        if "first_ms" in step:
            if not got:
                raise Fail(f"{desc}: none seen")
            d = (got[0]["t"] - t_from) * 1000
            if not self.in_range(d, step["first_ms"]):
                raise Fail(f"{desc}: the first {d:.0f} ms after the mark, expected {step['first_ms']}")
        if "last_ms" in step:
            if not got:
                raise Fail(f"{desc}: none seen")
            d = (got[-1]["t"] - t_from) * 1000
            if not self.in_range(d, step["last_ms"]):
                raise Fail(f"{desc}: the last {d:.0f} ms after the mark, expected {step['last_ms']}")
        gaps = [(b["t"] - a["t"]) * 1000 for a, b in zip(got, got[1:])]
        for name, fn in (("gap_ms", None), ("median_gap_ms", statistics.median), ("min_gap_ms", min), ("max_gap_ms", max)):
            if name not in step:
                continue
            if not gaps:
                raise Fail(f"{desc}: fewer than two seen, no gap to measure")
            values = gaps if fn is None else [fn(gaps)]
            for g in values:
                if not self.in_range(g, step[name]):
                    raise Fail(f"{desc}: {name} {g:.0f} ms (gaps {[round(x) for x in gaps]}), expected {step[name]}")
        if "first_gap_ms" in step:
            if not gaps or not self.in_range(gaps[0], step["first_gap_ms"]):
                raise Fail(f"{desc}: gaps {[round(x) for x in gaps]}, expected the first in {step['first_gap_ms']}")
        if step.get("growing"):
            if any(b < a * 0.8 for a, b in zip(gaps, gaps[1:])):
                raise Fail(f"{desc}: gaps {[round(x) for x in gaps]} do not grow")
        if "field" in step:
            idx, lo, hi = step["field"]
            for e in got:
                f = e["text"].split(" ")
                try:
                    v = fake.duration_ms(f[idx])
                except (IndexError, ValueError):
                    raise Fail(f"{desc}: line {e['text']!r} has no number at field {idx}") from None
                if not (lo <= v <= hi):
                    raise Fail(f"{desc}: line {e['text']!r}: field {idx} is {v}, expected {lo}..{hi}")
        if "same_conn_as" in step:
            other = self.lines(step["same_conn_as"])
            conns = {(e["node"], e.get("cid")) for e in got} | {(e["node"], e.get("cid")) for e in other}
            if len(conns) != 1:
                raise Fail(f"{desc}: expected on the same connection as {step['same_conn_as']}, seen on {sorted(conns)}")

    async def wait_wire(self, step: Dict[str, Any]) -> None:
        spec = step["wait_wire"]
        count = step.get("count", 1)
        until = now() + step.get("timeout_ms", 5000) / 1000
        while len(self.lines(spec)) < count:
            left = until - now()
            if left <= 0:
                raise Fail(f"wire {json.dumps(spec)}: {len(self.lines(spec))} seen within {step.get('timeout_ms', 5000)} ms, waited for {count}")
            changed = self.log.changed
            try:
                await asyncio.wait_for(changed.wait(), left)
            except asyncio.TimeoutError:
                pass
        if "delay_ms" in step:
            await asyncio.sleep(step["delay_ms"] / 1000)

    async def await_reply(self, step: Dict[str, Any], label: str) -> None:
        cid, sent = self.labels[label]
        within = step.get("within_ms")
        timeout = step.get("timeout_ms") or ((within[1] if within and within[1] else 15000) + 3000)
        msg, at = await self.wait_reply(cid, timeout / 1000)
        took = (at - sent) * 1000
        self.note(f"{label} answered after {took:.0f} ms")
        if within is not None and not self.in_range(took, within):
            raise Fail(f"reply to {label} after {took:.0f} ms, expected {within} ms ({json.dumps(msg)[:200]})")
        if "expect" in step:
            self.check_expect(f"reply to {label} (after {took:.0f} ms)", msg, step["expect"])
        elif not msg.get("ok", False):
            raise Fail(f"reply to {label} (after {took:.0f} ms): {json.dumps(msg)[:300]}")

    async def wait_connected(self, step: Dict[str, Any]) -> None:
        """Polls `stats` until the client has at least `wait_connected`
        live connections (instead of sleeping for a time a loaded machine
        may not keep)."""
        want = step["wait_connected"]
        timeout = step.get("timeout_ms", 5000)
        until = now() + timeout / 1000
        while True:
            cid = self.send({"cmd": "stats"}, None)
            msg, _ = await self.wait_reply(cid, max(until - now(), 0.1))
            if "connected" not in msg:
                raise Fail(f"stats has no connected count: {json.dumps(msg)[:200]}")
            if msg["connected"] >= want:
                return
            if now() >= until:
                raise Fail(f"{msg['connected']} live connections within {timeout} ms, waited for {want}")
            await asyncio.sleep(0.02)

    async def await_event(self, step: Dict[str, Any]) -> None:
        want = self.subst(step["event"])
        t_from = self.since(step.get("since"))
        within = step.get("within_ms")
        timeout = step.get("timeout_ms") or ((within[1] if within and within[1] else 10000) + 3000)
        until = now() + timeout / 1000
        while True:
            for msg, at in self.events:
                if all(msg.get(k) == v for k, v in want.items()):
                    took = (at - t_from) * 1000
                    if "expect" in step:
                        self.check_expect("event", msg, step["expect"])
                    if within is not None and not self.in_range(took, within):
                        raise Fail(f"event {json.dumps(msg)[:200]} {took:.0f} ms after the mark, expected {within}")
                    return
            left = until - now()
            if left <= 0:
                raise Fail(f"no event {want} within {timeout:.0f} ms")
            got = self.got
            try:
                await asyncio.wait_for(got.wait(), left)
            except asyncio.TimeoutError:
                pass

    # -- steps
    async def step(self, step: Dict[str, Any]) -> None:
        if "connect" in step:
            spec = step["connect"]
            cmd: Dict[str, Any] = {"cmd": "connect", "addrs": [self.nodes[n].addr if n in self.nodes else n for n in spec["nodes"]]}
            if "options" in spec:
                cmd["options"] = spec["options"]
            if "tls" in spec:
                cmd["tls"] = {k: self.subst(v) for k, v in spec["tls"].items()}
            label = step.get("as", "connect")
            self.send(cmd, label)
            await self.await_reply(step, label)
        elif "send" in step:
            self.send(step["send"], step.get("as"))
        elif "call" in step:
            label = step.get("as") or f"_call{self.next_id}"
            self.send(step["call"], label)
            await self.await_reply(step, label)
        elif "await" in step:
            await self.await_reply(step, step["await"])
        elif "event" in step:
            await self.await_event(step)
        elif "no_event_ms" in step:
            n = len(self.events)
            await asyncio.sleep(step["no_event_ms"] / 1000)
            if len(self.events) > n:
                raise Fail(f"unexpected event {json.dumps(self.events[n][0])[:200]}")
        elif "sleep_ms" in step:
            if step["sleep_ms"] < 3:
                # Short pauses are spun: the event loop's timers are only
                # good to a millisecond.
                until = now() + step["sleep_ms"] / 1000
                while now() < until:
                    pass
            else:
                await asyncio.sleep(step["sleep_ms"] / 1000)
        elif "mark" in step:
            self.marks[step["mark"]] = now()
        elif "wait_connected" in step:
            await self.wait_connected(step)
        elif "wait_wire" in step:
            await self.wait_wire(step)
        elif "check_wire" in step:
            self.check_wire(step)
        elif "node" in step:
            await self.node_step(step)
        else:
            raise Fail(f"unknown step {json.dumps(step)[:200]}")

    async def node_step(self, step: Dict[str, Any]) -> None:
        node = self.nodes[step["node"]]
        do = step["do"]
        self.note(f"node {node.name}: {do}")
        if do in ("silent", "normal"):
            node.mode = do
            if "hello" in step:
                node.hello = step["hello"]
        elif do == "hello":
            node.hello = step["hello"]
        elif do == "refuse":
            await node.refuse()
        elif do == "listen":
            await node.listen()
        elif do == "close_conns" and "at_ms" in step:
            node.close_conns_at(self.since(step.get("since")) + step["at_ms"] / 1000)
        elif do == "close_conns":
            node.close_conns(which=step.get("which", "all"))
        elif do == "release_held":
            n = node.release_held(step.get("match", "*"), step.get("order", "fifo"), step.get("count"))
            if n == 0 and not step.get("may_be_none"):
                raise Fail(f"node {node.name}: nothing held matches {step.get('match', '*')!r}")
        elif do == "rules":
            node.rules = [fake.Rule(r, i, node.name) for i, r in enumerate(step["rules"])]
        else:
            raise Fail(f"unknown node action {do!r}")

    # -- the whole run
    async def go(self) -> Tuple[str, str]:
        for name, spec in self.sc.get("nodes", {}).items():
            self.nodes[name] = fake.Node(name, spec, self.log, self.nodes, self._tls_ctx(spec))
        for node in self.nodes.values():
            await node.start()
        try:
            await self.start_adapter()
            # Ready when it answers: a command before connect is answered
            # "closed" (ADAPTER.md). Times start after that, not counting
            # the adapter's own start-up.
            ping = self.send({"cmd": "stats"}, "_ping")
            await self.wait_reply(ping, 30)
            for i, step in enumerate(expand(self.sc["steps"])):
                try:
                    await self.step(step)
                except Fail as e:
                    raise Fail(f"step {i + 1}: {e}") from None
            return "pass", ""
        except Fail as e:
            return "fail", str(e)
        finally:
            await self.finish()

    async def finish(self) -> None:
        if self.proc is not None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            except Exception:
                pass
            try:
                await asyncio.wait_for(self.proc.wait(), 4)
            except asyncio.TimeoutError:
                self.stderr.append("(the adapter did not exit within 4 s of the end of its input: killed)")
                self.proc.kill()
                await self.proc.wait()
        for node in self.nodes.values():
            await node.stop()

    def report(self) -> str:
        merged = sorted(self.trace + [ln for ln in self.log.dump(400).splitlines()], key=lambda s: float(s.split()[0]))
        out = ["  --- wire and adapter, ms since the scenario started:"] + merged[-250:]
        if self.stderr:
            out.append("  --- adapter stderr:")
            out.extend("  " + s for s in self.stderr[-60:])
        return "\n".join(out)


def expand(steps: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """``{"repeat": N, "pause_ms": P, ...}`` is N copies of the step, with
    ``{i}`` in its strings replaced by 0..N-1, P ms apart."""

    def fill(v: Any, i: int) -> Any:
        if isinstance(v, dict):
            return {k: fill(x, i) for k, x in v.items()}
        if isinstance(v, list):
            return [fill(x, i) for x in v]
        return v.replace("{i}", str(i)) if isinstance(v, str) else v

    out: List[Dict[str, Any]] = []
    for step in steps:
        n = step.get("repeat")
        if n is None:
            out.append(step)
            continue
        body = {k: v for k, v in step.items() if k not in ("repeat", "pause_ms")}
        for i in range(n):
            out.append(fill(body, i))
            if step.get("pause_ms") and i < n - 1:
                out.append({"sleep_ms": step["pause_ms"]})
    return out


# ---------------------------------------------------------------- the table
def load_scenarios(names: List[str]) -> List[Dict[str, Any]]:
    out = []
    for path in sorted((HERE / "scenarios").glob("*.json")):
        sc = json.loads(path.read_text())
        sc.setdefault("name", path.stem)
        if names and sc["name"] not in names:
            continue
        out.append(sc)
    if names and len(out) != len(set(names)):
        found = {s["name"] for s in out}
        raise SystemExit(f"run.py: no such scenario: {', '.join(n for n in names if n not in found)}")
    return out


def prerequisite(adapter: Dict[str, Any]) -> Optional[str]:
    """Why this adapter cannot run here, or None."""
    for tool in adapter.get("requires", []):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH"
    check = adapter.get("check")
    if check:
        try:
            r = subprocess.run([fill(c) for c in check], cwd=ROOT, capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"{' '.join(check)}: {e}"
        if r.returncode != 0:
            return f"{' '.join(check)} failed: {(r.stdout + r.stderr).decode(errors='replace').strip()[-300:]}"
    return None


def fill(arg: str) -> str:
    """{root}: the repository; {target}: cargo's target directory."""
    target = os.environ.get("CARGO_TARGET_DIR") or str(ROOT / "target")
    return arg.replace("{root}", str(ROOT)).replace("{target}", target)


def build(adapter: Dict[str, Any]) -> Optional[str]:
    cmd = adapter.get("build")
    if not cmd:
        return None
    r = subprocess.run([fill(c) for c in cmd], cwd=ROOT, capture_output=True)
    if r.returncode != 0:
        return f"build failed: {' '.join(cmd)}\n{(r.stdout + r.stderr).decode(errors='replace')[-2000:]}"
    return None


def verdict(sc: Dict[str, Any], client: str, status: str) -> str:
    """The cell: pass, FAIL, differs (a known difference that showed),
    pending (a known failure), XPASS (marked but passed)."""
    differs = sc.get("expect_differs", {}).get(client)
    pending = sc.get("pending", {}).get(client)
    if status == "pass":
        return "pass*" if (differs or pending) else "pass"
    if differs:
        return "differs"
    if pending:
        return "pending"
    return "FAIL"


async def run_all(adapters: List[Dict[str, Any]], scenarios: List[Dict[str, Any]], certs: Path, certs_missing: Optional[str],
                  verbose: bool, serial: bool, quiet: bool) -> Dict[Tuple[str, str], Tuple[str, str]]:
    cells: Dict[Tuple[str, str], Tuple[str, str]] = {}

    async def one_adapter(ad: Dict[str, Any], scenarios: List[Dict[str, Any]]) -> None:
        for sc in scenarios:
            name = sc["name"]
            need = sc.get("requires", [])
            if "tls" in need and certs_missing:
                cells[(name, ad["name"])] = ("skip", certs_missing)
                continue
            if "tls" in need and not ad.get("tls", False):
                cells[(name, ad["name"])] = ("skip", "this client has no TLS")
                continue
            r = Run(sc, ad, certs, verbose)
            started = now()
            try:
                status, detail = await r.go()
            except Exception:
                status, detail = "fail", "runner error: " + traceback.format_exc()
            took = now() - started
            cell = verdict(sc, ad["name"], status)
            cells[(name, ad["name"])] = (cell, detail)
            line = f"{ad['name']:>13}  {cell:8} {took:6.1f} s  {name}"
            if status != "pass":
                line += f"\n{'':15}{detail}"
            if status != "pass" or not quiet:
                print(line, flush=True)
            if (status != "pass" and cell in ("FAIL",)) or verbose:
                print(r.report(), flush=True)

    shared = [s for s in scenarios if not s.get("exclusive")]
    alone = [s for s in scenarios if s.get("exclusive")]
    if serial:
        for ad in adapters:
            await one_adapter(ad, shared)
    else:
        await asyncio.gather(*(one_adapter(ad, shared) for ad in adapters))
    # Scenarios that load the machine run with nothing beside them.
    for sc in alone:
        for ad in adapters:
            await one_adapter(ad, [sc])
    return cells


def table(adapters: List[str], scenarios: List[Dict[str, Any]], cells: Dict[Tuple[str, str], Tuple[str, str]]) -> str:
    width = max(len(s["name"]) for s in scenarios)
    cols = [max(len(a), 7) for a in adapters]
    head = "| " + "scenario".ljust(width) + " | " + " | ".join(a.ljust(c) for a, c in zip(adapters, cols)) + " |"
    sep = "|" + "-" * (width + 2) + "|" + "|".join("-" * (c + 2) for c in cols) + "|"
    rows = [head, sep]
    for s in scenarios:
        cells_ = [cells.get((s["name"], a), ("-", ""))[0] for a in adapters]
        rows.append("| " + s["name"].ljust(width) + " | " + " | ".join(v.ljust(c) for v, c in zip(cells_, cols)) + " |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-s", "--scenario", action="append", default=[], help="run only this scenario (repeatable)")
    ap.add_argument("-a", "--adapter", action="append", default=[], help="run only this client (repeatable)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print the wire log of every run")
    ap.add_argument("-q", "--quiet", action="store_true", help="print only what did not pass, and the table")
    ap.add_argument("--serial", action="store_true", help="one client after the other (default: the clients side by side)")
    ap.add_argument("--no-build", action="store_true", help="do not run the adapters' build commands")
    ap.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = ap.parse_args()

    scenarios = load_scenarios(args.scenario)
    if args.list:
        for s in scenarios:
            print(f"{s['name']}: {s.get('about', '')}")
        return 0
    registry = json.loads((HERE / "adapters.json").read_text())["adapters"]
    if args.adapter:
        unknown = set(args.adapter) - {a["name"] for a in registry}
        if unknown:
            print(f"run.py: no such adapter: {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        registry = [a for a in registry if a["name"] in args.adapter]

    ready: List[Dict[str, Any]] = []
    skipped: Dict[str, str] = {}
    for ad in registry:
        why = prerequisite(ad)
        if why is None and not args.no_build:
            why = build(ad)
            if why is not None:
                print(f"{ad['name']}: {why}", file=sys.stderr)
                return 1
        if why is not None:
            skipped[ad["name"]] = why
            print(f"skipping the {ad['name']} column: {why}", flush=True)
        else:
            ready.append(ad)

    with tempfile.TemporaryDirectory(prefix="ringlock-conformance-") as tmp:
        certs = Path(tmp)
        certs_missing = make_certs(certs) if any("tls" in s.get("requires", []) for s in scenarios) else None
        if certs_missing:
            print(f"skipping the TLS scenarios: {certs_missing}", flush=True)
        started = now()
        cells = asyncio.run(run_all(ready, scenarios, certs, certs_missing, args.verbose, args.serial, args.quiet))
    for name, why in skipped.items():
        for s in scenarios:
            cells[(s["name"], name)] = ("skip", why)
    names = [a["name"] for a in registry]
    print()
    print(table(names, scenarios, cells))
    print()
    bad = sorted({(s, a) for (s, a), (cell, _) in cells.items() if cell == "FAIL"})
    for s in scenarios:
        for a in names:
            cell, detail = cells.get((s["name"], a), ("-", ""))
            if cell == "pass*":
                print(f"note: {s['name']} passes on {a} although marked {'expect_differs' if s.get('expect_differs', {}).get(a) else 'pending'}: the mark can go")
            elif cell == "skip" and a not in skipped:
                print(f"skipped: {s['name']} on {a}: {detail}")
            elif cell in ("differs", "pending"):
                why = (s.get("expect_differs", {}) or {}).get(a) or (s.get("pending", {}) or {}).get(a)
                print(f"{cell}: {s['name']} on {a}: {why}")
    print(f"{len(scenarios)} scenarios x {len(ready)} clients in {now() - started:.0f} s; {len(bad)} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
