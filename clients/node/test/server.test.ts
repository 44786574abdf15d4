// The client against the real ringlock server (one node on a free port).

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import {
  Client,
  ClosedError,
  ConnectionError,
  InvalidArgumentError,
  LockLostError,
  LockTimeoutError,
  listLocks,
  nodeProblem,
  nodeStatus,
  RinglockError,
} from "../src/index.js";
import { failOnUnhandledRejections, type Server, startServer } from "./helpers.js";

failOnUnhandledRejections();

let server: Server;
let client: Client;

before(async () => {
  server = await startServer();
  client = await Client.connect([server.addr]);
});

after(async () => {
  await client.close();
  await server.kill();
});

test("acquire, release: tokens are bigints above 2^53 and grow", async () => {
  const a = await client.acquire("t/basic", { leaseMs: 5000 });
  assert.ok(a !== null);
  assert.equal(typeof a.token, "bigint");
  assert.ok(a.token > 2n ** 53n);
  assert.equal(a.key, "t/basic");
  assert.equal(await client.release(a.key, a.token), true);
  assert.equal(await client.release(a.key, a.token), false);
  const b = await client.acquire("t/basic", { leaseMs: 5000 });
  assert.ok(b !== null && b.token > a.token);
  assert.equal(await client.release("t/basic", b.token), true);
  assert.equal(client.connections(), 2, "one address: two connections");
});

test("try-lock: null while someone holds it, a Lock once free", async () => {
  const held = await client.lock("t/try", { leaseMs: 5000 });
  assert.equal(await client.tryLock("t/try", { leaseMs: 5000 }), null);
  assert.equal(await client.tryAcquire("t/try", { leaseMs: 5000 }), null);
  assert.equal(await held.release(), true);
  const got = await client.tryLock("t/try", { leaseMs: 5000 });
  assert.ok(got !== null && got.token > held.token);
  assert.equal(await got.release(), true);
});

test("await using releases at the end of the scope, once", async () => {
  let token: bigint;
  {
    await using lock = await client.lock("t/using", { leaseMs: 5000 });
    token = lock.token;
    assert.equal(await client.tryLock("t/using"), null);
  }
  assert.equal(await client.release("t/using", token), false, "already released by the scope");
  const lock = await client.lock("t/using", { leaseMs: 5000 });
  await lock[Symbol.asyncDispose]();
  await lock[Symbol.asyncDispose]();
  assert.equal(await lock.release(), false);
  assert.ok(await client.tryLock("t/using", { renew: false }), "free again");
});

test("a wait that runs out: LockTimeoutError from lock(), null from acquire()", async () => {
  const held = await client.acquire("t/wait", { leaseMs: 5000 });
  assert.ok(held);
  const t0 = performance.now();
  assert.equal(await client.acquire("t/wait", { leaseMs: 1000, waitMs: 200 }), null);
  const took = performance.now() - t0;
  assert.ok(took >= 190 && took < 3000, `took ${took} ms`);
  await assert.rejects(client.lock("t/wait", { waitMs: 100 }), (e: unknown) => {
    assert.ok(e instanceof LockTimeoutError && e instanceof RinglockError);
    assert.equal(e.kind, "timeout");
    return true;
  });
  await client.release("t/wait", held.token);
});

test("FIFO: waiters are granted in the order they asked", async () => {
  const first = await client.acquire("t/fifo", { leaseMs: 5000 });
  assert.ok(first);
  const order: number[] = [];
  const waiters: Array<Promise<void>> = [];
  for (const i of [0, 1, 2, 3]) {
    waiters.push(
      (async () => {
        const g = await client.acquire("t/fifo", { leaseMs: 5000, waitMs: 5000 });
        order.push(i);
        assert.ok(g);
        await client.release("t/fifo", g.token);
      })(),
    );
    // The next one asks after this one has reached the server (the two
    // connections are two queues in the network, not one).
    await client.sync();
  }
  await client.release("t/fifo", first.token);
  await Promise.all(waiters);
  assert.deepEqual(order, [0, 1, 2, 3]);
});

test("a renewing lock outlives its lease; its signal aborts when the grant is lost", async () => {
  const lock = await client.lock("t/renew", { leaseMs: 600 });
  await new Promise((r) => setTimeout(r, 1500));
  assert.ok(lock.renewals >= 2, `renewals: ${lock.renewals}`);
  assert.equal(lock.signal.aborted, false);
  assert.equal(await client.tryLock("t/renew"), null, "still held after 2.5 leases");
  // Someone releases it with the token: the next renewal is refused.
  assert.equal(await client.release(lock.key, lock.token), true);
  const reason = await new Promise<unknown>((res) => lock.signal.addEventListener("abort", () => res(lock.signal.reason)));
  assert.ok(reason instanceof LockLostError);
  assert.equal(reason.refused, true);
  assert.equal(lock.lost, reason);
  assert.throws(() => lock.throwIfLost(), LockLostError);
  assert.equal(await lock.release(), false);
});

test("a lock without renewal aborts its signal when its lease could have run out", async () => {
  const lock = await client.lock("t/norenew", { leaseMs: 300, renew: false });
  const t0 = performance.now();
  await new Promise((res) => lock.signal.addEventListener("abort", res));
  assert.ok(performance.now() - t0 >= 250);
  assert.ok(lock.lost instanceof LockLostError && !lock.lost.refused);
  assert.ok(await client.lock("t/norenew", { waitMs: 2000, leaseMs: 1000 }), "the server let it expire");
});

test("aborting a waiting acquire rejects with the signal's reason; a later grant is released at once", async () => {
  const held = await client.acquire("t/abort", { leaseMs: 5000 });
  assert.ok(held);
  const ac = new AbortController();
  const waiting = client.acquire("t/abort", { leaseMs: 5000, signal: ac.signal });
  await client.sync();
  ac.abort(new Error("no longer needed"));
  await assert.rejects(waiting, /no longer needed/);
  // The server still has the acquire queued; the release grants it, and
  // the client gives it back at once, so a third party gets the lock.
  await client.release("t/abort", held.token);
  const next = await client.acquire("t/abort", { leaseMs: 5000, waitMs: 3000 });
  assert.ok(next, "the abandoned grant was released");
  await client.release("t/abort", next.token);
  // An already aborted signal: nothing is sent.
  await assert.rejects(client.acquire("t/abort", { leaseMs: 10, signal: AbortSignal.abort() }), { name: "AbortError" });
});

test("arguments are checked before anything is sent", async () => {
  const bad: Array<() => Promise<unknown>> = [
    () => client.acquire("", { leaseMs: 1000 }),
    () => client.acquire("has space", { leaseMs: 1000 }),
    () => client.acquire("x".repeat(251), { leaseMs: 1000 }),
    () => client.acquire("k", { leaseMs: 0 }),
    () => client.acquire("k", { leaseMs: 86_400_001 }),
    () => client.acquire("k", { leaseMs: 1000, waitMs: 0 }),
    () => client.release("k", 0n),
    () => client.release("k", 2n ** 64n),
    () => client.renew("k", 1n, -1),
  ];
  for (const f of bad) await assert.rejects(f(), InvalidArgumentError);
  await assert.rejects(Client.connect([]), InvalidArgumentError);
  await assert.rejects(Client.connect(["nohost"]), InvalidArgumentError);
});

test("keys are bytes: a string and its UTF-8 bytes are the same lock", async () => {
  const g = await client.acquire("clé", { leaseMs: 5000 });
  assert.ok(g);
  assert.equal(await client.tryAcquire(Buffer.from("clé", "utf8"), { leaseMs: 1000 }), null);
  assert.equal(await client.release(new Uint8Array(Buffer.from("clé")), g.token), true);
});

test("renew moves the lease; false once the grant is gone", async () => {
  const g = await client.acquire("t/renew2", { leaseMs: 300 });
  assert.ok(g);
  assert.equal(await client.renew(g.key, g.token, 5000), true);
  await new Promise((r) => setTimeout(r, 500));
  assert.equal(await client.tryAcquire(g.key, { leaseMs: 100 }), null, "renewed past its first lease");
  assert.equal(await client.release(g.key, g.token), true);
  assert.equal(await client.renew(g.key, g.token, 5000), false);
});

test("status, nodeStatus, nodeProblem, listLocks", async () => {
  const statuses = await client.status();
  assert.equal(statuses.length, 1);
  assert.equal(statuses[0]!.status?.role, "active");
  const st = await nodeStatus(server.addr);
  assert.equal(st.role, "active");
  assert.equal(st.active, server.addr);
  assert.equal(await nodeProblem(server.addr), null);
  const a = await client.acquire("list/a", { leaseMs: 20_000 });
  const b = await client.acquire("list/b", { leaseMs: 20_000 });
  assert.ok(a && b);
  const waiting = client.acquire("list/a", { leaseMs: 1000, waitMs: 3000 });
  await client.sync();
  const page = await listLocks(server.addr, { prefix: "list/" });
  assert.equal(page.cursor, 0n);
  const byKey = new Map(page.locks.map((l) => [l.key, l]));
  assert.equal(byKey.get("list/a")?.token, a.token);
  assert.equal(byKey.get("list/a")?.waiters, 1n);
  assert.equal(byKey.get("list/b")?.token, b.token);
  assert.ok((byKey.get("list/b")?.leaseMs ?? 0n) > 15_000n);
  // Paging with a limit of one lists each lock once.
  const seen: string[] = [];
  let cursor = 0n;
  do {
    const p = await listLocks(server.addr, { prefix: "list/", limit: 1, cursor });
    seen.push(...p.locks.map((l) => l.key));
    cursor = p.cursor;
  } while (cursor !== 0n);
  assert.deepEqual(seen.sort(), ["list/a", "list/b"]);
  await client.release("list/a", a.token);
  const w = await waiting;
  assert.ok(w);
  await client.release("list/a", w.token);
  await client.release("list/b", b.token);
});

test("many concurrent acquires pipeline on the connections", async () => {
  const grants = await Promise.all(
    Array.from({ length: 500 }, (_, i) => client.acquire(`t/many/${i}`, { leaseMs: 5000 })),
  );
  const tokens = new Set(grants.map((g) => g!.token));
  assert.equal(tokens.size, 500);
  const released = await Promise.all(grants.map((g) => client.release(g!.keyBytes, g!.token)));
  assert.ok(released.every((r) => r));
});

test("a closed client refuses calls with ClosedError; connecting to nothing is a ConnectionError", async () => {
  const c = await Client.connect(server.addr);
  const held = await c.acquire("t/closed", { leaseMs: 5000 });
  assert.ok(held);
  const waiting = c.acquire("t/closed", { leaseMs: 1000 });
  await c.sync();
  await c.close();
  await assert.rejects(waiting, ClosedError);
  await assert.rejects(c.acquire("t/closed", { leaseMs: 1000 }), ClosedError);
  await client.release("t/closed", held.token);
  const t0 = performance.now();
  await assert.rejects(Client.connect("127.0.0.1:1", { connectTimeoutMs: 1000 }), (e: unknown) => {
    assert.ok(e instanceof ConnectionError);
    assert.match(e.message, /127\.0\.0\.1:1/);
    return true;
  });
  assert.ok(performance.now() - t0 < 3000);
});

test("close() does not wait for the locks it holds: their renewals stop, their leases run out", async () => {
  const c = await Client.connect(server.addr);
  const renewed = await c.lock("t/close-renewed", { leaseMs: 30_000 });
  const plain = await c.lock("t/close-plain", { leaseMs: 30_000, renew: false });
  const t0 = performance.now();
  await c.close();
  assert.ok(performance.now() - t0 < 1500, `close took ${performance.now() - t0} ms`);
  assert.equal(renewed.lost, null);
  assert.equal(plain.lost, null);
  await renewed[Symbol.asyncDispose](); // a closed client: left to its lease, quietly
  assert.equal(await client.tryLock("t/close-renewed"), null, "still held: nobody released it");
  await client.release("t/close-renewed", renewed.token);
  await client.release("t/close-plain", plain.token);
});
