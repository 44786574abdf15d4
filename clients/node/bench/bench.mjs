// Acquire+release cycles per second of the ringlock Node.js client, beside
// ioredis (SET key id NX PX, then a Lua compare-and-delete: the usual Redis
// lock) against a local redis-server, in the same run.
//
//   cd clients/node && npm ci && npm run build && cd bench && npm ci
//   node bench.mjs [--duration 3] [--rounds 3] [--ringlock-bin ../../../target/release/ringlock]
//
// Starts one `ringlock serve` and one `redis-server --save '' --appendonly no`
// on free loopback ports, runs every scenario for --duration seconds after
// --warmup seconds (each loop bounded in time), prints a Markdown table of
// the medians and stops both servers. Each worker takes its own key
// (uncontended): it measures the clients' round trips, not lock contention.

import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { createServer } from "node:net";
import { cpus, loadavg } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

import Redis from "ioredis";

import { Client } from "../dist/esm/index.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const { values: opts } = parseArgs({
  options: {
    duration: { type: "string", default: "3" },
    warmup: { type: "string", default: "0.5" },
    rounds: { type: "string", default: "3" },
    "ringlock-bin": { type: "string", default: join(HERE, "..", "..", "..", "target", "release", "ringlock") },
  },
});
const duration = Number(opts.duration) * 1000;
const warmup = Number(opts.warmup) * 1000;
const rounds = Number(opts.rounds);

const RELEASE_LUA = `
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
else
    return 0
end`;

function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

function startRinglock(bin) {
  return new Promise((resolve, reject) => {
    const proc = spawn(bin, ["serve", "--listen", "127.0.0.1:0"], { stdio: ["ignore", "ignore", "pipe"] });
    let log = "";
    const timer = setTimeout(() => reject(new Error(`ringlock did not start:\n${log}`)), 15_000);
    proc.stderr.on("data", (chunk) => {
      log += chunk;
      const m = /listening on (\S+)/.exec(log);
      if (m) {
        clearTimeout(timer);
        resolve({ proc, addr: m[1] });
      }
    });
    proc.once("error", reject);
  });
}

async function startRedis() {
  const port = await freePort();
  const proc = spawn("redis-server", ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"], {
    stdio: "ignore",
  });
  const probe = new Redis({ port, host: "127.0.0.1", lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
  probe.on("error", () => undefined); // refused until redis-server listens
  const until = performance.now() + 15_000;
  for (;;) {
    try {
      await probe.connect();
      await probe.ping();
      probe.disconnect();
      return { proc, port };
    } catch (e) {
      if (performance.now() > until) throw e;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
}

/** `n` workers run `cycle(i)` in a loop: warm-up, then cycles per second over `duration`. */
async function run(n, cycle) {
  const start = performance.now();
  const measureFrom = start + warmup;
  const end = measureFrom + duration;
  let counted = 0;
  await Promise.all(
    Array.from({ length: n }, async (_, i) => {
      for (;;) {
        const t = performance.now();
        if (t >= end) return;
        await cycle(i);
        if (t >= measureFrom) counted += 1;
      }
    }),
  );
  return counted / (duration / 1000);
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

const rl = await startRinglock(opts["ringlock-bin"]);
const rd = await startRedis();
const client = await Client.connect(rl.addr);
const redis = new Redis({ port: rd.port, host: "127.0.0.1" });
const scenarios = [];
for (const n of [1, 16]) {
  scenarios.push({
    workers: n === 1 ? "1 task" : `${n} concurrent tasks`,
    ringlock: (i) => async () => {
      const g = await client.acquire(`bench/${n}/${i}`, { leaseMs: 10_000 });
      await client.release(g.keyBytes, g.token);
    },
    redis: (i) => async () => {
      const key = `bench/${n}/${i}`;
      const id = randomUUID();
      if ((await redis.set(key, id, "PX", 10_000, "NX")) !== "OK") throw new Error(`${key} is held`);
      await redis.eval(RELEASE_LUA, 1, key, id);
    },
    n,
  });
}
const results = scenarios.map(() => ({ ringlock: [], redis: [] }));
const load0 = loadavg()[0];
for (let r = 0; r < rounds; r++) {
  for (const [j, s] of scenarios.entries()) {
    results[j].ringlock.push(await run(s.n, (i) => s.ringlock(i)()));
    results[j].redis.push(await run(s.n, (i) => s.redis(i)()));
  }
}
const load1 = loadavg()[0];
await client.close();
redis.disconnect();
rl.proc.kill();
rd.proc.kill();

const fmt = (x) => Math.round(x).toLocaleString("en-US");
console.log(`Node.js ${process.version}, ${cpus().length} cores, load average ${load0.toFixed(1)} before, ${load1.toFixed(1)} after;`);
console.log(`medians of ${rounds} rounds (min-max) of ${duration / 1000} s after ${warmup / 1000} s of warm-up; ringlock: ${opts["ringlock-bin"]}; redis-server on the PATH\n`);
console.log("| workers | ringlock (Node.js) | ioredis, SET NX PX + Lua | ratio |");
console.log("|---|---:|---:|---:|");
for (const [j, s] of scenarios.entries()) {
  const a = median(results[j].ringlock);
  const b = median(results[j].redis);
  const range = (xs) => `${fmt(Math.min(...xs))}-${fmt(Math.max(...xs))}`;
  console.log(
    `| ${s.workers} | ${fmt(a)} /s (${range(results[j].ringlock)}) | ${fmt(b)} /s (${range(results[j].redis)}) | ${(a / b).toFixed(2)} × |`,
  );
}
