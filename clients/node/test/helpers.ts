// Test helpers: the real ringlock server on free loopback ports (single
// nodes and clusters), a fake server whose answers a test writes by hand,
// and a guard that fails a test on any unhandled rejection. Every process
// and socket started here is stopped at the end of its test; every wait is
// bounded.

import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync } from "node:fs";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

export const PACKAGE = resolve(__dirname, "..", "..");
export const REPO = resolve(PACKAGE, "..", "..");

let chosen: string | undefined;

/**
 * The ringlock binary: RINGLOCK_BIN when set (as `cargo test` sets it),
 * else target/debug or target/release of this repository, else built with
 * `cargo build --bin ringlock`. Says which on stderr, once.
 */
export function ringlockBin(): string {
  if (chosen !== undefined) return chosen;
  const env = process.env["RINGLOCK_BIN"];
  let why: string;
  if (env !== undefined && env !== "") {
    chosen = env;
    why = "RINGLOCK_BIN";
  } else {
    const found = ["debug", "release"].map((p) => join(REPO, "target", p, "ringlock")).find((p) => existsSync(p));
    if (found !== undefined) {
      chosen = found;
      why = "found in target/ (set RINGLOCK_BIN to test another)";
    } else {
      const r = spawnSync("cargo", ["build", "--bin", "ringlock"], { cwd: REPO, stdio: "inherit", timeout: 1_800_000 });
      if (r.status !== 0) throw new Error("cargo build --bin ringlock failed");
      chosen = join(REPO, "target", "debug", "ringlock");
      why = "built with cargo build --bin ringlock";
    }
  }
  process.stderr.write(`ringlock binary: ${chosen} (${why})\n`);
  return chosen;
}

/** A loopback address of its own (127.x.y.z), so that ports picked on it are not taken by other tests' connections. */
export function loopbackIp(): string {
  const r = (n: number): number => 1 + Math.floor(Math.random() * n);
  return `127.${r(254)}.${r(254)}.${r(253)}`;
}

/** `n` ports free right now on `ip`. */
export async function freePorts(ip: string, n: number): Promise<number[]> {
  const servers: net.Server[] = [];
  try {
    for (let i = 0; i < n; i++) {
      const s = net.createServer();
      await new Promise<void>((res, rej) => {
        s.once("error", rej);
        s.listen(0, ip, () => res());
      });
      servers.push(s);
    }
    return servers.map((s) => (s.address() as net.AddressInfo).port);
  } finally {
    await Promise.all(servers.map((s) => new Promise((res) => s.close(res))));
  }
}

/** A `ringlock serve` child process. */
export class Server {
  readonly proc: ChildProcess;
  addr = "";
  log = "";
  private exited: Promise<void>;

  private constructor(args: string[]) {
    this.proc = spawn(ringlockBin(), ["serve", ...args], { stdio: ["ignore", "ignore", "pipe"] });
    this.exited = new Promise((res) => this.proc.once("exit", () => res()));
  }

  static async start(args: string[]): Promise<Server> {
    const s = new Server(args);
    await new Promise<void>((res, rej) => {
      const timer = setTimeout(() => {
        s.proc.kill("SIGKILL");
        rej(new Error(`ringlock serve ${args.join(" ")} did not start:\n${s.log}`));
      }, 15_000);
      s.proc.stderr!.on("data", (chunk: Buffer) => {
        s.log += chunk.toString();
        const m = /listening on (\S+)/.exec(s.log);
        if (m !== null && s.addr === "") {
          s.addr = m[1]!;
          clearTimeout(timer);
          res();
        }
      });
      s.proc.once("exit", () => {
        clearTimeout(timer);
        rej(new Error(`ringlock serve exited:\n${s.log}`));
      });
    });
    return s;
  }

  running(): boolean {
    return this.proc.exitCode === null && this.proc.signalCode === null;
  }

  async kill(signal: NodeJS.Signals = "SIGKILL"): Promise<void> {
    if (this.running()) {
      this.proc.kill("SIGCONT");
      this.proc.kill(signal);
    }
    await this.exited;
  }
}

/** A single node on a free port of 127.0.0.1. */
export function startServer(...extra: string[]): Promise<Server> {
  return Server.start(["--listen", "127.0.0.1:0", ...extra]);
}

let secret: string | undefined;

/** A cluster secret made with `ringlock keygen`. */
export function secretFile(): string {
  if (secret !== undefined) return secret;
  const path = join(mkdtempSync(join(tmpdir(), "ringlock-node-")), "cluster.secret");
  const r = spawnSync(ringlockBin(), ["keygen", path], { stdio: ["ignore", "ignore", "pipe"], timeout: 30_000 });
  if (r.status !== 0) throw new Error(`ringlock keygen failed: ${r.stderr}`);
  secret = path;
  return path;
}

/** `n` nodes with the same `--peers` list (node 0 first: highest priority). */
export class Cluster {
  readonly nodes: Array<Server | null>;
  private constructor(readonly addrs: string[]) {
    this.nodes = addrs.map(() => null);
  }

  static async start(n: number): Promise<Cluster> {
    const ip = loopbackIp();
    const c = new Cluster((await freePorts(ip, n)).map((p) => `${ip}:${p}`));
    for (let i = 0; i < n; i++) await c.startNode(i);
    return c;
  }

  async startNode(i: number): Promise<void> {
    this.nodes[i] = await Server.start([
      "--listen",
      this.addrs[i]!,
      "--advertise",
      this.addrs[i]!,
      "--peers",
      this.addrs.join(","),
      "--heartbeat-ms",
      "50",
      "--peer-timeout-ms",
      "500",
      "--cluster-secret-file",
      secretFile(),
    ]);
  }

  node(i: number): Server {
    return this.nodes[i]!;
  }

  async stopAll(): Promise<void> {
    await Promise.all(this.nodes.map((n) => n?.kill()));
  }
}

/** Calls `check` until it gives something truthy; throws after `withinMs`. */
export async function poll<T>(what: string, check: () => Promise<T> | T, withinMs = 10_000, everyMs = 20): Promise<T> {
  const until = performance.now() + withinMs;
  let last: T | undefined;
  for (;;) {
    try {
      last = await check();
    } catch {
      last = undefined;
    }
    if (last) return last;
    if (performance.now() >= until) throw new Error(`${what}: not within ${withinMs} ms (last: ${String(last)})`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/** Fails the test process on any unhandled rejection (and says which). */
export function failOnUnhandledRejections(): void {
  process.on("unhandledRejection", (reason) => {
    process.stderr.write(`unhandled rejection: ${String(reason)}\n${(reason as Error)?.stack ?? ""}\n`);
    process.exitCode = 1;
    throw reason;
  });
}

/**
 * A fake node: every line the client sends goes to `onLine` with the
 * socket to answer on; answers `S active <addr> 1` to the hello unless told
 * otherwise. `onAccept` sees each connection first (destroy it to cut it at
 * once); `accepts` holds when each was accepted, `mostOpen` the most open
 * at once. `stop()` stops listening (dials are refused) and `listen()`
 * listens again on the same port.
 */
export class FakeServer {
  server: net.Server;
  readonly sockets = new Set<net.Socket>();
  readonly lines: string[] = [];
  readonly accepts: number[] = [];
  mostOpen = 0;
  addr = "";
  private port = 0;
  onAccept: (sock: net.Socket) => void = () => undefined;
  onLine: (line: string, sock: net.Socket) => void = (line, sock) => {
    if (line === "S") sock.write(`S active ${this.addr} 1\n`);
  };

  private constructor() {
    this.server = this.make();
  }

  private make(): net.Server {
    return net.createServer((sock) => {
      this.accepts.push(performance.now());
      this.sockets.add(sock);
      this.mostOpen = Math.max(this.mostOpen, this.sockets.size);
      sock.on("close", () => this.sockets.delete(sock));
      sock.on("error", () => undefined);
      let buf = "";
      sock.on("data", (chunk) => {
        buf += chunk.toString("latin1");
        let nl: number;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + 1);
          this.lines.push(line);
          this.onLine(line, sock);
        }
      });
      this.onAccept(sock);
    });
  }

  static async start(): Promise<FakeServer> {
    const f = new FakeServer();
    await f.listenOn(0);
    f.port = (f.server.address() as net.AddressInfo).port;
    f.addr = `127.0.0.1:${f.port}`;
    return f;
  }

  private listenOn(port: number): Promise<void> {
    return new Promise<void>((res, rej) => {
      this.server.once("error", rej);
      this.server.listen(port, "127.0.0.1", () => {
        this.server.removeListener("error", rej);
        res();
      });
    });
  }

  /** Stops listening and cuts every connection: dials to it are refused. */
  async stop(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    if (this.server.listening) await new Promise((res) => this.server.close(res));
  }

  /** Listens again on the same port after stop(). */
  async listen(): Promise<void> {
    this.server = this.make();
    await this.listenOn(this.port);
  }

  async close(): Promise<void> {
    await this.stop();
  }
}
