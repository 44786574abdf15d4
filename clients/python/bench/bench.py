"""Acquire+release cycles per second of the Python client, beside redis-py
(SET NX PX, then a Lua compare-and-delete) against a local redis-server, in
the same run.

    python clients/python/bench/bench.py [--duration 3] [--rounds 3] [--ringlock-bin target/debug/ringlock]

Starts one ``ringlock serve`` and one ``redis-server --save '' --appendonly
no`` on free loopback ports, runs every scenario for ``--duration`` seconds
after ``--warmup`` seconds (each loop bounded in time), prints a Markdown
table and stops both servers. Each worker takes its own key (uncontended):
it measures the client's round trips, not lock contention. Needs
``pip install ./clients/python redis`` and ``redis-server`` on the PATH.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, List

import ringlock

REPO = Path(__file__).resolve().parents[3]

RELEASE_LUA = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
else
    return 0
end
"""


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_ringlock(binary: str) -> "tuple[subprocess.Popen, str]":
    proc = subprocess.Popen([binary, "serve", "--listen", "127.0.0.1:0"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
    assert proc.stderr is not None
    until = time.monotonic() + 15
    while time.monotonic() < until:
        line = proc.stderr.readline().decode()
        if "listening on " in line:
            addr = line.split("listening on ", 1)[1].split()[0]
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, addr
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit("ringlock did not start")


def start_redis() -> "tuple[subprocess.Popen, int]":
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (apt-get install -y redis-server)")
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    until = time.monotonic() + 10
    while time.monotonic() < until:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("redis-server did not start")


def run_threads(n: int, cycle_factory: Callable[[int], Callable[[], None]], warmup: float, duration: float) -> float:
    counts = [0] * n
    start = threading.Barrier(n + 1)
    measuring = threading.Event()
    stop_at = [0.0]

    def worker(i: int) -> None:
        cycle = cycle_factory(i)
        start.wait()
        done = 0
        while True:
            now = time.monotonic()
            if stop_at[0] and now >= stop_at[0]:
                break
            cycle()
            if measuring.is_set():
                done += 1
        counts[i] = done

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    stop_at[0] = t0 + warmup + duration + 3600  # bounded even if not reset
    start.wait()
    time.sleep(warmup)
    measuring.set()
    m0 = time.monotonic()
    time.sleep(duration)
    stop_at[0] = time.monotonic()
    m1 = stop_at[0]
    for t in threads:
        t.join(30)
    return sum(counts) / (m1 - m0)


async def run_tasks(n: int, cycle_factory: Callable[[int], Callable[[], "asyncio.Future[None]"]], warmup: float, duration: float) -> float:
    counts = [0] * n
    state = {"measuring": False, "stop": time.monotonic() + warmup + duration + 3600}

    async def worker(i: int) -> None:
        cycle = cycle_factory(i)
        done = 0
        while time.monotonic() < state["stop"]:
            await cycle()
            if state["measuring"]:
                done += 1
        counts[i] = done

    tasks = [asyncio.ensure_future(worker(i)) for i in range(n)]
    await asyncio.sleep(warmup)
    state["measuring"] = True
    m0 = time.monotonic()
    await asyncio.sleep(duration)
    state["stop"] = time.monotonic()
    m1 = state["stop"]
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    return sum(counts) / (m1 - m0)


def one_round(args: argparse.Namespace, rl_addr: str, rd_port: int) -> List[Dict[str, object]]:
    """Every scenario once, in order."""
    import redis
    import redis.asyncio as aredis

    results: List[Dict[str, object]] = []
    # --- ringlock, blocking
    with ringlock.Client(rl_addr) as client:
        def rl_cycle(i: int) -> Callable[[], None]:
            key = f"bench/{i}"

            def cycle() -> None:
                g = client.acquire(key, 30, wait=5)
                assert g is not None
                client.release(key, g.token)

            return cycle

        for n in (1, 16):
            rate = run_threads(n, rl_cycle, args.warmup, args.duration)
            results.append({"client": "ringlock (Python, blocking Client)", "workers": f"{n} thread{'s' if n > 1 else ''}", "cycles_per_s": rate})

    # --- ringlock, asyncio
    async def rl_async() -> float:
        async with ringlock.AsyncClient(rl_addr) as aclient:
            def factory(i: int) -> Callable[[], "asyncio.Future[None]"]:
                key = f"bench/a{i}"

                async def cycle() -> None:
                    g = await aclient.acquire(key, 30, wait=5)
                    assert g is not None
                    await aclient.release(key, g.token)

                return cycle  # type: ignore[return-value]

            return await run_tasks(16, factory, args.warmup, args.duration)

    results.append({"client": "ringlock (Python, AsyncClient)", "workers": "16 asyncio tasks", "cycles_per_s": asyncio.run(rl_async())})

    # --- redis-py, blocking
    pool = redis.ConnectionPool(host="127.0.0.1", port=rd_port, max_connections=32)
    r = redis.Redis(connection_pool=pool)
    release = r.register_script(RELEASE_LUA)

    def rd_cycle(i: int) -> Callable[[], None]:
        key = f"bench/{i}"

        def cycle() -> None:
            token = uuid.uuid4().hex
            assert r.set(key, token, nx=True, px=30000)
            release(keys=[key], args=[token])

        return cycle

    for n in (1, 16):
        rate = run_threads(n, rd_cycle, args.warmup, args.duration)
        results.append({"client": "redis-py (SET NX PX + Lua release)", "workers": f"{n} thread{'s' if n > 1 else ''}", "cycles_per_s": rate})
    pool.disconnect()

    # --- redis-py, asyncio
    async def rd_async() -> float:
        ar = aredis.Redis(host="127.0.0.1", port=rd_port, max_connections=32)
        arelease = ar.register_script(RELEASE_LUA)

        def factory(i: int) -> Callable[[], "asyncio.Future[None]"]:
            key = f"bench/a{i}"

            async def cycle() -> None:
                token = uuid.uuid4().hex
                assert await ar.set(key, token, nx=True, px=30000)
                await arelease(keys=[key], args=[token])

            return cycle  # type: ignore[return-value]

        try:
            return await run_tasks(16, factory, args.warmup, args.duration)
        finally:
            await ar.aclose()

    results.append({"client": "redis-py asyncio (SET NX PX + Lua release)", "workers": "16 asyncio tasks", "cycles_per_s": asyncio.run(rd_async())})
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--ringlock-bin", default=os.environ.get("RINGLOCK_BIN", str(REPO / "target" / "debug" / "ringlock")))
    ap.add_argument("--rounds", type=int, default=3, help="every scenario this many times; the median is shown")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    import redis

    load_before = f"{os.getloadavg()[0]:.1f}"
    rl_proc, rl_addr = start_ringlock(args.ringlock_bin)
    rd_proc, rd_port = start_redis()
    rounds: List[List[Dict[str, object]]] = []
    try:
        for _ in range(args.rounds):
            rounds.append(one_round(args, rl_addr, rd_port))
    finally:
        for proc in (rl_proc, rd_proc):
            proc.kill()
            proc.wait(10)
    results = []
    for i, row in enumerate(rounds[0]):
        rates = sorted(float(r[i]["cycles_per_s"]) for r in rounds)  # type: ignore[arg-type]
        results.append({**row, "cycles_per_s": statistics.median(rates), "min": rates[0], "max": rates[-1], "rounds": rates})

    print(f"python {platform.python_version()}, {os.cpu_count()} cores, ringlock binary {args.ringlock_bin}, "
          f"redis-py {redis.__version__}, {args.duration:g} s per run after {args.warmup:g} s of warm-up\n")
    print(f"median of {args.rounds} rounds (min-max); load average before/after: {load_before} / {os.getloadavg()[0]:.1f}\n")
    print("| client | workers | acquire+release cycles/s |")
    print("|---|---|---:|")
    for row in results:
        print(f"| {row['client']} | {row['workers']} | {row['cycles_per_s']:,.0f} ({row['min']:,.0f}-{row['max']:,.0f}) |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
