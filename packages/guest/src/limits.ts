import { writeFile } from "node:fs/promises";
import type { ParsedHostFrame } from "@bothy/protocol";
import { runHelper } from "./identity.ts";

type LimitsFrame = Extract<ParsedHostFrame, { t: "limits" }>;

/**
 * The cgroup every command runs under, made by the sandbox's PID 1 (bothy-init in gVisor, pid1.sh
 * in VMs): its pids.max is the sandbox's process limit. The agent itself stays outside it.
 */
export const COMMANDS_CGROUP = process.env["BOTHY_COMMANDS_CGROUP"];
delete process.env["BOTHY_COMMANDS_CGROUP"];

/** A VM guest's root disk, as its initramfs mounted it. */
const ROOT_DEVICE = "/dev/vda";
/** The guest sees a grown disk a moment after the host grew it; growing the file system is quick. */
const GROW_TIMEOUT_MS = 60_000;

/** Applies the host's limits; a limit that cannot be enforced is an error, never skipped. */
export async function applyLimits(frame: LimitsFrame): Promise<void> {
  if (COMMANDS_CGROUP === undefined)
    throw new Error("this guest has no pids cgroup for its commands, so their process limit cannot be enforced");
  await writeFile(`${COMMANDS_CGROUP}/pids.max`, String(frame.max_processes));
  if (frame.root_bytes !== undefined)
    await runHelper(["growroot", ROOT_DEVICE, String(frame.root_bytes)], undefined, GROW_TIMEOUT_MS);
}
