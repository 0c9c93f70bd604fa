import { spawn } from "node:child_process";
import { constants, readdirSync } from "node:fs";
import { access, mkdir, open } from "node:fs/promises";
import path from "node:path";
import { agentEnv } from "./agent-env.ts";

/**
 * A template's boot hooks: executables in /etc/bothy/boot.d, run in name order at every cold start
 * of the agent (a new sandbox, gVisor's wake, a restart), before it says hello, so what they start
 * (the fullstack template's services) is up before the first command. A VM resumed from its saved
 * memory keeps its processes and runs none. A hook that fails or hangs is logged and left behind:
 * the sandbox still starts.
 */
export const BOOT_HOOKS_DIR = "/etc/bothy/boot.d";
export const BOOT_HOOKS_LOG = "/var/log/bothy-boot.log";
const HOOK_TIMEOUT_MS = 120_000;

export async function runBootHooks(dir = BOOT_HOOKS_DIR, log = BOOT_HOOKS_LOG): Promise<void> {
  let names: string[];
  try {
    // Synchronous: this runs before the agent's hello, and the first asynchronous file call
    // starts libuv's thread pool (four threads, each dear under gVisor's ptrace); with no hooks,
    // the common case, that is one failed system call instead.
    names = readdirSync(dir)
      .filter((n) => !n.startsWith("."))
      .sort();
  } catch {
    return; // no hooks: the common case
  }
  const hooks: string[] = [];
  for (const n of names) {
    const file = path.join(dir, n);
    if (
      await access(file, constants.X_OK).then(
        () => true,
        () => false,
      )
    )
      hooks.push(file);
  }
  if (hooks.length === 0) return;
  const out = await open(log, "a");
  try {
    for (const hook of hooks) await runHook(hook, out.fd);
  } finally {
    await out.close();
  }
}

/**
 * Like a command (exec.ts), a hook and the services it leaves running count against the sandbox's
 * process limit: the shell joins the commands' cgroup first (in a VM a child of it, `boot`, as
 * each command has its own there) and gives up the agent's OOM exemption.
 */
async function hookPrefix(): Promise<string> {
  const { commandsCgroup, inVm } = agentEnv();
  if (commandsCgroup === undefined) return "";
  let cgroup = commandsCgroup;
  if (inVm) {
    cgroup = `${commandsCgroup}/boot`;
    await mkdir(cgroup, { recursive: true });
  }
  return `echo $$ > '${cgroup}/cgroup.procs' || exit 126; ${inVm ? "echo 0 > /proc/$$/oom_score_adj 2>/dev/null; " : ""}`;
}

async function runHook(hook: string, fd: number): Promise<void> {
  const prefix = await hookPrefix().catch(() => "exit 126; ");
  return new Promise((resolve) => {
    const child = spawn("/bin/sh", ["-c", `${prefix}exec "$0"`, hook], {
      // Never the agent's stdout: with the stdio channel that is the protocol.
      stdio: ["ignore", fd, fd],
      timeout: HOOK_TIMEOUT_MS,
    });
    child.on("error", (err) => {
      process.stderr.write(`bothy-agent: boot hook ${hook}: ${err.message}\n`);
      resolve();
    });
    child.on("exit", (code, signal) => {
      if (code !== 0) process.stderr.write(`bothy-agent: boot hook ${hook} ended with ${signal ?? code}\n`);
      resolve();
    });
  });
}
