// The package as a user gets it: `npm pack`, installed from the tarball into
// scratch projects, imported as an ES module and required as CommonJS,
// type-checked with the declarations in `exports`, and docs/node.md's
// example run as written against a real server.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { failOnUnhandledRejections, PACKAGE, REPO, startServer } from "./helpers.js";

failOnUnhandledRejections();

/** The TypeScript program under the `<!-- example: NAME -->` marker of docs/node.md. */
function docsExample(name: string): string {
  const doc = readFileSync(join(REPO, "docs", "node.md"), "utf8");
  const at = doc.indexOf(`<!-- example: ${name} -->`);
  assert.ok(at >= 0, `docs/node.md has its ${name} marker`);
  const m = /```ts\n([\s\S]*?)```/.exec(doc.slice(at));
  assert.ok(m !== null, "a ts block follows the marker");
  return m[1]!;
}

function sh(cmd: string, args: string[], cwd: string, env: NodeJS.ProcessEnv = process.env): string {
  return execFileSync(cmd, args, { cwd, env, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], timeout: 120_000 });
}

test("npm pack, installed as ESM and CommonJS, runs the docs' example", { timeout: 180_000 }, async () => {
  const scratch = mkdtempSync(join(tmpdir(), "ringlock-pack-"));
  // --ignore-scripts: dist/ is built already (prepack would rebuild, and
  // remove build/, where this test runs from).
  const tgz = sh("npm", ["pack", "--ignore-scripts", "--silent", "--pack-destination", scratch], PACKAGE).trim();
  const tarball = join(scratch, tgz.split("\n").pop()!);
  const listing = sh("tar", ["tzf", tarball], scratch);
  assert.match(listing, /package\/dist\/esm\/index\.mjs/);
  assert.match(listing, /package\/dist\/cjs\/index\.d\.ts/);
  assert.doesNotMatch(listing, /package\/(src|test|build|node_modules)\//, "only dist/ ships");
  const tsc = join(PACKAGE, "node_modules", "typescript", "bin", "tsc");
  const server = await startServer();
  try {
    for (const type of ["module", "commonjs"]) {
      const dir = join(scratch, type);
      mkdirSync(dir);
      writeFileSync(join(dir, "package.json"), JSON.stringify({ name: `scratch-${type}`, private: true, type }));
      sh("npm", ["install", "--no-audit", "--no-fund", "--prefer-offline", "--loglevel=error", tarball], dir);
      writeFileSync(
        join(dir, "tsconfig.json"),
        JSON.stringify({
          compilerOptions: {
            target: "ES2022",
            lib: ["ES2022", "ESNext.Disposable"],
            module: "node16",
            moduleResolution: "node16",
            strict: true,
            typeRoots: [join(PACKAGE, "node_modules", "@types")],
            types: ["node"],
          },
          files: ["example.ts", "shared.ts"],
        }),
      );
      writeFileSync(join(dir, "example.ts"), docsExample("example.ts"));
      writeFileSync(join(dir, "shared.ts"), docsExample("shared.ts"));
      sh(process.execPath, [tsc, "-p", dir], dir);
      const emitted = readFileSync(join(dir, "example.js"), "utf8");
      assert.match(emitted, type === "module" ? /from "ringlock"/ : /require\("ringlock"\)/);
      const out = sh(process.execPath, ["example.js"], dir, { ...process.env, RINGLOCK_SERVERS: server.addr });
      assert.match(out, /^wrote a quick report under token \d+\nwrote step 1 under token \d+\nwrote step 2 under token \d+\nwrote step 3 under token \d+\n$/, `as ${type}`);
      const shared = sh(process.execPath, ["shared.js"], dir, { ...process.env, RINGLOCK_SERVERS: server.addr });
      const m = /^two readers at once, tokens (\d+) < (\d+)\nan exclusive lock now: busy \(held shared\)\nfour workers, at most ([12]) at once\nrefused while held by token \d+: it is a lock \(limit 0\)\n$/.exec(shared);
      assert.ok(m !== null, `shared.ts as ${type}: ${shared}`);
      assert.ok(BigInt(m[1]!) < BigInt(m[2]!), "the second reader's token is above the first's");
    }
    // Both entry points give the same classes: instanceof holds across them.
    const check = `
      const cjs = require("ringlock");
      import("ringlock").then((esm) => {
        if (esm.Client !== cjs.Client) throw new Error("two Client classes");
        const e = new cjs.LockTimeoutError("k", 5);
        if (!(e instanceof esm.LockTimeoutError && e instanceof esm.RinglockError)) throw new Error("instanceof fails");
        console.log(Object.keys(esm).filter((k) => k !== "default").sort().join(",") === Object.keys(cjs).sort().join(",") ? "same" : "differ");
      });`;
    assert.equal(sh(process.execPath, ["-e", check], join(scratch, "commonjs")).trim(), "same");
  } finally {
    await server.kill();
  }
});
