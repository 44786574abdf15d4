// The client against a fake server whose answers each test writes: the
// (op, key) matcher, M following, liveness, local queueing, what a broken
// server costs, when a renewing lock says it is lost.

import assert from "node:assert/strict";
import type * as net from "node:net";
import { test } from "node:test";

import { Client, ConnectionError, NoActiveNodeError, ProtocolError, WrongKindError } from "../src/index.js";
import { failOnUnhandledRejections, FakeServer, poll } from "./helpers.js";

failOnUnhandledRejections();

async function withFake(
  f: (fake: FakeServer) => Promise<void>,
  onLine?: (line: string, sock: net.Socket, fake: FakeServer) => void,
): Promise<void> {
  const fake = await FakeServer.start();
  if (onLine !== undefined) {
    const hello = fake.onLine;
    fake.onLine = (line, sock) => (line === "S" ? hello(line, sock) : onLine(line, sock, fake));
  }
  try {
    await f(fake);
  } finally {
    await fake.close();
  }
}

test("answers are matched by op and key, whatever their order", async () => {
  const held: Array<{ line: string; sock: net.Socket }> = [];
  await withFake(
    async (fake) => {
      // One connection only (the second gets no hello), so that every
      // request shares one matcher.
      let first: net.Socket | undefined;
      fake.onLine = (line, sock) => {
        if (line === "S") {
          first ??= sock;
          if (sock === first) sock.write(`S active ${fake.addr} 1\n`);
        } else if (line.startsWith("A ")) held.push({ line, sock });
        else if (line.startsWith("R ")) sock.write("R x 1\n");
        else if (line.startsWith("N ")) sock.write("N y 0\n");
      };
      await using client = await Client.connect(fake.addr, { probeTimeoutMs: 200 });
      await poll("the second dial given up", () => client.connected() === 1 && fake.lines.length >= 2);
      const a = client.acquire("x", { leaseMs: 1000 });
      await poll("the acquire reached the fake", () => held.length === 1);
      // An R of the same key after it, and an N: answered first; then the A.
      const r = client.release("x", 5n);
      const n = client.renew("y", 6n, 1000);
      assert.equal(await r, true);
      assert.equal(await n, false);
      held[0]!.sock.write("A x 12345678901234567890\n");
      const g = await a;
      assert.equal(g?.token, 12345678901234567890n);
      assert.equal(new Set(held.map((h) => h.sock)).size, 1);
    },
  );
});

test("an answer that matches nothing, an E, a malformed or over-long line: ProtocolError, and the connection is redialled", async () => {
  for (const answer of ["R nothing 1\n", "E lock table full: 1 locks (--max-locks) in line 2\n", "A x yes\n", "A x " + "1".repeat(5000) + "\n"]) {
    await withFake(
      async (fake) => {
        await using client = await Client.connect(fake.addr, { redialIntervalMs: 100 });
        await assert.rejects(client.acquire("x", { leaseMs: 1000 }), ProtocolError, JSON.stringify(answer.slice(0, 30)));
        // The client goes on with its other connection, and redials.
        await poll("both connections up again", () => client.connected() === 2, 3000);
      },
      (line, sock) => {
        if (line.startsWith("A ")) sock.write(answer);
      },
    );
  }
});

test("M key addr is followed; M key - is retried with back-off, then NoActiveNodeError", async () => {
  await withFake(async (active) => {
    active.onLine = (line, sock) => {
      if (line === "S") sock.write(`S active ${active.addr} 1\n`);
      else if (line.startsWith("A ")) sock.write("A k 42\n");
    };
    await withFake(
      async (standby) => {
        await using client = await Client.connect(standby.addr);
        const g = await client.acquire("k", { leaseMs: 1000 });
        assert.equal(g?.token, 42n);
        assert.deepEqual(client.addresses(), [standby.addr, active.addr]);
      },
      (line, sock) => {
        if (line.startsWith("A ")) sock.write(`M k ${active.addr}\n`);
      },
    );
  });
  await withFake(
    async (fake) => {
      await using client = await Client.connect(fake.addr, { noActiveTimeoutMs: 600 });
      const t0 = performance.now();
      await assert.rejects(client.acquire("k", { leaseMs: 1000 }), NoActiveNodeError);
      const took = performance.now() - t0;
      const tries = fake.lines.filter((l) => l.startsWith("A ")).length;
      // 50 + 100 + 200 + 400 ms of back-off: about 4 to 5 attempts in 0.6 s.
      assert.ok(tries >= 3 && tries <= 6, `attempts: ${tries}`);
      assert.ok(took >= 550 && took < 4000, `took ${took} ms`);
    },
    (line, sock) => {
      if (line.startsWith("A ")) sock.write("M k -\n");
    },
  );
});

test("a node that accepts but never answers the hello is never used", async () => {
  await withFake(async (fake) => {
    fake.onLine = () => undefined;
    const t0 = performance.now();
    await assert.rejects(Client.connect(fake.addr, { probeTimeoutMs: 200 }), (e: unknown) => {
      assert.ok(e instanceof ConnectionError);
      assert.match(e.message, /did not answer S within 200 ms/);
      return true;
    });
    assert.ok(performance.now() - t0 < 2500);
    assert.ok(fake.lines.every((l) => l === "S"), "nothing but the hello was sent");
  });
});

test("a silent connection is probed, found dead, and its acquire moves on to the other", async () => {
  let acquires = 0;
  await withFake(
    async (fake) => {
      await using client = await Client.connect(fake.addr, { probeIntervalMs: 100, probeTimeoutMs: 100 });
      const t0 = performance.now();
      const g = await client.acquire("k", { leaseMs: 1000, waitMs: 5000 });
      const took = performance.now() - t0;
      assert.equal(g?.token, 7n);
      assert.equal(acquires, 2);
      assert.ok(took >= 150 && took < 3000, `took ${took} ms`);
    },
    (line, sock) => {
      // The first acquire's connection goes silent (even to probes); the second answers.
      if (line.startsWith("A ")) {
        acquires += 1;
        if (acquires === 1) {
          sock.pause();
          return;
        }
        sock.write("A k 7\n");
      }
    },
  );
});

test("at most maxWaitingAcquires wait on one connection; the rest queue in the client; releases are not held back", async () => {
  const socks = new Map<net.Socket, string[]>();
  await withFake(
    async (fake) => {
      await using client = await Client.connect(fake.addr, { maxWaitingAcquires: 2 });
      await poll("both connections up", () => client.connected() === 2);
      const waits = Array.from({ length: 10 }, () => client.acquire("q", { leaseMs: 1000 }));
      await poll("four acquires at the server", () => fake.lines.filter((l) => l.startsWith("A ")).length === 4);
      assert.equal(await client.release("other", 9n), true, "a release goes out past the queued acquires");
      await new Promise((r) => setTimeout(r, 100));
      assert.equal(fake.lines.filter((l) => l.startsWith("A ")).length, 4, "no more than two per connection");
      // Grant them one by one: each answer lets one more out.
      let token = 100;
      for (let i = 0; i < 10; i++) {
        await poll("an acquire waiting", () => [...socks.values()].some((q) => q.length > 0));
        const [sock, q] = [...socks.entries()].find(([, q]) => q.length > 0)!;
        q.shift();
        sock.write(`A q ${token++}\n`);
      }
      const grants = await Promise.all(waits);
      assert.equal(new Set(grants.map((g) => g?.token)).size, 10);
    },
    (line, sock) => {
      if (line.startsWith("A ")) {
        if (!socks.has(sock)) socks.set(sock, []);
        socks.get(sock)!.push(line);
      } else if (line.startsWith("R ")) {
        sock.write("R other 1\n");
      }
    },
  );
});

test("an acquire aborted while it waits is released as soon as it is granted", async () => {
  const held: net.Socket[] = [];
  await withFake(
    async (fake) => {
      await using client = await Client.connect(fake.addr);
      const ac = new AbortController();
      const p = client.acquire("k", { leaseMs: 1000, signal: ac.signal });
      await poll("the acquire reached the fake", () => held.length === 1);
      ac.abort();
      await assert.rejects(p, { name: "AbortError" });
      held[0]!.write("A k 77\n");
      await poll("the grant was released", () => fake.lines.includes("R k 77"));
    },
    (line, sock) => {
      if (line.startsWith("A ")) held.push(sock);
      if (line.startsWith("R ")) sock.write("R k 1\n");
    },
  );
});

test("an acquire with a wait ends by its wait plus the grace, whatever the node does", async () => {
  await withFake(
    async (fake) => {
      await using client = await Client.connect(fake.addr, { acquireGraceMs: 200, probeIntervalMs: 60_000 });
      const t0 = performance.now();
      await assert.rejects(client.acquire("k", { leaseMs: 1000, waitMs: 300 }), (e: unknown) => {
        assert.ok(e instanceof ConnectionError);
        assert.match(e.message, /did not answer the acquire of k within 500 ms/);
        return true;
      });
      const took = performance.now() - t0;
      assert.ok(took >= 480 && took < 2500, `took ${took} ms`);
      assert.ok(fake.lines.includes("A k 1 0.3"));
    },
    // Answers probes, never the acquire.
    () => undefined,
  );
});

test("a release whose connections keep dropping is retried, then ConnectionError", async () => {
  await withFake(
    async (fake) => {
      await using client = await Client.connect(fake.addr, { retryEveryMs: 50, retryForMs: 600, redialIntervalMs: 50 });
      const t0 = performance.now();
      await assert.rejects(client.release("k", 1n), ConnectionError);
      const took = performance.now() - t0;
      assert.ok(took >= 500 && took < 3000, `took ${took} ms`);
      assert.ok(fake.lines.filter((l) => l === "R k 1").length >= 3, "retried");
    },
    (line, sock) => {
      if (line.startsWith("R ")) sock.destroy();
    },
  );
});

test("a try-lock always asks the node, even after a slow turn of the event loop", async () => {
  await withFake(
    async (fake) => {
      await using client = await Client.connect(fake.addr);
      const p = client.tryAcquire("k", { leaseMs: 1000 });
      // Block the event loop well past the try's 1 ms wait before the
      // acquire goes on: the node, not the client's clock, says "held".
      const until = performance.now() + 20;
      while (performance.now() < until);
      assert.equal((await p)?.token, 5n);
      assert.ok(fake.lines.includes("A k 1 0.001"), fake.lines.join("|"));
    },
    (line, sock) => {
      if (line.startsWith("A ")) sock.write("A k 5\n");
    },
  );
});

test("a renewing lock with a lease under 3 s whose node goes silent is lost by the end of its lease", async () => {
  const fake = await FakeServer.start();
  let silent = false;
  fake.onLine = (line, sock) => {
    if (silent) return;
    if (line === "S") sock.write(`S active ${fake.addr} 1\n`);
    else if (line.startsWith("A ")) {
      sock.write("A k 9\n");
      silent = true;
    }
  };
  try {
    await using client = await Client.connect(fake.addr);
    await poll("both up", () => client.connected() === 2);
    const t0 = performance.now();
    const lock = await client.lock("k", { leaseMs: 1200 });
    const lost = await new Promise<number>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error("not lost within 5 s")), 5000);
      lock.signal.addEventListener(
        "abort",
        () => {
          clearTimeout(timer);
          resolve(performance.now());
        },
        { once: true },
      );
    });
    const took = lost - t0;
    assert.ok(lock.lost !== null && !lock.lost.refused);
    // The lease runs out 1.2 s after the acquire was sent (at the latest);
    // the loss is said then, not a request timeout (2 s) after the first renewal.
    assert.ok(took >= 1150 && took < 1450, `lost ${took} ms after the acquire`);
    assert.ok(fake.lines.some((l) => l.startsWith("N k 9 ")), "a renewal was tried");
  } finally {
    await fake.close();
  }
});

test("G and C answers are matched by op and key, whatever their order", async () => {
  const held: Array<{ line: string; sock: net.Socket }> = [];
  await withFake(async (fake) => {
    // One connection only (the second gets no hello): one matcher for every request.
    let first: net.Socket | undefined;
    fake.onLine = (line, sock) => {
      if (line === "S") {
        first ??= sock;
        if (sock === first) sock.write(`S active ${fake.addr} 1\n`);
      } else held.push({ line, sock });
    };
    await using client = await Client.connect(fake.addr, { probeTimeoutMs: 200 });
    await poll("the second dial given up", () => client.connected() === 1 && fake.lines.length >= 2);
    const a = client.acquire("x", { leaseMs: 1000 });
    const g = client.acquire("x", { leaseMs: 1000, shared: true });
    const c1 = client.acquire("x", { leaseMs: 1000, permits: 2 });
    const c2 = client.acquire("y", { leaseMs: 1000, permits: 2, waitMs: 500 });
    await poll("four acquires at the fake", () => held.length === 4);
    assert.deepEqual(
      held.map((h) => h.line),
      ["A x 1 0", "G x 1 0", "C x 2 1 0", "C y 2 1 0.5"],
    );
    const sock = held[0]!.sock;
    // Answered newest first: each goes to the oldest pending request of its op and key.
    sock.write("C y 0\nC x semaphore 5\nG x 333\nA x 222\n");
    assert.equal(await c2, null, "C y 0: the wait ran out");
    await assert.rejects(c1, (e: unknown) => e instanceof WrongKindError && e.limit === 5);
    assert.equal((await g)?.token, 333n);
    assert.equal((await a)?.token, 222n);
  });
});

test("a malformed G or C answer is a ProtocolError, and the client goes on", async () => {
  const answers = [
    "G k lock\n",
    "G k semaphore 0\n",
    "C k semaphore 65537\n",
    "G k semaphore\n",
    "G k -1\n",
    "C k 18446744073709551616\n",
    "C k lock 1\n",
    "G k 1 2\n",
    "C k 7\n", // a C answer to a G: matches no pending request
    "A k 7\n", // an A answer to a G
    "T k\n",
    "G k " + "1".repeat(5000) + "\n",
  ];
  for (const answer of answers) {
    let first = true;
    await withFake(
      async (fake) => {
        await using client = await Client.connect(fake.addr, { redialIntervalMs: 100 });
        await assert.rejects(
          client.acquire("k", { leaseMs: 1000, shared: true }),
          ProtocolError,
          JSON.stringify(answer.slice(0, 30)),
        );
        await poll("both connections up again", () => client.connected() === 2, 3000);
        // A well-formed answer on the new connections is taken.
        const g = await client.acquire("k", { leaseMs: 1000, shared: true });
        assert.equal(g?.token, 42n);
      },
      (line, sock) => {
        if (!line.startsWith("G ")) return;
        sock.write(first ? answer : "G k 42\n");
        first = false;
      },
    );
  }
});

for (const refusal of [
  {
    what: "the E that refuses an exclusive acquire of a semaphore key: WrongKindError for its A",
    request: "A pool/x ",
    acquire: (c: Client) => c.acquire("pool/x", { leaseMs: 1000 }),
    reason: 'key "pool/x" is a semaphore of 4 permits: acquire it with C in line 5',
    check: (e: unknown): boolean => {
      assert.ok(e instanceof WrongKindError, String(e));
      assert.equal(e.limit, 4);
      assert.equal(e.key, "pool/x");
      assert.match(e.message, /semaphore of 4 permits/);
      return true;
    },
  },
  {
    what: "the E of a node that predates G and C: ProtocolError for the C",
    request: "C pool/x ",
    acquire: (c: Client) => c.acquire("pool/x", { leaseMs: 1000, permits: 3 }),
    reason: 'unknown op "C" in line 5',
    check: (e: unknown): boolean => {
      assert.ok(e instanceof ProtocolError, String(e));
      assert.match(e.message, /unknown op "C"/);
      return true;
    },
  },
  {
    what: "the E of a node with peers that refuses G and C: ProtocolError for the G",
    request: "G pool/x ",
    acquire: (c: Client) => c.acquire("pool/x", { leaseMs: 1000, shared: true }),
    reason: "shared locks and semaphores are not replicated yet: a node with --peers refuses G and C in line 5",
    check: (e: unknown): boolean => {
      assert.ok(e instanceof ProtocolError, String(e));
      assert.match(e.message, /not replicated yet/);
      return true;
    },
  },
]) {
  test(`${refusal.what}; the others on that connection go on`, async () => {
    let broke = false;
    const early: Array<{ line: string; sock: net.Socket }> = [];
    const answer = (line: string, sock: net.Socket): void => {
      if (line.startsWith("A y ")) sock.write("A y 11\n");
      else if (line.startsWith("A z ")) sock.write("A z 12\n");
      else if (line.startsWith("R w ")) sock.write("R w 1\n");
    };
    await withFake(
      async (fake) => {
        await using client = await Client.connect(fake.addr, { redialIntervalMs: 100 });
        await poll("both connections up", () => client.connected() === 2);
        // Waiting acquires and a release, pipelined with the refused acquire.
        const y = client.acquire("y", { leaseMs: 1000, waitMs: 3000 });
        const z = client.acquire("z", { leaseMs: 1000 });
        const r = client.release("w", 5n);
        await assert.rejects(refusal.acquire(client), refusal.check);
        assert.equal((await y)?.token, 11n, "asked again on a connection the node did not break");
        assert.equal((await z)?.token, 12n);
        assert.equal(await r, true);
        const asked = fake.lines.filter((l) => /^(A y|A z|R w) /.test(l)).length;
        assert.ok(asked > 3, `the requests that shared the broken connection were sent again (${asked} sent)`);
      },
      (line, sock) => {
        if (line.startsWith(refusal.request)) {
          broke = true;
          sock.write(`E ${refusal.reason}\n`);
          sock.end();
          // What the other connection carried is answered now; what this one carried is not.
          for (const e of early) if (e.sock !== sock) answer(e.line, e.sock);
          return;
        }
        if (broke) answer(line, sock);
        else early.push({ line, sock });
      },
    );
  });
}
