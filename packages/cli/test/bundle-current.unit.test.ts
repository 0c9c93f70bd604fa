import { mkdir, mkdtemp, rm, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { bundleIsCurrent, runsFromBundle } from "../bin/bundle-current.mjs";

/**
 * In a checkout, bin/bothy.js runs the built bundle only while it matches the sources: a command
 * must never run code older than what is checked out (an edit would silently not apply).
 */
describe("whether the CLI's bundle is current", () => {
  let dir: string;
  const past = new Date(Date.now() - 60_000);

  async function file(path: string, when = past): Promise<void> {
    await mkdir(join(dir, path, ".."), { recursive: true });
    await writeFile(join(dir, path), "x");
    await utimes(join(dir, path), when, when);
  }

  /** A build that began now, from these inputs (all older than it). */
  async function built(inputs: string[]): Promise<void> {
    for (const f of ["build.mjs", ...inputs]) await file(f);
    await mkdir(join(dir, "dist"), { recursive: true });
    await writeFile(join(dir, "dist", "inputs.json"), JSON.stringify({ startedAt: Date.now(), inputs }));
  }

  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), "bothy-bundle-"));
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("is current when no input changed since the build began", async () => {
    await built(["src/main.ts", "../sdk/src/index.ts"]);
    expect(bundleIsCurrent(dir)).toBe(true);
    expect(runsFromBundle(dir, ["ls"], {})).toBe(true);
    expect(runsFromBundle(dir, [], {})).toBe(true);
  });

  it("is stale once a source it was built from changes", async () => {
    await built(["src/main.ts", "src/commands/ls.ts"]);
    await file("src/commands/ls.ts", new Date(Date.now() + 1000));
    expect(bundleIsCurrent(dir)).toBe(false);
    expect(runsFromBundle(dir, ["ls"], {})).toBe(false);
  });

  it("is stale once the build script changes, or an input is gone", async () => {
    await built(["src/main.ts", "src/gone.ts"]);
    await file("build.mjs", new Date(Date.now() + 1000));
    expect(bundleIsCurrent(dir)).toBe(false);
    await file("build.mjs");
    expect(bundleIsCurrent(dir)).toBe(true);
    await rm(join(dir, "src/gone.ts"));
    expect(bundleIsCurrent(dir)).toBe(false);
  });

  it("is never current without a manifest, or with one that lists nothing", async () => {
    expect(bundleIsCurrent(dir)).toBe(false);
    await built([]);
    expect(bundleIsCurrent(dir)).toBe(false);
    await writeFile(join(dir, "dist", "inputs.json"), "{not json");
    expect(bundleIsCurrent(dir)).toBe(false);
  });

  it("the server-side commands, and BOTHY_CLI_SOURCE=1, run from the sources", async () => {
    await built(["src/main.ts"]);
    for (const cmd of ["serve", "template", "mcp", "doctor"]) expect(runsFromBundle(dir, [cmd], {})).toBe(false);
    expect(runsFromBundle(dir, ["ls"], { BOTHY_CLI_SOURCE: "1" })).toBe(false);
  });
});
