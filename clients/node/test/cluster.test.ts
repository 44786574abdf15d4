// The client against a real three-node cluster: failover under contention.

import assert from "node:assert/strict";
import { test } from "node:test";

import { Client, nodeStatus, ProtocolError, RinglockError } from "../src/index.js";
import { Cluster, failOnUnhandledRejections, poll } from "./helpers.js";

failOnUnhandledRejections();

async function settledOn(cluster: Cluster, active: number, alive: number[]): Promise<boolean> {
  for (const i of alive) {
    const st = await nodeStatus(cluster.addrs[i]!, { timeoutMs: 500 });
    if (st.active !== cluster.addrs[active] || (st.role === "active") !== (i === active)) return false;
  }
  return true;
}

test("kill -9 of the active while 16 tasks contend for one key: every task goes on, tokens grow", { timeout: 60_000 }, async () => {
  const cluster = await Cluster.start(3);
  try {
    await poll("cluster settled on node 0", () => settledOn(cluster, 0, [0, 1, 2]), 10_000, 50);
    await using client = await Client.connect(cluster.addrs);
    const tokens: bigint[] = [];
    const errors: string[] = [];
    const perTask = new Array<number>(16).fill(0);
    let killedAt = Infinity;
    const afterKill = new Array<number>(16).fill(0);
    let holders = 0;
    let overlaps = 0;
    const stopAt = performance.now() + 6000;
    const task = async (i: number): Promise<void> => {
      while (performance.now() < stopAt) {
        try {
          const g = await client.acquire("cluster/one", { leaseMs: 2000, waitMs: 8000 });
          if (g === null) {
            errors.push(`task ${i}: the wait ran out`);
            continue;
          }
          holders += 1;
          if (holders > 1) overlaps += 1;
          tokens.push(g.token);
          perTask[i]! += 1;
          if (performance.now() > killedAt) afterKill[i]! += 1;
          await new Promise((r) => setTimeout(r, 2));
          holders -= 1;
          await client.release(g.keyBytes, g.token);
        } catch (e) {
          assert.ok(e instanceof RinglockError, `task ${i}: ${String(e)}`);
          errors.push(`task ${i}: ${e.message}`);
        }
      }
    };
    const tasks = Array.from({ length: 16 }, (_, i) => task(i));
    await new Promise((r) => setTimeout(r, 1500));
    const before = tokens.length;
    assert.ok(before > 16, `grants before the kill: ${before}`);
    await cluster.node(0).kill("SIGKILL");
    killedAt = performance.now();
    await Promise.all(tasks);
    // Every task went on after the kill, and the grants kept their order.
    assert.ok(
      afterKill.every((n) => n > 0),
      `grants per task after the kill: ${afterKill.join(",")} (errors: ${errors.join("; ")})`,
    );
    for (let j = 1; j < tokens.length; j++) {
      assert.ok(tokens[j]! > tokens[j - 1]!, `token ${j} (${tokens[j]}) not above ${tokens[j - 1]}`);
    }
    // No quorum: a grant in flight at the crash may overlap for a moment,
    // and one not yet replicated waits out its lease; nothing else.
    assert.ok(overlaps <= 1, `overlapping holders: ${overlaps}`);
    assert.ok(errors.length === 0, `errors: ${errors.join("; ")}`);
    await poll("node 1 active", () => settledOn(cluster, 1, [1, 2]), 10_000, 50);
    process.stderr.write(`cluster: ${tokens.length} grants, ${tokens.length - before} after the kill\n`);
  } finally {
    await cluster.stopAll();
  }
});

test("M is followed to the active node; standby addresses alone reach it", { timeout: 30_000 }, async () => {
  const cluster = await Cluster.start(3);
  try {
    await poll("cluster settled on node 0", () => settledOn(cluster, 0, [0, 1, 2]), 10_000, 50);
    // Only the standbys given: their M answers name node 0, which is dialled.
    await using client = await Client.connect([cluster.addrs[1]!, cluster.addrs[2]!]);
    const g = await client.acquire("cluster/m", { leaseMs: 5000, waitMs: 2000 });
    assert.ok(g);
    assert.ok(client.addresses().includes(cluster.addrs[0]!));
    assert.equal(await client.release(g.key, g.token), true);
  } finally {
    await cluster.stopAll();
  }
});

test("a cluster refuses shared locks and permits (not replicated): ProtocolError, and exclusive locks go on", { timeout: 60_000 }, async () => {
  const cluster = await Cluster.start(2);
  try {
    await poll("cluster settled on node 0", () => settledOn(cluster, 0, [0, 1]), 10_000, 50);
    await using client = await Client.connect(cluster.addrs, { redialIntervalMs: 100 });
    const waiting = client.acquire("cluster/x", { leaseMs: 5000, waitMs: 5000 });
    for (const kind of [{ shared: true }, { permits: 2 }]) {
      await assert.rejects(client.acquire("cluster/s", { leaseMs: 5000, ...kind }), (e: unknown) => {
        assert.ok(e instanceof ProtocolError, String(e));
        assert.match(e.message, /not replicated yet/);
        return true;
      });
    }
    const g = await waiting;
    assert.ok(g !== null, "the exclusive acquire was granted");
    assert.equal(await client.release("cluster/x", g.token), true);
  } finally {
    await cluster.stopAll();
  }
});
