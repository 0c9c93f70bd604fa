import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { agentSnapshot } from "../src/drivers/agent-snapshot.ts";
import type { ServerEvent } from "../src/events/server-events.ts";

/** A script `--build-snapshot` takes: its main prints what it was built with. */
const script = (word: string): string =>
  `const word = ${JSON.stringify(word)};\nrequire("node:v8").startupSnapshot.setDeserializeMainFunction(() => console.log(word));\n`;

describe("the agent's startup snapshot (drivers/agent-snapshot.ts)", () => {
  let dir: string;
  let events: ServerEvent[];
  const log = ((event: ServerEvent["event"], fields: object) =>
    events.push({ event, ...fields } as ServerEvent)) as Parameters<typeof agentSnapshot>[0]["log"];

  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), "bothy-agent-snapshot-"));
    events = [];
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("is built once by the given Node, runs its main, and is made again (the old one removed) when the script changes", async () => {
    const js = join(dir, "agent.cjs");
    const blobs = join(dir, "blobs");
    await writeFile(js, script("first"));
    const first = await agentSnapshot({ node: process.execPath, script: js, dir: blobs, log });
    expect(first).toBeDefined();
    expect(execFileSync(process.execPath, ["--snapshot-blob", first ?? ""], { encoding: "utf8" })).toBe("first\n");
    expect(await agentSnapshot({ node: process.execPath, script: js, dir: blobs, log })).toBe(first);
    expect(events.filter((e) => e.event === "agent_snapshot")).toHaveLength(1);

    await writeFile(js, script("second"));
    const second = await agentSnapshot({ node: process.execPath, script: js, dir: blobs, log });
    expect(second).not.toBe(first);
    expect(execFileSync(process.execPath, ["--snapshot-blob", second ?? ""], { encoding: "utf8" })).toBe("second\n");
    expect(existsSync(first ?? "")).toBe(false);
    expect(await readdir(blobs)).toEqual([second?.slice(blobs.length + 1)]);
  }, 60_000); // two snapshot builds and two Node starts: 4.9 s at load 15, past the unit default of 5 s

  it("is left out, with a warning, when the Node cannot build one", async () => {
    const js = join(dir, "agent.cjs");
    await writeFile(js, "throw new Error('not snapshottable');\n");
    expect(await agentSnapshot({ node: process.execPath, script: js, dir: join(dir, "blobs"), log })).toBeUndefined();
    expect(
      await agentSnapshot({ node: join(dir, "no-node"), script: js, dir: join(dir, "blobs"), log }),
    ).toBeUndefined();
    const failed = events.filter((e) => e.event === "agent_snapshot_failed");
    expect(failed).toHaveLength(2);
    expect(await readdir(join(dir, "blobs"))).toEqual([]); // no partial blob left behind
  });
});
