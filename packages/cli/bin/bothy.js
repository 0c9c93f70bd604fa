#!/usr/bin/env node
// In a checkout, the CLI runs from its TypeScript sources: tsx compiles them on load, and the
// workspace packages (and the server that `serve` starts) resolve to their sources too, so there
// is no build to forget. A packed CLI has no src/ and runs the JavaScript built into dist/.
import { existsSync } from "node:fs";
import { register } from "node:module";

const source = new URL("../src/main.ts", import.meta.url);
if (existsSync(source)) {
  const tsx = await import("tsx/esm/api");
  tsx.register();
  register("./source-condition.mjs", import.meta.url);
  await import(source.href);
} else {
  await import("../dist/main.js");
}
