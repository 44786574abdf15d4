// Shared locks and semaphores against the real ringlock server (one node
// on a free port): readers hold together, a writer waits for them, a reader
// behind a waiting writer waits for the writer; a semaphore never has more
// holders than its limit; tokens grow in grant order; refusals of the other
// kind; renewal, the loss signal, disposal and the abandoned-grant release
// as exclusive locks have them.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import {
  Client,
  type Grant,
  InvalidArgumentError,
  LockLostError,
  LockTimeoutError,
  RinglockError,
  WrongKindError,
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

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** A promise's outcome so far, without waiting for it. */
function watch<T>(p: Promise<T>): { done: () => boolean; value: Promise<T> } {
  let settled = false;
  const value = p.finally(() => {
    settled = true;
  });
  return { done: () => settled, value };
}

test("readers hold together, a writer waits for them, a reader behind the waiting writer waits for the writer", async () => {
  const r1 = await client.acquire("rw/cfg", { leaseMs: 10_000, shared: true });
  const r2 = await client.acquire("rw/cfg", { leaseMs: 10_000, shared: true });
  assert.ok(r1 !== null && r2 !== null, "two readers at once");
  assert.ok(r2.token > r1.token);
  // An exclusive acquire does not get it while readers hold it.
  assert.equal(await client.tryAcquire("rw/cfg", { leaseMs: 1000 }), null);
  const writer = watch(client.acquire("rw/cfg", { leaseMs: 10_000, waitMs: 10_000 }));
  await client.sync(); // the writer's A has reached the server
  // A reader that arrives behind the waiting writer waits, although the key is held shared.
  assert.equal(await client.tryAcquire("rw/cfg", { leaseMs: 1000, shared: true }), null);
  const reader = watch(client.acquire("rw/cfg", { leaseMs: 10_000, waitMs: 10_000, shared: true }));
  await client.sync();
  assert.equal(await client.release("rw/cfg", r1.token), true);
  await client.sync();
  assert.equal(writer.done(), false, "one reader still holds it");
  assert.equal(await client.release("rw/cfg", r2.token), true);
  const w = await writer.value;
  assert.ok(w !== null && w.token > r2.token, "the writer goes once the last reader left");
  assert.equal(reader.done(), false, "the later reader waits for the writer");
  assert.equal(await client.release("rw/cfg", w.token), true);
  const r3 = await reader.value;
  assert.ok(r3 !== null && r3.token > w.token);
  assert.equal(await client.release("rw/cfg", r3.token), true);
});

test("a semaphore of 2 never has more than 2 holders among 5 concurrent acquirers; tokens grow in grant order", async () => {
  const clients = await Promise.all(Array.from({ length: 5 }, () => Client.connect([server.addr])));
  try {
    let holding = 0;
    let most = 0;
    // Every grant seen, and every release confirmed, in the order the
    // client saw them: a grant seen after a release was confirmed was made
    // after that release, so its token is above the released one.
    const events: Array<{ grant: bigint } | { released: bigint }> = [];
    await Promise.all(
      clients.map(async (c) => {
        for (let round = 0; round < 2; round++) {
          const lock = await c.lock("sem/pool", { permits: 2, leaseMs: 10_000, waitMs: 20_000 });
          holding += 1;
          most = Math.max(most, holding);
          events.push({ grant: lock.token });
          await sleep(100); // the work done under the permit
          holding -= 1;
          assert.equal(await lock.release(), true);
          events.push({ released: lock.token });
        }
      }),
    );
    assert.ok(most <= 2, `${most} holders at once`);
    assert.equal(most, 2, "two permits were held at once");
    const grants = events.flatMap((e) => ("grant" in e ? [e.grant] : []));
    assert.equal(new Set(grants).size, 10, "each permit has its own token");
    let releasedMax = 0n;
    for (const e of events) {
      if ("released" in e) {
        if (e.released > releasedMax) releasedMax = e.released;
      } else {
        assert.ok(e.grant > releasedMax, `token ${e.grant} granted after ${releasedMax} was released`);
      }
    }
  } finally {
    await Promise.all(clients.map((c) => c.close()));
  }
});

test("tokens strictly increase in grant order, across kinds", async () => {
  const seq: bigint[] = [];
  for (const opts of [{ shared: true }, { permits: 3 }, {}, { shared: true }, { permits: 1 }, {}]) {
    const g = await client.acquire("order/k", { leaseMs: 5000, ...opts });
    assert.ok(g !== null);
    seq.push(g.token);
    assert.equal(await client.release("order/k", g.token), true);
  }
  for (let i = 1; i < seq.length; i++) assert.ok(seq[i]! > seq[i - 1]!, `${seq[i]} after ${seq[i - 1]}`);
  // Hand-off: three permits queued behind one; each release grants the next, with a higher token.
  const first = await client.acquire("order/h", { leaseMs: 5000, permits: 1 });
  assert.ok(first !== null);
  const waiting: Array<Promise<Grant | null>> = [];
  for (let i = 0; i < 3; i++) {
    waiting.push(client.acquire("order/h", { leaseMs: 5000, permits: 1, waitMs: 10_000 }));
    await client.sync(); // in this order on the server
  }
  let last = first;
  for (const w of waiting) {
    assert.equal(await client.release("order/h", last.token), true);
    const g = await w;
    assert.ok(g !== null && g.token > last.token, "granted in queue order, each above the last");
    last = g;
  }
  assert.equal(await client.release("order/h", last.token), true);
});

test("the other kind is refused with WrongKindError and changes nothing", async () => {
  const p = await client.acquire("kind/sem", { leaseMs: 10_000, permits: 3 });
  assert.ok(p !== null);
  await assert.rejects(client.acquire("kind/sem", { leaseMs: 1000, permits: 4 }), (e: unknown) => {
    assert.ok(e instanceof WrongKindError && e instanceof RinglockError);
    assert.equal(e.kind, "wrong_kind");
    assert.equal(e.limit, 3);
    assert.equal(e.key, "kind/sem");
    assert.match(e.message, /semaphore of 3 permits/);
    return true;
  });
  await assert.rejects(client.lock("kind/sem", { shared: true, waitMs: 1000 }), (e: unknown) => {
    assert.ok(e instanceof WrongKindError);
    assert.equal(e.limit, 3);
    return true;
  });
  await assert.rejects(client.tryLock("kind/sem", { shared: true }), WrongKindError);
  const lock = await client.acquire("kind/lock", { leaseMs: 10_000 });
  assert.ok(lock !== null);
  await assert.rejects(client.acquire("kind/lock", { leaseMs: 1000, permits: 2 }), (e: unknown) => {
    assert.ok(e instanceof WrongKindError);
    assert.equal(e.limit, 0);
    assert.match(e.message, /as a lock/);
    return true;
  });
  const shared = await client.acquire("kind/shared", { leaseMs: 10_000, shared: true });
  assert.ok(shared !== null);
  await assert.rejects(client.tryAcquire("kind/shared", { leaseMs: 1000, permits: 1 }), WrongKindError);
  // Nothing changed: the permit and the locks are held, the semaphore keeps its limit.
  const p2 = await client.acquire("kind/sem", { leaseMs: 10_000, permits: 3 });
  assert.ok(p2 !== null && p2.token > p.token);
  for (const [k, g] of [["kind/sem", p], ["kind/sem", p2], ["kind/lock", lock], ["kind/shared", shared]] as const) {
    assert.equal(await client.release(k, g.token), true, k);
  }
  // A key with no holder and no waiter is nobody's kind: the next acquire decides.
  const again = await client.acquire("kind/sem", { leaseMs: 1000 });
  assert.ok(again !== null);
  assert.equal(await client.release("kind/sem", again.token), true);
});

test("an exclusive acquire of a semaphore key is WrongKindError (the node's E), and the client goes on", async () => {
  // A client of its own: the node breaks the connection that carried the A.
  await using c = await Client.connect([server.addr], { redialIntervalMs: 100 });
  const holder = await client.acquire("kind/sem2", { leaseMs: 10_000, permits: 2 });
  assert.ok(holder !== null);
  await assert.rejects(c.acquire("kind/sem2", { leaseMs: 1000, waitMs: 1000 }), (e: unknown) => {
    assert.ok(e instanceof WrongKindError, String(e));
    assert.equal(e.limit, 2);
    assert.match(e.message, /semaphore of 2 permits/);
    return true;
  });
  await assert.rejects(c.lock("kind/sem2"), WrongKindError);
  // The connections that carried them were broken by the node and are redialled; the client goes on.
  const other = await c.acquire("kind/other", { leaseMs: 1000, waitMs: 5000 });
  assert.ok(other !== null);
  assert.equal(await c.release("kind/other", other.token), true);
  assert.equal(await client.release("kind/sem2", holder.token), true);
});

test("bad limits and kinds are refused before anything is sent", async () => {
  const before = client.pendingRequests();
  const bad: Array<() => Promise<unknown>> = [
    () => client.acquire("k", { leaseMs: 1000, permits: 0 }),
    () => client.acquire("k", { leaseMs: 1000, permits: 65_537 }),
    () => client.acquire("k", { leaseMs: 1000, permits: 2.5 }),
    () => client.acquire("k", { leaseMs: 1000, permits: Number.NaN }),
    () => client.acquire("k", { leaseMs: 1000, permits: "2" as unknown as number }),
    () => client.acquire("k", { leaseMs: 1000, shared: true, permits: 2 }),
    () => client.acquire("k", { leaseMs: 1000, shared: "yes" as unknown as boolean }),
    () => client.tryAcquire("k", { leaseMs: 1000, permits: -1 }),
    () => client.lock("k", { permits: 1e9 }),
    () => client.tryLock("k", { shared: true, permits: 1 }),
  ];
  for (const f of bad) await assert.rejects(f(), InvalidArgumentError);
  assert.equal(client.pendingRequests(), before);
});

test("a wait that runs out: null from acquire, LockTimeoutError from lock, for both kinds", async () => {
  const w = await client.acquire("busy/k", { leaseMs: 10_000 });
  assert.ok(w !== null);
  const t0 = performance.now();
  assert.equal(await client.acquire("busy/k", { leaseMs: 1000, waitMs: 200, shared: true }), null);
  const took = performance.now() - t0;
  assert.ok(took >= 190 && took < 3000, `took ${took} ms`);
  await assert.rejects(client.lock("busy/k", { waitMs: 100, shared: true }), LockTimeoutError);
  assert.equal(await client.tryLock("busy/k", { shared: true }), null);
  const p = await client.acquire("busy/s", { leaseMs: 10_000, permits: 1 });
  assert.ok(p !== null);
  assert.equal(await client.acquire("busy/s", { leaseMs: 1000, waitMs: 150, permits: 1 }), null);
  await assert.rejects(client.lock("busy/s", { waitMs: 100, permits: 1 }), LockTimeoutError);
  assert.equal(await client.tryLock("busy/s", { permits: 1 }), null);
  assert.equal(await client.release("busy/k", w.token), true);
  assert.equal(await client.release("busy/s", p.token), true);
});

test("renewal keeps a shared lock and a permit alive past their lease; await using releases them", async () => {
  let tokens: bigint[];
  {
    await using reader = await client.lock("renew/doc", { leaseMs: 600, shared: true });
    await using permit = await client.lock("renew/sem", { leaseMs: 600, permits: 1 });
    await sleep(1500); // 2.5 leases
    assert.ok(reader.renewals >= 2 && permit.renewals >= 2, `renewals: ${reader.renewals}, ${permit.renewals}`);
    assert.equal(reader.signal.aborted || permit.signal.aborted, false);
    assert.equal(await client.tryAcquire("renew/doc", { leaseMs: 1000 }), null, "the reader still holds it");
    assert.equal(await client.tryAcquire("renew/sem", { leaseMs: 1000, permits: 1 }), null, "the permit is still held");
    tokens = [reader.token, permit.token];
  }
  // Released by the end of the scope: the grants are gone, the keys free at once.
  assert.equal(await client.release("renew/doc", tokens[0]!), false);
  assert.equal(await client.release("renew/sem", tokens[1]!), false);
  const w = await client.tryAcquire("renew/doc", { leaseMs: 1000 });
  assert.ok(w !== null);
  assert.equal(await client.release("renew/doc", w.token), true);
});

test("a shared lock's signal aborts with a LockLostError when the server no longer has its grant", async () => {
  const lock = await client.lock("lost/doc", { leaseMs: 600, shared: true });
  // Released by token elsewhere: the next renewal is refused.
  assert.equal(await client.release(lock.key, lock.token), true);
  const reason = await new Promise<unknown>((res) => lock.signal.addEventListener("abort", () => res(lock.signal.reason)));
  assert.ok(reason instanceof LockLostError);
  assert.equal(reason.refused, true);
  assert.equal(await lock.release(), false);
});

test("the loss signal fires when the server forgets a permit (the server stops)", async () => {
  const own = await startServer();
  try {
    const c = await Client.connect(own.addr, { retryEveryMs: 50 });
    try {
      const permit = await c.lock("lost/sem", { leaseMs: 900, permits: 2 });
      const reader = await c.lock("lost/shared", { leaseMs: 900, shared: true });
      const t0 = performance.now();
      await own.kill();
      const reasons = await Promise.all(
        [permit, reader].map(
          (l) => new Promise<unknown>((res) => l.signal.addEventListener("abort", () => res(l.signal.reason))),
        ),
      );
      const took = performance.now() - t0;
      for (const r of reasons) {
        assert.ok(r instanceof LockLostError);
        assert.equal(r.refused, false, "no node refused it: no renewal was confirmed in time");
      }
      // Lost no later than the lease could have run out on the server.
      assert.ok(took < 900 + 500, `lost after ${took} ms`);
    } finally {
      await c.close();
    }
  } finally {
    await own.kill();
  }
});

test("an aborted shared acquire or permit that is granted later is released at once", async () => {
  for (const kind of [{ shared: true }, { permits: 1 }]) {
    const held = await client.acquire("abort/k", { leaseMs: 10_000, ...("shared" in kind ? {} : kind) });
    assert.ok(held !== null);
    const ac = new AbortController();
    const waiting = client.acquire("abort/k", { leaseMs: 10_000, signal: ac.signal, ...kind });
    await client.sync();
    ac.abort(new Error("no longer needed"));
    await assert.rejects(waiting, /no longer needed/);
    // The server grants the abandoned acquire at the release; the client gives it back at once.
    assert.equal(await client.release("abort/k", held.token), true);
    // (Of the same kind: an exclusive acquire of a live semaphore key is refused.)
    const next = await client.acquire("abort/k", { leaseMs: 1000, waitMs: 3000, ...("shared" in kind ? {} : kind) });
    assert.ok(next !== null, `${JSON.stringify(kind)}: the abandoned grant was released`);
    assert.equal(await client.release("abort/k", next.token), true);
  }
});
