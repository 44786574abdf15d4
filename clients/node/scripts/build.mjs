// Builds the package: the CommonJS implementation (dist/cjs, with its type
// declarations), the ES module wrapper around it (dist/esm), and the tests
// and the conformance adapter (build/). Run with `npm run build`.
import { spawnSync } from "node:child_process";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const pkg = join(dirname(fileURLToPath(import.meta.url)), "..");
const tsc = join(pkg, "node_modules", "typescript", "bin", "tsc");

function run(project) {
  const r = spawnSync(process.execPath, [tsc, "-p", join(pkg, project)], { stdio: "inherit" });
  if (r.status !== 0) process.exit(r.status ?? 1);
}

rmSync(join(pkg, "dist"), { recursive: true, force: true });
rmSync(join(pkg, "build"), { recursive: true, force: true });
run("tsconfig.json");
writeFileSync(join(pkg, "dist/cjs/package.json"), '{\n  "type": "commonjs"\n}\n');

// One implementation, two entry points: `import` gets an ES module that
// re-exports the CommonJS one, so both see the same classes (instanceof
// holds across them) and the same module state.
const names = Object.keys(createRequire(import.meta.url)(join(pkg, "dist/cjs/index.js")))
  .filter((n) => n !== "__esModule")
  .sort();
mkdirSync(join(pkg, "dist/esm"), { recursive: true });
writeFileSync(
  join(pkg, "dist/esm/index.mjs"),
  "// The ES module entry point: the CommonJS implementation's exports, the same objects.\n" +
    'import cjs from "../cjs/index.js";\n\n' +
    `export const {\n${names.map((n) => `  ${n},`).join("\n")}\n} = cjs;\n`,
);
writeFileSync(join(pkg, "dist/esm/index.d.mts"), 'export * from "../cjs/index.js";\n');
run("tsconfig.test.json");
