import { chmod, mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterEach, beforeEach, expect, it } from "vitest";
import { runBootHooks } from "../src/boot-hooks.ts";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(path.join(tmpdir(), "bothy-boot-hooks-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

it("runs the executable hooks in name order, logs their output, and goes on past a failing one", async () => {
  const hooks = path.join(dir, "boot.d");
  const log = path.join(dir, "boot.log");
  await runBootHooks(hooks, log); // no folder: nothing to do, no log made
  await expect(readFile(log)).rejects.toMatchObject({ code: "ENOENT" });

  await mkdir(hooks);
  const hook = async (name: string, body: string, mode = 0o755): Promise<void> => {
    await writeFile(path.join(hooks, name), `#!/bin/sh\n${body}\n`);
    await chmod(path.join(hooks, name), mode);
  };
  await hook("20-second", "echo second");
  await hook("10-first", "echo first; exit 3");
  await hook("30-not-executable", "echo never", 0o644);
  await hook(".hidden", "echo never");
  await runBootHooks(hooks, log);
  expect(await readFile(log, "utf8")).toBe("first\nsecond\n");
});
