// The client against fake nodes: the node an `M` names is dialled at once
// when the client has no live connection to it (one dial at a time, failed
// ones backed off), and releases retry at once only toward a node not named
// before.

import assert from "node:assert/strict";
import type * as net from "node:net";
import { test } from "node:test";

import { KICK_BACKOFF_MAX_MS, KICK_BACKOFF_MIN_MS } from "../src/client.js";
import { Client, ConnectionError, RinglockError } from "../src/index.js";
import { failOnUnhandledRejections, FakeServer, poll } from "./helpers.js";

failOnUnhandledRejections();

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Runs `f` with a standby that answers every A, R and N with `M key <to>` (or `M key -`). */
async function withNodes(f: (s: FakeServer, a: FakeServer) => Promise<void>): Promise<void> {
  const s = await FakeServer.start();
  const a = await FakeServer.start();
  s.onLine = (line, sock) => {
    if (line === "S") sock.write(`S standby ${a.addr} 1\n`);
    else if (/^[ARN] /.test(line)) sock.write(`M ${line.split(" ")[1]} ${a.addr}\n`);
  };
  try {
    await f(s, a);
  } finally {
    await Promise.all([s.close(), a.close()]);
  }
}

/** `a` answers its hello, grants A and answers R and N with 1. */
function serving(a: FakeServer): void {
  a.onLine = (line, sock) => {
    const [op, key] = line.split(" ");
    if (line === "S") sock.write(`S active ${a.addr} 1\n`);
    else if (op === "A") sock.write(`A ${key} 42\n`);
    else if (op === "R" || op === "N") sock.write(`${op} ${key} 1\n`);
  };
}

test("an M naming a known node that was down is dialled at once, not at its next redial", async () => {
  await withNodes(async (s, a) => {
    serving(a);
    await a.stop();
    // The default redial interval, 3 s: the acquire must not wait for it.
    await using client = await Client.connect([s.addr, a.addr]);
    // Let the first dial of a be refused; then a comes back.
    await sleep(300);
    await a.listen();
    const t0 = performance.now();
    const g = await client.acquire("k", { leaseMs: 5000, waitMs: 2500 });
    const took = performance.now() - t0;
    assert.equal(g?.token, 42n);
    assert.ok(took < 1200, `granted after ${took} ms`);
    assert.equal(a.accepts.length, 1, "one dial, the one M asked for");
    assert.equal(a.lines.filter((l) => l.startsWith("A k")).length, 1);
  });
});

test("a release answered M for a known node that was down completes there within its own deadline", async () => {
  await withNodes(async (s, a) => {
    serving(a);
    await a.stop();
    await using client = await Client.connect([s.addr, a.addr], { retryForMs: 1500 });
    await sleep(300);
    await a.listen();
    const t0 = performance.now();
    assert.equal(await client.release("k", 1796000000000000123n), true);
    const took = performance.now() - t0;
    assert.ok(took < 1400, `released after ${took} ms`);
    assert.deepEqual(
      a.lines.filter((l) => l.startsWith("R ")),
      ["R k 1796000000000000123"],
    );
  });
});

test("a burst of M answers naming a node that does not answer its hello is one dial, shared", async () => {
  await withNodes(async (s, a) => {
    // a accepts connections and never answers.
    a.onLine = () => undefined;
    await using client = await Client.connect([s.addr, a.addr], { probeTimeoutMs: 300, acquireGraceMs: 100 });
    // The first dial of a fails when its hello goes unanswered.
    await poll("a's first dial", () => a.accepts.length === 1);
    await poll("a's first dial given up", () => a.sockets.size === 0, 2000);
    const t0 = performance.now();
    const results = await Promise.allSettled(
      Array.from({ length: 20 }, (_, i) => client.acquire(`k${i}`, { leaseMs: 1000, waitMs: 300 })),
    );
    const took = performance.now() - t0;
    // Nothing is granted: each ends by its wait (null) or with an error.
    for (const r of results) {
      if (r.status === "fulfilled") assert.equal(r.value, null);
      else assert.ok(r.reason instanceof RinglockError, String(r.reason));
    }
    // The burst's dial takes the 300 ms hello timeout; one more may start
    // 50 ms after it failed, before the acquires' 400 ms run out.
    const dials = a.accepts.filter((t) => t >= t0).length;
    assert.ok(dials >= 1 && dials <= 2, `${dials} dials for 20 requests that met M`);
    assert.equal(a.mostOpen, 1, "never two dials at once");
    // Every request waited for that dial instead of asking the standby again at once.
    const asked = s.lines.filter((l) => l.startsWith("A ")).length;
    assert.ok(asked <= 60, `the standby was asked ${asked} times`);
    assert.ok(took < 2000, `took ${took} ms`);
  });
});

for (const [name, onAccept] of [
  ["refuse the hello (closed at once)", (sock: net.Socket) => sock.destroy()],
  ["drop the connection right after the hello", null],
] as const) {
  test(`dials M asks for that ${name} are backed off from 50 ms, doubling, up to 1 s`, async () => {
    await withNodes(async (s, a) => {
      await using client = await Client.connect([s.addr, a.addr], { acquireGraceMs: 50 });
      await poll("a's first dial", () => a.accepts.length === 1);
      if (onAccept !== null) {
        a.onAccept = onAccept;
      } else {
        a.onLine = (line, sock) => {
          if (line === "S") sock.end(`S active ${a.addr} 1\n`);
        };
      }
      await a.stop();
      await a.listen();
      const t0 = performance.now();
      // A new acquire every 20 ms for 1.7 s, each meeting M for a at once.
      const calls: Array<Promise<unknown>> = [];
      while (performance.now() - t0 < 1700) {
        calls.push(client.acquire("k", { leaseMs: 1000, waitMs: 50 }).catch(() => undefined));
        await sleep(20);
      }
      await Promise.all(calls);
      const at = a.accepts.filter((t) => t >= t0);
      // 0, 50, 150, 350, 750, 1550 ms: each gap at least twice the last.
      assert.ok(at.length >= 4 && at.length <= 6, `${at.length} dials: ${at.map((t) => Math.round(t - t0)).join(", ")}`);
      for (let i = 1; i < at.length; i++) {
        const gap = at[i]! - at[i - 1]!;
        const least = Math.min(KICK_BACKOFF_MIN_MS * 2 ** (i - 1), KICK_BACKOFF_MAX_MS);
        assert.ok(gap >= least - 1, `gap ${i}: ${gap} ms, at least ${least} ms`);
      }
    });
  });
}

test("a release retries at once only toward a node no earlier M of its named", async () => {
  const s = await FakeServer.start();
  const a = await FakeServer.start();
  const times: number[] = [];
  // s and a each say the other is active.
  for (const [me, other] of [
    [s, a],
    [a, s],
  ] as const) {
    me.onLine = (line, sock) => {
      if (line === "S") sock.write(`S standby ${other.addr} 1\n`);
      else if (line.startsWith("R ")) {
        times.push(performance.now());
        sock.write(`M k ${other.addr}\n`);
      }
    };
  }
  try {
    await using client = await Client.connect([s.addr, a.addr], { retryEveryMs: 200, retryForMs: 900 });
    await poll("both up", () => client.connected() === 2);
    await assert.rejects(client.release("k", 5n), RinglockError);
    // The first node, the one its M named, the one that M named: at once.
    // Then both were named before: every 200 ms.
    assert.ok(times.length >= 5, `${times.length} attempts`);
    assert.ok(times[2]! - times[0]! < 150, `the first three: ${times.map((t) => Math.round(t - times[0]!)).join(", ")}`);
    for (let i = 3; i < times.length; i++) {
      assert.ok(times[i]! - times[i - 1]! >= 195, `attempt ${i} ${Math.round(times[i]! - times[i - 1]!)} ms after the one before`);
    }
  } finally {
    await Promise.all([s.close(), a.close()]);
  }
});

test("a try-lock redirected by M asks the node it names, though its 1 ms wait ran out meanwhile", async () => {
  await withNodes(async (s, a) => {
    serving(a);
    // A standby that has not heard of an active yet when the client says
    // hello, and redirects the acquire: the node its M names is dialled (a
    // dial and a hello, far longer than the try's 1 ms), then asked.
    const redirect = s.onLine;
    s.onLine = (line, sock) => (line === "S" ? sock.write("S standby - 1\n") : redirect?.(line, sock));
    await using client = await Client.connect([s.addr]);
    const g = await client.tryAcquire("k", { leaseMs: 5000 });
    assert.equal(g?.token, 42n);
    assert.deepEqual(
      a.lines.filter((l) => l.startsWith("A ")),
      ["A k 5 0.001"],
    );
  });
});

test("an M key - met by a try-lock is asked again after the back-off, not taken for a held lock", async () => {
  const s = await FakeServer.start();
  let answered = 0;
  s.onLine = (line, sock) => {
    if (line === "S") sock.write(`S active ${s.addr} 1\n`);
    else if (line.startsWith("A ")) sock.write(answered++ === 0 ? "M k -\n" : "A k 7\n");
  };
  try {
    await using client = await Client.connect([s.addr]);
    const t0 = performance.now();
    const g = await client.tryAcquire("k", { leaseMs: 5000 });
    const took = performance.now() - t0;
    assert.equal(g?.token, 7n);
    assert.ok(took >= 45 && took < 1000, `granted after ${took} ms (a 50 ms back-off)`);
    assert.deepEqual(
      s.lines.filter((l) => l.startsWith("A ")),
      ["A k 5 0.001", "A k 5 0.001"],
    );
  } finally {
    await s.close();
  }
});

test("an acquire redirected to a node that cannot be reached ends by its wait plus grace with a ConnectionError naming it", async () => {
  await withNodes(async (s, a) => {
    await a.stop();
    await using client = await Client.connect([s.addr], { connectTimeoutMs: 200 });
    const t0 = performance.now();
    await assert.rejects(client.acquire("k", { leaseMs: 5000, waitMs: 500 }), (e: unknown) => {
      assert.ok(e instanceof ConnectionError, String(e));
      assert.ok(e.message.includes(`redirected to ${a.addr}, which could not be reached`), e.message);
      return true;
    });
    const took = performance.now() - t0;
    assert.ok(took >= 450 && took < 2500, `ended after ${took} ms (wait 500 ms, grace 1 s)`);
  });
});
