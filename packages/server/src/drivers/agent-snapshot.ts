import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { readFile, mkdir, readdir, rename, rm, stat } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "../events/server-events.ts";
import { run } from "../util/host-command.ts";

/** Building a snapshot takes ~0.5 s here; a minute means the Node is stuck. */
const BUILD_TIMEOUT_MS = 60_000;
const BLOB_SUFFIX = ".blob";

/**
 * The gVisor agent's V8 startup snapshot: the agent's script (`agent-snapshot.cjs`, built by the
 * guest package) run once on the host by the Node that runs the agent in sandboxes
 * (`--build-snapshot`), so that every sandbox's agent starts from the heap it left instead of
 * loading and running the script. Under gVisor's ptrace platform, loading the protocol's schemas
 * costs a new agent ~0.3 s (most of what it does before it says hello); a snapshot's heap is read
 * in at once. Only the Node that wrote a blob can read it.
 *
 * Made once per home, Node and script: `<dir>/<key>.blob`, the key a hash of the script and the
 * Node's file (path, size, mtime), so a rebuilt agent or an upgraded Node gets a new one and old
 * ones are removed. Returns the blob's path, or undefined (logged) when this Node cannot build
 * one (one without snapshot support): sandboxes then run the script, only slower to start.
 */
export async function agentSnapshot(opts: {
  node: string;
  script: string;
  dir: string;
  log: Logger;
}): Promise<string | undefined> {
  const { node, script, dir, log } = opts;
  try {
    const nodeFile = await stat(node);
    const key = createHash("sha256")
      .update(await readFile(script))
      .update(`\0${node}\0${nodeFile.size}\0${nodeFile.mtimeMs}`)
      .digest("hex")
      .slice(0, 32);
    const blob = join(dir, `${key}${BLOB_SUFFIX}`);
    if (existsSync(blob)) return blob;
    await mkdir(dir, { recursive: true, mode: 0o700 });
    const partial = `${blob}.${process.pid}.partial`;
    const t0 = performance.now();
    try {
      // A clean environment: none of this server's NODE_OPTIONS (a loader, say) may end up in the heap.
      await run(node, ["--snapshot-blob", partial, "--build-snapshot", script], {
        timeoutMs: BUILD_TIMEOUT_MS,
        env: { PATH: "/usr/sbin:/usr/bin:/sbin:/bin" },
      });
      await rename(partial, blob);
    } finally {
      await rm(partial, { force: true });
    }
    for (const name of await readdir(dir))
      if (name.endsWith(BLOB_SUFFIX) && name !== `${key}${BLOB_SUFFIX}`) await rm(join(dir, name), { force: true });
    log("agent_snapshot", { node, blob, ms: Math.round(performance.now() - t0) });
    return blob;
  } catch (err) {
    log("agent_snapshot_failed", { node, error: (err as Error).message.slice(0, 500) });
    return undefined;
  }
}
