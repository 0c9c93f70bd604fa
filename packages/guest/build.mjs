// Bundles the agent into one file that runs on the template's Node (bookworm ships Node 18).
import { build } from "esbuild";
import { fileURLToPath } from "node:url";

const here = fileURLToPath(new URL(".", import.meta.url));
await build({
  entryPoints: [`${here}src/main.ts`],
  outfile: `${here}dist/agent.mjs`,
  bundle: true,
  platform: "node",
  target: "node18",
  format: "esm",
  minify: true,
  legalComments: "none",
  logLevel: "warning",
});
