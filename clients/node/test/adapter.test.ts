// The conformance adapter (clients/conformance/ADAPTER.md) against the real
// server: each command, concurrency, events, end of input.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { join } from "node:path";
import * as readline from "node:readline";
import { test } from "node:test";

import { failOnUnhandledRejections, startServer } from "./helpers.js";

failOnUnhandledRejections();

type Json = Record<string, unknown>;

test("the adapter speaks ADAPTER.md", { timeout: 30_000 }, async () => {
  const server = await startServer();
  const proc = spawn(process.execPath, [join(__dirname, "..", "conformance", "adapter.js")], {
    stdio: ["pipe", "pipe", "inherit"],
  });
  const replies = new Map<number, (r: Json) => void>();
  const events: Json[] = [];
  readline.createInterface({ input: proc.stdout! }).on("line", (line) => {
    const msg = JSON.parse(line) as Json;
    if ("event" in msg) events.push(msg);
    else replies.get(msg["id"] as number)?.(msg);
  });
  let next = 1;
  const send = (cmd: Json): Promise<Json> => {
    const id = next++;
    const p = new Promise<Json>((res) => replies.set(id, res));
    proc.stdin!.write(`${JSON.stringify({ id, ...cmd })}\n`);
    return p;
  };
  try {
    assert.deepEqual(await send({ cmd: "stats" }), {
      id: 1,
      ok: false,
      error: "closed",
      message: "no client: connect first, or it was closed",
    });
    assert.equal((await send({ cmd: "connect", addrs: [server.addr], options: { probe_timeout_ms: 500 } }))["ok"], true);
    const a = await send({ cmd: "acquire", key: "k", lease_ms: 5000 });
    assert.equal(a["granted"], true);
    assert.match(a["token"] as string, /^[0-9]{19}$/);
    assert.deepEqual(await send({ cmd: "try_acquire", key: "k", lease_ms: 5000 }), { id: 4, ok: true, granted: false });
    // Concurrent: a waiting acquire does not hold back the release after it.
    const waiting = send({ cmd: "acquire", key: "k", lease_ms: 5000, wait_ms: 5000 });
    assert.deepEqual(await send({ cmd: "release", key: "k", token: a["token"] }), { id: 6, ok: true, released: true });
    const w = await waiting;
    assert.equal(w["granted"], true);
    assert.equal((await send({ cmd: "renew", key: "k", token: w["token"], lease_ms: 300 }))["renewed"], true);
    // A renewing lock, lost when someone releases it with its token.
    const l = await send({ cmd: "lock_renewing", key: "r", lease_ms: 600 });
    assert.equal(l["granted"], true);
    assert.equal(l["lock"], l["id"]);
    await send({ cmd: "release", key: "r", token: l["token"] });
    const until = performance.now() + 3000;
    while (events.length === 0 && performance.now() < until) await new Promise((r) => setTimeout(r, 20));
    assert.deepEqual({ ...events[0], message: "" }, { event: "lost", lock: l["id"], reason: "refused", message: "" });
    assert.equal((await send({ cmd: "unlock", lock: l["id"] }))["released"], false);
    const l2 = await send({ cmd: "lock_renewing", key: "r2", lease_ms: 3000 });
    assert.equal((await send({ cmd: "unlock", lock: l2["id"] }))["released"], true);
    const st = await send({ cmd: "status" });
    assert.deepEqual(st["nodes"], [
      { addr: server.addr, ok: true, role: "active", active: server.addr, token: (st["nodes"] as Json[])[0]!["token"] },
    ]);
    assert.deepEqual(await send({ cmd: "stats" }), { id: next - 1, ok: true, connected: 2, connections: 2 });
    assert.equal((await send({ cmd: "nope" }))["error"], "unsupported");
    assert.equal((await send({ cmd: "acquire", key: "bad key", lease_ms: 10 }))["error"], "invalid_argument");
    // End of input: a waiting acquire ends with "closed", and the adapter exits 0.
    assert.equal((await send({ cmd: "acquire", key: "h", lease_ms: 10_000 }))["granted"], true);
    const hanging = send({ cmd: "acquire", key: "h", lease_ms: 1000 });
    await new Promise((r) => setTimeout(r, 100));
    const exited = new Promise<number | null>((res) => proc.once("exit", (code) => res(code)));
    const t0 = performance.now();
    proc.stdin!.end();
    assert.equal((await hanging)["error"], "closed");
    assert.equal(await exited, 0);
    assert.ok(performance.now() - t0 < 4000);
  } finally {
    proc.kill();
    await server.kill();
  }
});
