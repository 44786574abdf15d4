// TLS against the real server: certificates made with openssl (the test
// is skipped, saying so, where openssl is missing).

import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { Client, ConnectionError, NotAllowedError, ProtocolError, nodeStatus, tlsFromFiles } from "../src/index.js";
import { failOnUnhandledRejections, startServer } from "./helpers.js";

failOnUnhandledRejections();

const hasOpenssl = spawnSync("openssl", ["version"]).status === 0;

/** A CA and a certificate for 127.0.0.1 (node), a client CA and a client certificate. */
function certs(): string {
  const dir = mkdtempSync(join(tmpdir(), "ringlock-tls-"));
  const ossl = (...args: string[]): void => {
    execFileSync("openssl", args, { cwd: dir, stdio: "ignore" });
  };
  for (const ca of ["node-ca", "client-ca"]) {
    ossl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", `${ca}.key`,
      "-out", `${ca}.pem`, "-days", "2", "-subj", `/CN=${ca}`, "-addext", "keyUsage=critical,keyCertSign,cRLSign");
  }
  writeFileSync(join(dir, "node.ext"), "subjectAltName=IP:127.0.0.1,DNS:node.example\nextendedKeyUsage=serverAuth,clientAuth\n");
  writeFileSync(join(dir, "client.ext"), "extendedKeyUsage=clientAuth\n");
  for (const [name, ca, ext] of [["node", "node-ca", "node.ext"], ["client", "client-ca", "client.ext"]] as const) {
    ossl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", `${name}.key`,
      "-out", `${name}.csr`, "-subj", `/CN=${name}`);
    ossl("x509", "-req", "-in", `${name}.csr`, "-CA", `${ca}.pem`, "-CAkey", `${ca}.key`, "-CAcreateserial",
      "-days", "2", "-out", `${name}.pem`, "-extfile", ext);
  }
  return dir;
}

test("TLS with client certificates: locks work; the wrong CA, no certificate or plain text fail with the cause", { skip: hasOpenssl ? false : "openssl is not on PATH", timeout: 60_000 }, async () => {
  const dir = certs();
  const f = (n: string): string => join(dir, n);
  const server = await startServer("--tls-cert", f("node.pem"), "--tls-key", f("node.key"), "--tls-client-ca", f("client-ca.pem"));
  try {
    const tls = tlsFromFiles({ caFile: f("node-ca.pem"), certFile: f("client.pem"), keyFile: f("client.key") });
    {
      await using client = await Client.connect(server.addr, { tls });
      const g = await client.acquire("tls/k", { leaseMs: 5000 });
      assert.ok(g);
      assert.equal(await client.release(g.key, g.token), true);
      assert.equal((await nodeStatus(server.addr, { tls })).role, "active");
    }
    // A server name the certificate holds, for an address it need not.
    {
      await using client = await Client.connect(server.addr, { tls: { ...tls, serverName: "node.example" } });
      assert.equal(client.connected() > 0, true);
    }
    const fails = async (options: Parameters<typeof Client.connect>[1], pattern: RegExp): Promise<void> => {
      await assert.rejects(Client.connect(server.addr, { connectTimeoutMs: 2000, ...options }), (e: unknown) => {
        assert.ok(e instanceof ConnectionError, String(e));
        assert.match(e.message, pattern);
        return true;
      });
    };
    await fails({ tls: tlsFromFiles({ caFile: f("client-ca.pem"), certFile: f("client.pem"), keyFile: f("client.key") }) }, /not signed by the CA given/);
    await fails({ tls: tlsFromFiles({ caFile: f("node-ca.pem") }) }, /requires a client certificate|does not accept our client certificate|TLS/);
    await fails({ tls: { ...tls, serverName: "other.example" } }, /does not name the address dialed/);
    await fails({}, /E this port speaks TLS/);
  } finally {
    await server.kill();
  }
});

test("an acquire outside the identity's rules is NotAllowedError, not retried", { skip: hasOpenssl ? false : "openssl is not on PATH", timeout: 60_000 }, async () => {
  const dir = certs();
  const f = (n: string): string => join(dir, n);
  // The client certificate names no SAN: its identity is its CN, "client".
  writeFileSync(f("acl"), "client a/ lock\n");
  const server = await startServer("--tls-cert", f("node.pem"), "--tls-key", f("node.key"), "--tls-client-ca", f("client-ca.pem"), "--acl", f("acl"));
  try {
    const tls = tlsFromFiles({ caFile: f("node-ca.pem"), certFile: f("client.pem"), keyFile: f("client.key") });
    await using client = await Client.connect(server.addr, { tls });
    const started = Date.now();
    await assert.rejects(client.acquire("b/x", { leaseMs: 5000, waitMs: 5000 }), (e: unknown) => {
      assert.ok(e instanceof NotAllowedError && !(e instanceof ProtocolError), String(e));
      assert.match(e.message, /not allowed: identity "client" may not lock "b\/x"/);
      return true;
    });
    assert.ok(Date.now() - started < 2000, "not retried");
    const g = await client.acquire("a/x", { leaseMs: 5000 });
    assert.ok(g);
    assert.equal(await client.release(g.key, g.token), true);
  } finally {
    await server.kill();
  }
});
