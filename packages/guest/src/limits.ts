import { writeFileSync } from "node:fs";
import type { ParsedHostFrame } from "@bothy/protocol";
import { agentEnv } from "./agent-env.ts";
import { diskBySerial, ROOT_SERIAL } from "./block-devices.ts";
import { runHelper } from "./identity.ts";

type LimitsFrame = Extract<ParsedHostFrame, { t: "limits" }>;

/** The guest sees a grown disk a moment after the host grew it; growing the file system is quick. */
const GROW_TIMEOUT_MS = 60_000;

/** Applies the host's limits; a limit that cannot be enforced is an error, never skipped. */
export async function applyLimits(frame: LimitsFrame): Promise<void> {
  const { commandsCgroup } = agentEnv();
  if (commandsCgroup === undefined)
    throw new Error("this guest has no pids cgroup for its commands, so their process limit cannot be enforced");
  // Synchronous, a few bytes to a cgroup file: an asynchronous write would start libuv's thread
  // pool (four threads, each dear under gVisor's ptrace) on the sandbox's start path.
  writeFileSync(`${commandsCgroup}/pids.max`, String(frame.max_processes));
  if (frame.root_bytes !== undefined) {
    // The disk its initramfs mounted as the root (found the same way, by serial).
    const root = diskBySerial(ROOT_SERIAL);
    if (root === undefined) throw new Error(`no disk with serial ${ROOT_SERIAL}: cannot grow the root file system`);
    await runHelper(["growroot", root, String(frame.root_bytes)], undefined, GROW_TIMEOUT_MS);
  }
}
