// The lockfiles name packages, versions and integrity hashes only: no
// registry address (the repository never records one; npm resolves names
// against whatever registry it is configured with).

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { PACKAGE } from "./helpers.js";

for (const dir of [PACKAGE, join(PACKAGE, "bench")]) {
  test(`${dir}: package-lock.json records no registry address`, () => {
    assert.match(readFileSync(join(dir, ".npmrc"), "utf8"), /^omit-lockfile-registry-resolved=true$/m);
    const lock = JSON.parse(readFileSync(join(dir, "package-lock.json"), "utf8")) as {
      packages: Record<string, { resolved?: string; integrity?: string }>;
    };
    const entries = Object.entries(lock.packages).filter(([path]) => path !== "");
    assert.ok(entries.length > 0);
    for (const [path, entry] of entries) {
      assert.equal(entry.resolved, undefined, `${path} has a resolved address`);
      assert.match(entry.integrity ?? "", /^sha512-/, `${path} has an integrity hash`);
    }
  });
}
