import asyncio, socket, threading, time
from conftest import FakeServer
from test_failback import serve_all, standby_naming, active_node, lines
from ringlock import AsyncClient, Client, ConnectionFailed, NoActiveNode, RinglockError


def black_hole():
    l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(0)
    addr = l.getsockname()
    fill = []
    for _ in range(4):
        s = socket.socket(); s.setblocking(False)
        try: s.connect(addr)
        except BlockingIOError: pass
        fill.append(s)
    time.sleep(0.1)
    return "127.0.0.1:%d" % addr[1], (l, fill)


def test_bh_acquire_release_close(make_fake):
    bh, keep = black_hole()
    a = make_fake()
    serve_all(a, standby_naming(bh))
    with Client([a.addr], redial_interval=60) as client:
        t = time.monotonic()
        try:
            client.acquire("k", 5, wait=0.5)
        except Exception as e:
            print("acquire:", type(e).__name__, e)
        took = time.monotonic() - t
        print("acquire took", took)
        assert took < 1.5 + 0.2
        t = time.monotonic()
        try:
            client.release("k", 5)
        except Exception as e:
            print("release:", type(e).__name__, e)
        took = time.monotonic() - t
        print("release took", took)
        assert took < 5.3
        # close while a named dial is in flight
        done = []
        def rel():
            try: client.release("k2", 5)
            except Exception as e: done.append(e)
        th = threading.Thread(target=rel); th.start()
        time.sleep(0.3)
        t = time.monotonic()
    print("close took", time.monotonic() - t)
    th.join(2); assert not th.is_alive()
    print(done)
    assert time.monotonic() - t < 1.0


def test_many_names(make_fake):
    n = [0]
    def answer(line):
        f = line.split(b" ")
        if f[0] == b"S":
            return b"S standby - 0"
        n[0] += 1
        return b"M " + f[1] + b" 127.0.0.1:%d" % (1 + n[0])
    a = make_fake()
    serve_all(a, answer)
    async def main():
        async with AsyncClient([a.addr], no_active_timeout=5) as c:
            t = time.monotonic()
            try:
                await c.acquire("k", 5)
            except Exception as e:
                print(type(e).__name__, e)
            print("took", time.monotonic() - t, "names", n[0], "addrs", len(c.addresses()), "conns", c.connections())
            assert len(c.addresses()) <= 17
            assert c.connections() <= 18
            t = time.monotonic()
            try: await c.release("k", 5)
            except Exception as e: print(type(e).__name__, e)
            print("rel took", time.monotonic() - t)
            tasks = [t for t in asyncio.all_tasks()]
            print("tasks", len(tasks))
    asyncio.run(main())
