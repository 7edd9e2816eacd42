// Builds the package: copies the generated wire module (../bindings/typescript/src/protocol.ts, the
// one source of wire types; never edited) into src/, then compiles src/ with `tsc --strict` into
// dist/ (ESM + .d.ts). `--check` type-checks only. Run by `npm run build` and by `prepack`, so the
// tarball `npm pack` makes is self-contained.
import { spawnSync } from "node:child_process";
import * as fs from "node:fs";
import * as path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
const generated = path.join(root, "..", "bindings", "typescript", "src", "protocol.ts");
const copy = path.join(root, "src", "protocol.ts");
const check = process.argv.includes("--check");

if (fs.existsSync(generated)) {
  const text = fs.readFileSync(generated);
  if (!fs.existsSync(copy) || !text.equals(fs.readFileSync(copy))) fs.writeFileSync(copy, text);
} else if (!fs.existsSync(copy)) {
  console.error(`build: ${generated} is missing (run \`cargo run -q -p cc-agent-protocol -- generate\`)`);
  process.exit(1);
}

const tsc = path.join(root, "node_modules", "typescript", "bin", "tsc");
const args = [tsc, "--strict", "-p", path.join(root, "tsconfig.json")];
if (check) args.push("--noEmit");
else fs.rmSync(path.join(root, "dist"), { recursive: true, force: true });
const run = spawnSync(process.execPath, args, { stdio: "inherit" });
process.exit(run.status ?? 1);
