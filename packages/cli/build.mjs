// Builds the JavaScript that a packed CLI runs (in a checkout, bin/bothy.js runs the sources).
// esbuild, not tsc: the CLI's program reaches into the server and tools sources through `serve`,
// `template` and `mcp`, which tsc would compile along with it; esbuild compiles only the CLI's own
// files and leaves every package import to Node. Splitting keeps those commands in chunks loaded
// only when used, so the API commands run without the server's code installed.
import { build } from "esbuild";
import { rmSync } from "node:fs";
import { fileURLToPath } from "node:url";

const here = fileURLToPath(new URL(".", import.meta.url));
rmSync(`${here}dist`, { recursive: true, force: true });
await build({
  entryPoints: [`${here}src/main.ts`],
  outdir: `${here}dist`,
  bundle: true,
  splitting: true,
  packages: "external",
  platform: "node",
  target: "node20",
  format: "esm",
  logLevel: "warning",
});
