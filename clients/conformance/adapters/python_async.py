#!/usr/bin/env python3
"""The conformance adapter of the Python client's asyncio API
(ringlock.AsyncClient): ADAPTER.md's JSON lines on stdin and stdout, each
command a task of its own on one event loop."""

from __future__ import annotations

import asyncio
import sys
from typing import Any, Dict, Optional

from _python_common import Unsupported, error, granted, lost_event, parse, settings, status_reply, wait_s, write
import ringlock


class Adapter:
    def __init__(self) -> None:
        self.client: Optional[ringlock.AsyncClient] = None
        self.closed = False
        self.locks: Dict[int, ringlock.AsyncLock] = {}
        self.tasks: "set[asyncio.Task[None]]" = set()

    async def run(self, cmd: Dict[str, Any]) -> None:
        cid = cmd.get("id", 0)
        try:
            write(await self.do(cid, cmd))
        except Exception as e:  # every failure is a reply
            write(error(cid, e))

    async def do(self, cid: int, cmd: Dict[str, Any]) -> Dict[str, Any]:
        op = cmd.get("cmd")
        if op == "connect":
            client = ringlock.AsyncClient(cmd["addrs"], **settings(cmd))
            await client.connect()
            self.client = client
            return {"id": cid, "ok": True}
        if op not in ("acquire", "try_acquire", "release", "renew", "lock_renewing", "unlock", "status", "stats", "close"):
            raise Unsupported(f"command {op!r}")
        c = self.client
        if c is None or self.closed:
            raise ringlock.RinglockError("the client is closed")
        if op == "acquire":
            return granted(cid, await c.acquire(cmd["key"], cmd["lease_ms"] / 1000, wait_s(cmd)))
        if op == "try_acquire":
            return granted(cid, await c.try_acquire(cmd["key"], cmd["lease_ms"] / 1000))
        if op == "release":
            return {"id": cid, "ok": True, "released": await c.release(cmd["key"], int(cmd["token"]))}
        if op == "renew":
            return {"id": cid, "ok": True, "renewed": await c.renew(cmd["key"], int(cmd["token"]), cmd["lease_ms"] / 1000)}
        if op == "lock_renewing":
            return await self.lock_renewing(cid, c, cmd)
        if op == "unlock":
            return await self.unlock(cid, cmd)
        if op == "status":
            return status_reply(cid, await c.status())
        if op == "stats":
            return {"id": cid, "ok": True, "connected": c.connected(), "connections": c.connections()}
        self.closed = True
        await asyncio.wait_for(c.close(), 2)
        return {"id": cid, "ok": True}

    async def lock_renewing(self, cid: int, c: ringlock.AsyncClient, cmd: Dict[str, Any]) -> Dict[str, Any]:
        def on_lost(lost: ringlock.LockLost) -> None:
            write(lost_event(cid, lost))

        try:
            lock = await c.lock(cmd["key"], cmd["lease_ms"] / 1000, wait_s(cmd), on_lost=on_lost)
        except ringlock.LockTimeout:
            return {"id": cid, "ok": True, "granted": False}
        self.locks[cid] = lock
        return granted(cid, lock, lock=cid)

    async def unlock(self, cid: int, cmd: Dict[str, Any]) -> Dict[str, Any]:
        lock = self.locks.pop(cmd["lock"], None)
        if lock is None:
            return {"id": cid, "ok": True, "released": False}
        # The way an `async with` block ends: release, LockLost if it was lost.
        try:
            released = await lock.release()
        except ringlock.LockLost:
            released = False
        return {"id": cid, "ok": True, "released": bool(released) and lock.lost is None}


async def main() -> None:
    adapter = Adapter()
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        if not line.strip():
            continue
        task = asyncio.ensure_future(adapter.run(parse(line)))
        adapter.tasks.add(task)
        task.add_done_callback(adapter.tasks.discard)
    if adapter.client is not None and not adapter.closed:
        try:
            await asyncio.wait_for(adapter.client.close(), 2)
        except Exception:
            pass


if __name__ == "__main__":
    asyncio.run(main())
