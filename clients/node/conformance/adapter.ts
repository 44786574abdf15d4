// The conformance adapter of the Node.js client (clients/conformance/ADAPTER.md):
// JSON lines on stdin, one call of the client per command, one reply per
// command on stdout, commands run concurrently.
//
//   node clients/node/build/conformance/adapter.js     (after `npm run build`)

import * as readline from "node:readline";

import { Client, type ClientOptions, type Lock, LockTimeoutError, RinglockError, tlsFromFiles } from "../src/index.js";

type Json = Record<string, unknown>;

let client: Client | null = null;
let closed = false;
const locks = new Map<number, Lock>();

function write(obj: Json): void {
  process.stdout.write(`${JSON.stringify(obj)}\n`);
}

class Unsupported extends Error {}

function kindOf(e: unknown): string {
  if (e instanceof Unsupported) return "unsupported";
  // ADAPTER.md's kinds: a lost lock and a key of another kind are "other".
  if (e instanceof RinglockError) return e.kind === "lost" || e.kind === "wrong_kind" ? "other" : e.kind;
  return "other";
}

function str(cmd: Json, name: string): string {
  const v = cmd[name];
  if (typeof v !== "string") throw new Unsupported(`${name}: a string is needed`);
  return v;
}

function num(cmd: Json, name: string): number {
  const v = cmd[name];
  if (typeof v !== "number") throw new Unsupported(`${name}: a number is needed`);
  return v;
}

function waitOf(cmd: Json): { waitMs?: number } {
  const w = cmd["wait_ms"];
  return typeof w === "number" && w > 0 ? { waitMs: w } : {};
}

function token(cmd: Json): bigint {
  const t = str(cmd, "token");
  if (!/^[0-9]{1,20}$/.test(t)) throw new Unsupported(`token ${JSON.stringify(t)} is not a decimal string`);
  return BigInt(t);
}

const OPTIONS: Record<string, keyof ClientOptions> = {
  connect_timeout_ms: "connectTimeoutMs",
  probe_interval_ms: "probeIntervalMs",
  probe_timeout_ms: "probeTimeoutMs",
  acquire_grace_ms: "acquireGraceMs",
  request_timeout_ms: "requestTimeoutMs",
  retry_every_ms: "retryEveryMs",
  retry_for_ms: "retryForMs",
  redial_interval_ms: "redialIntervalMs",
  no_active_timeout_ms: "noActiveTimeoutMs",
};

function connected(): Client {
  if (client === null || closed) throw new RinglockError("closed", "no client: connect first, or it was closed");
  return client;
}

async function closeBounded(): Promise<void> {
  closed = true;
  if (client === null) return;
  const c = client;
  await Promise.race([c.close(), new Promise((r) => setTimeout(r, 2000).unref())]);
}

async function run(id: number, cmd: Json): Promise<Json> {
  switch (cmd["cmd"]) {
    case "connect": {
      if (client !== null) throw new Unsupported("connect: already connected");
      const options: Record<string, unknown> = {};
      const given = (cmd["options"] ?? {}) as Json;
      for (const [wire, ours] of Object.entries(OPTIONS)) {
        if (typeof given[wire] === "number") options[ours] = given[wire];
      }
      const tls = cmd["tls"] as Json | undefined;
      if (tls !== undefined && tls !== null) {
        options["tls"] = tlsFromFiles({
          caFile: str(tls, "ca_file"),
          ...(typeof tls["cert_file"] === "string" ? { certFile: tls["cert_file"] } : {}),
          ...(typeof tls["key_file"] === "string" ? { keyFile: tls["key_file"] } : {}),
          ...(typeof tls["server_name"] === "string" ? { serverName: tls["server_name"] } : {}),
        });
      }
      const addrs = cmd["addrs"];
      if (!Array.isArray(addrs)) throw new Unsupported("addrs: a list is needed");
      client = await Client.connect(addrs as string[], options as ClientOptions);
      if (closed) await client.close();
      return {};
    }
    case "acquire":
    case "try_acquire": {
      const c = connected();
      const key = str(cmd, "key");
      const leaseMs = num(cmd, "lease_ms");
      const g =
        cmd["cmd"] === "acquire"
          ? await c.acquire(key, { leaseMs, ...waitOf(cmd) })
          : await c.tryAcquire(key, { leaseMs });
      return g === null ? { granted: false } : { granted: true, token: g.token.toString() };
    }
    case "release":
      return { released: await connected().release(str(cmd, "key"), token(cmd)) };
    case "renew":
      return { renewed: await connected().renew(str(cmd, "key"), token(cmd), num(cmd, "lease_ms")) };
    case "lock_renewing": {
      const c = connected();
      let lock: Lock;
      try {
        lock = await c.lock(str(cmd, "key"), { leaseMs: num(cmd, "lease_ms"), ...waitOf(cmd), renew: true });
      } catch (e) {
        if (e instanceof LockTimeoutError) return { granted: false };
        throw e;
      }
      locks.set(id, lock);
      lock.signal.addEventListener("abort", () => {
        const lost = lock.lost;
        write({
          event: "lost",
          lock: id,
          reason: lost === null ? "other" : lost.refused ? "refused" : "expired",
          message: lost?.message ?? String(lock.signal.reason),
        });
      });
      return { granted: true, token: lock.token.toString(), lock: id };
    }
    case "unlock": {
      const lock = locks.get(num(cmd, "lock"));
      if (lock === undefined) throw new Unsupported("unlock: no such lock");
      locks.delete(num(cmd, "lock"));
      // What the end of an `await using` scope runs: release(), once.
      return { released: await lock.release() };
    }
    case "status": {
      const nodes = (await connected().status()).map((s) =>
        s.status !== undefined
          ? {
              addr: s.addr,
              ok: true,
              role: s.status.role,
              active: s.status.active ?? "-",
              token: s.status.token.toString(),
            }
          : { addr: s.addr, ok: false, error: kindOf(s.error), message: s.error?.message ?? "" },
      );
      return { nodes };
    }
    case "stats": {
      const c = connected();
      return { connected: c.connected(), connections: c.connections() };
    }
    case "close":
      await closeBounded();
      return {};
    default:
      throw new Unsupported(`unknown cmd ${JSON.stringify(cmd["cmd"])}`);
  }
}

const pending = new Set<Promise<void>>();

const input = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
input.on("line", (line) => {
  let cmd: Json;
  try {
    const parsed: unknown = JSON.parse(line);
    if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) throw new Error("not an object");
    cmd = parsed as Json;
  } catch (e) {
    write({ id: 0, ok: false, error: "unsupported", message: `cannot parse ${JSON.stringify(line)}: ${String(e)}` });
    return;
  }
  const id = typeof cmd["id"] === "number" ? cmd["id"] : 0;
  const p = (async () => {
    try {
      if (cmd["cmd"] !== "connect" && cmd["cmd"] !== "close" && (client === null || closed)) {
        throw new RinglockError("closed", "no client: connect first, or it was closed");
      }
      write({ id, ok: true, ...(await run(id, cmd)) });
    } catch (e) {
      write({ id, ok: false, error: kindOf(e), message: e instanceof Error ? e.message : String(e) });
    }
  })();
  pending.add(p);
  void p.then(() => pending.delete(p));
});
input.on("close", () => {
  // Close the client (calls still waiting end with "closed"), let their
  // replies out, and exit: 2 s at most in all.
  const limit = new Promise((r) => setTimeout(r, 2000).unref());
  void Promise.race([Promise.all([closeBounded(), Promise.allSettled([...pending])]), limit]).then(() =>
    process.exit(0),
  );
});
