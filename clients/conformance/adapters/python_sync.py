#!/usr/bin/env python3
"""The conformance adapter of the Python client's blocking API
(ringlock.Client): ADAPTER.md's JSON lines on stdin and stdout, each
command run on a thread of its own (many threads share one Client, as in
an application)."""

from __future__ import annotations

import sys
import threading
from typing import Any, Dict, Optional

from _python_common import Unsupported, error, granted, lost_event, parse, settings, status_reply, wait_s, write
import ringlock


class Adapter:
    def __init__(self) -> None:
        self.client: Optional[ringlock.Client] = None
        self.closed = False
        self.locks: Dict[int, ringlock.Lock] = {}
        self.guard = threading.Lock()

    def run(self, cmd: Dict[str, Any]) -> None:
        cid = cmd.get("id", 0)
        try:
            write(self.do(cid, cmd))
        except Exception as e:  # every failure is a reply
            write(error(cid, e))

    def do(self, cid: int, cmd: Dict[str, Any]) -> Dict[str, Any]:
        op = cmd.get("cmd")
        if op == "connect":
            self.client = ringlock.Client(cmd["addrs"], **settings(cmd))
            return {"id": cid, "ok": True}
        if op not in ("acquire", "try_acquire", "release", "renew", "lock_renewing", "unlock", "status", "stats", "close"):
            raise Unsupported(f"command {op!r}")
        c = self.client
        if c is None or self.closed:
            raise ringlock.RinglockError("the client is closed")
        if op == "acquire":
            return granted(cid, c.acquire(cmd["key"], cmd["lease_ms"] / 1000, wait_s(cmd)))
        if op == "try_acquire":
            return granted(cid, c.try_acquire(cmd["key"], cmd["lease_ms"] / 1000))
        if op == "release":
            return {"id": cid, "ok": True, "released": c.release(cmd["key"], int(cmd["token"]))}
        if op == "renew":
            return {"id": cid, "ok": True, "renewed": c.renew(cmd["key"], int(cmd["token"]), cmd["lease_ms"] / 1000)}
        if op == "lock_renewing":
            return self.lock_renewing(cid, c, cmd)
        if op == "unlock":
            return self.unlock(cid, cmd)
        if op == "status":
            return status_reply(cid, c.status())
        if op == "stats":
            return {"id": cid, "ok": True, "connected": c.connected(), "connections": c.connections()}
        self.closed = True
        c.close()
        return {"id": cid, "ok": True}

    def lock_renewing(self, cid: int, c: ringlock.Client, cmd: Dict[str, Any]) -> Dict[str, Any]:
        def on_lost(lost: ringlock.LockLost) -> None:
            write(lost_event(cid, lost))

        try:
            lock = c.lock(cmd["key"], cmd["lease_ms"] / 1000, wait_s(cmd), on_lost=on_lost)
        except ringlock.LockTimeout:
            return {"id": cid, "ok": True, "granted": False}
        with self.guard:
            self.locks[cid] = lock
        return granted(cid, lock, lock=cid)

    def unlock(self, cid: int, cmd: Dict[str, Any]) -> Dict[str, Any]:
        with self.guard:
            lock = self.locks.pop(cmd["lock"], None)
        if lock is None:
            return {"id": cid, "ok": True, "released": False}
        # The way a `with` block ends: release, LockLost if it was lost.
        try:
            lock.__exit__(None, None, None)
        except ringlock.LockLost:
            return {"id": cid, "ok": True, "released": False}
        return {"id": cid, "ok": True, "released": lock.lost is None}


def main() -> None:
    adapter = Adapter()
    for line in sys.stdin:
        if line.strip():
            threading.Thread(target=adapter.run, args=(parse(line),), daemon=True).start()
    if adapter.client is not None and not adapter.closed:
        done = threading.Thread(target=adapter.client.close, daemon=True)
        done.start()
        done.join(2)


if __name__ == "__main__":
    main()
