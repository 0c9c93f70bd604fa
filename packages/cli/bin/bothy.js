#!/usr/bin/env node
// A packed CLI has no src/ and runs the JavaScript built into dist/. In a checkout, the API
// commands run that bundle too while it is current (npm run build; bundle-current.mjs): starting
// from the TypeScript sources costs ~1 s of compiling per command. Otherwise, and for the commands
// that run the server's or tools' code, tsx compiles the sources on load and the workspace packages
// resolve to their sources too, so there is no build to forget.
import { existsSync } from "node:fs";
import { register } from "node:module";
import { fileURLToPath } from "node:url";
import { runsFromBundle } from "./bundle-current.mjs";

const source = new URL("../src/main.ts", import.meta.url);
const cliDir = fileURLToPath(new URL("..", import.meta.url));
if (existsSync(source) && !runsFromBundle(cliDir, process.argv.slice(2))) {
  const tsx = await import("tsx/esm/api");
  tsx.register();
  register("./source-condition.mjs", import.meta.url);
  await import(source.href);
} else {
  await import("../dist/main.js");
}
