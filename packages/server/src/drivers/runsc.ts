/**
 * The runsc command line and the container verbs the gVisor driver needs: the flags every call
 * shares (state root, platform, no runsc networking or overlay of its own), the commands to
 * spawn that start a container and wait for it (`run` through the waiter, `wait`), and state,
 * kill, delete and list as finished host commands. It knows nothing of sandboxes' directories or
 * mounts (gvisor-driver.ts, gvisor-sandbox.ts).
 */
import { existsSync } from "node:fs";
import { readdir, readFile } from "node:fs/promises";
import { join } from "node:path";
import { z } from "zod";
import { BothyError, SANDBOX_ID_RE } from "@bothy/protocol";
import { HostCommandError, run } from "../util/host-command.ts";
import type { Logger } from "../events/server-events.ts";

export type RunscPlatform = "ptrace" | "systrap";

export interface RunscOptions {
  /** The runsc binary; default `runsc` on PATH. */
  path?: string;
  /** Where runsc keeps its container state. */
  root: string;
  platform: RunscPlatform;
  /** The host's waiter on each container (runsc-waiter, built with the guest's native helpers; see runCommand). */
  waiter: string;
  log: Logger;
}

/** How long one runsc command may take. */
export const RUNSC_TIMEOUT_MS = 15_000;
/** What killSentry reads of runsc's state file (`<root>/<id>_sandbox:<id>.state`). */
const RUNSC_STATE = z.object({ sandbox: z.object({ pid: z.number().int().positive() }) });

export class Runsc {
  readonly path: string;
  readonly root: string;
  readonly platform: RunscPlatform;
  readonly waiter: string;
  private readonly log: Logger;

  constructor(opts: RunscOptions) {
    this.path = opts.path ?? "runsc";
    this.root = opts.root;
    this.platform = opts.platform;
    this.waiter = opts.waiter;
    this.log = opts.log;
  }

  /** Runs `runsc --version`; throws (a HostCommandError) when runsc is not there. */
  async version(): Promise<string> {
    return (await run(this.path, ["--version"], { timeoutMs: 10_000 })).stdout;
  }

  /** The command line prefix shared by every call, then `args`. */
  args(...args: string[]): string[] {
    return ["--root", this.root, `--platform=${this.platform}`, "--network=none", "--overlay2=none", ...args];
  }

  /**
   * The command that starts a container and stays until it ends: the waiter (runsc-waiter, a
   * small static program, see its C file) runs `runsc run --detach`, takes the sandbox's
   * processes as their subreaper, and once they are gone deletes the container and exits with
   * their status (a resident `runsc run` would hold ~5 MB of memory per sandbox only to wait).
   * With a network, runsc runs with `--network=sandbox` under a private mount namespace where a
   * read-only tmpfs hides /proc/sys/net: this runsc decides "root network namespace" by a file
   * every namespace has on this kernel and refuses to start (shared/traps.md, gVisor).
   */
  runCommand(bundle: string, id: string, networked: boolean): [string, string[]] {
    const args = this.args("run", "--detach", "--bundle", bundle, id);
    const end = [this.path, ...this.args("delete", "--force", id)];
    if (!networked) return [this.waiter, [this.path, ...args, "--", ...end]];
    const withNetwork = args.map((a) => (a === "--network=none" ? "--network=sandbox" : a));
    const start = [
      "unshare",
      "--mount",
      "--propagation",
      "private",
      "sh",
      "-c",
      'mount -t tmpfs -o ro,size=4k bothy-nonet /proc/sys/net && exec "$@"',
      "bothy-runsc",
      this.path,
      ...withNetwork,
    ];
    return [this.waiter, [...start, "--", ...end]];
  }

  /** The `runsc wait` command line: it ends when the container does. */
  waitCommand(id: string): [string, string[]] {
    return [this.path, this.args("wait", id)];
  }

  /** Sends `signal` to the container's init (bothy-init); a failure is the caller's to judge. */
  async signal(id: string, signal: "TERM" | "KILL"): Promise<void> {
    await run(this.path, this.args("kill", id, signal), { timeoutMs: RUNSC_TIMEOUT_MS });
  }

  /**
   * Kills and deletes a container. A sandbox that is already on its way out makes runsc fail in
   * several ways (control socket refused or reset, a delete that times out while stopping); what
   * counts is that runsc holds no state for the id afterwards.
   */
  async remove(id: string): Promise<void> {
    const kill = await run(this.path, this.args("kill", "--all", id, "KILL"), {
      timeoutMs: RUNSC_TIMEOUT_MS,
    }).then(
      () => undefined,
      (err: unknown) => err,
    );
    let lastError: unknown = kill;
    for (let attempt = 0; attempt < 3 && (await this.hasState(id)); attempt++) {
      lastError = await run(this.path, this.args("delete", "--force", id), { timeoutMs: RUNSC_TIMEOUT_MS }).then(
        () => undefined,
        (err: unknown) => err,
      );
    }
    if (await this.hasState(id)) {
      throw new BothyError("internal", `runsc could not remove container ${id}.`, { cause: lastError });
    }
    if (lastError instanceof HostCommandError)
      this.log("runsc_remove_retried", { sandbox_id: id, error: lastError.message.slice(0, 300) });
  }

  /** Whether runsc reports the container as running. */
  async running(id: string): Promise<boolean> {
    return (await this.status(id)) === "running";
  }

  /** The container's status as `runsc state` reports it (`running`, `paused`, …); undefined when it has none. */
  async status(id: string): Promise<string | undefined> {
    if (!(await this.hasState(id))) return undefined;
    const state = await run(this.path, this.args("state", id), { timeoutMs: RUNSC_TIMEOUT_MS }).catch(() => undefined);
    if (!state) return undefined;
    try {
      return (JSON.parse(state.stdout) as { status?: string }).status;
    } catch {
      return undefined;
    }
  }

  /**
   * SIGKILLs the sandbox's sentry, named by runsc's state file and checked by its command line
   * (a pid runsc recorded may since have been reused): the container ends, and the waiter that
   * started it removes its state and cgroup, as after any sandbox death. No runsc command
   * is spawned, where `runsc kill` is a Go program's start and the sentry's control server's
   * work. Whether it found one to kill.
   */
  async killSentry(id: string): Promise<boolean> {
    // No state file, or one runsc is still writing: the caller takes the runsc path instead.
    const state = await readFile(join(this.root, `${id}_sandbox:${id}.state`), "utf8")
      .then((text) => RUNSC_STATE.safeParse(JSON.parse(text)))
      .catch(() => undefined);
    const pid = state?.success ? state.data.sandbox.pid : undefined;
    if (pid === undefined) return false;
    const argv = (await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "")).split("\0");
    if (!argv.includes("boot") || !argv.includes(`--root=${this.root}`) || argv.at(-2) !== id) return false;
    try {
      process.kill(pid, "SIGKILL");
      return true;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ESRCH") return false; // it ended on its own meanwhile
      throw err;
    }
  }

  /** Whether runsc still keeps state for this container (it removes it when `run` ends). */
  async hasState(id: string): Promise<boolean> {
    const entries = await readdir(this.root).catch(() => [] as string[]);
    return entries.some((e) => e.startsWith(`${id}_`));
  }

  /** The containers runsc keeps state for, by sandbox id. */
  async list(): Promise<string[]> {
    if (!existsSync(this.root)) return [];
    const { stdout } = await run(this.path, ["--root", this.root, "list", "-quiet"], {
      timeoutMs: RUNSC_TIMEOUT_MS,
    });
    return stdout
      .split("\n")
      .map((s) => s.trim())
      .filter((s) => SANDBOX_ID_RE.test(s));
  }
}
