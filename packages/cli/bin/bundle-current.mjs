// Whether the CLI's built bundle (dist/, see build.mjs) was made from the files as they are now:
// none of the files it was built from has changed or gone since its build began. In a checkout
// bin/bothy.js runs the bundle when it is current (a command starts in a tenth of the time) and the
// TypeScript sources otherwise, so an edit takes effect without a build, only slower.
import { readFileSync, statSync } from "node:fs";
import { join } from "node:path";

/** `cliDir`: the CLI package's directory (the one holding dist/ and build.mjs). */
export function bundleIsCurrent(cliDir) {
  let manifest;
  try {
    manifest = JSON.parse(readFileSync(join(cliDir, "dist", "inputs.json"), "utf8"));
  } catch {
    return false; // never built, or built before the manifest existed
  }
  const { startedAt, inputs } = manifest ?? {};
  if (typeof startedAt !== "number" || !Array.isArray(inputs) || inputs.length === 0) return false;
  // The build script itself is an input: a change to how the bundle is made makes it stale too.
  for (const file of ["build.mjs", ...inputs]) {
    const stat = statSync(join(cliDir, file), { throwIfNoEntry: false });
    if (!stat || stat.mtimeMs >= startedAt) return false;
  }
  return true;
}

/** The commands that run the server's or tools' code (loaded from their sources in a checkout). */
const SERVER_SIDE = new Set(["serve", "template", "mcp", "doctor"]);

/**
 * Whether this command line can run from the bundle: an API command (or help) with a current
 * bundle, unless BOTHY_CLI_SOURCE=1 asks for the sources (to debug them, or to measure them).
 */
export function runsFromBundle(cliDir, argv, env = process.env) {
  return env.BOTHY_CLI_SOURCE !== "1" && !SERVER_SIDE.has(argv[0] ?? "") && bundleIsCurrent(cliDir);
}
