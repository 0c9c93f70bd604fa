// Builds the JavaScript the CLI runs: a packed CLI always, a checkout whenever the build is current
// (bin/bothy.js, bin/bundle-current.mjs). esbuild, not tsc: the CLI's program reaches into the server and tools
// sources through `serve`, `template` and `mcp`, which tsc would compile along with it; esbuild
// compiles only what the CLI imports. The API commands' code (with @bothy/protocol, @bothy/sdk and
// their dependencies, from their sources) is bundled into one file, because Node resolving and
// loading some hundred modules was most of a command's start (0.35 s against 0.09 s for `node -e 0`);
// splitting keeps the server-side commands in chunks loaded only when used, with the server's and
// tools' packages left to Node. `dist/inputs.json` lists every file the bundle was made from, and
// when the build began, so a checkout can tell whether the bundle still matches its sources.
import { build } from "esbuild";
import { rmSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

const here = fileURLToPath(new URL(".", import.meta.url));
const startedAt = Date.now();
rmSync(`${here}dist`, { recursive: true, force: true });
const result = await build({
  absWorkingDir: here,
  entryPoints: ["src/main.ts"],
  outdir: "dist",
  bundle: true,
  splitting: true,
  // The workspace packages from their TypeScript sources, as the tests run them.
  conditions: ["@bothy/source"],
  // ws's optional native helpers: it runs without them.
  external: ["@bothy/server", "@bothy/tools", "bufferutil", "utf-8-validate"],
  platform: "node",
  target: "node20",
  format: "esm",
  // ws is CommonJS and requires Node's modules: give the ES module bundle a `require`.
  banner: {
    js: 'import { createRequire as __bothyRequire } from "node:module"; const require = __bothyRequire(import.meta.url);',
  },
  minify: true,
  // Error classes keep their names (`BothyError`, the SDK's typed errors): messages and checks use them.
  keepNames: true,
  metafile: true,
  logLevel: "warning",
});
const inputs = Object.keys(result.metafile.inputs).filter((f) => !f.startsWith("<"));
writeFileSync(`${here}dist/inputs.json`, `${JSON.stringify({ startedAt, inputs })}\n`);
