import { spawn, type ChildProcessByStdio } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import type { Readable, Writable } from "node:stream";
import { BothyError, SANDBOX_ID_RE } from "@bothy/protocol";
import { HostCommandError, run } from "../util/host-command.ts";
import type { Driver, ExitInfo, GuestStream, HostObject, SandboxHandle, SandboxSpec } from "./driver.ts";
import { buildOciSpec, GVISOR_COMPAT_FILES } from "./oci-spec.ts";

export interface GvisorOptions {
  /** Where runsc keeps its container state. */
  runscRoot: string;
  /** Parent of every sandbox directory; each sandbox dir is `<sandboxesDir>/<id>`. */
  sandboxesDir: string;
  /** The bundled guest agent on the host, bind-mounted read-only into each sandbox. */
  agentPath: string;
  runscPath?: string;
  log: (event: string, fields: Record<string, unknown>) => void;
}

const MOUNT_TIMEOUT_MS = 10_000;
const RUNSC_TIMEOUT_MS = 15_000;
const SHUTDOWN_GRACE_MS = 3_000;

export class GvisorDriver implements Driver {
  readonly name = "gvisor";
  readonly acceleration = "ptrace";
  /** The agent's channel is runsc's stdio, which ends with the server: its sandboxes stop with it. */
  readonly attaches = false;
  private readonly runsc: string;

  constructor(private readonly opts: GvisorOptions) {
    this.runsc = opts.runscPath ?? "runsc";
  }

  async preflight(): Promise<void> {
    try {
      await run(this.runsc, ["--version"], { timeoutMs: 10_000 });
    } catch (err) {
      throw new BothyError("create_failed", "runsc (gVisor) is not installed: run `apt-get install runsc`.", { cause: err });
    }
    for (const file of [this.opts.agentPath, ...GVISOR_COMPAT_FILES.map((f) => join(dirname(this.opts.agentPath), f.name))]) {
      if (!existsSync(file)) throw new BothyError("create_failed", `${file} is missing: run \`npm run build\`.`);
    }
    await mkdir(this.opts.runscRoot, { recursive: true, mode: 0o700 });
    await mkdir(this.opts.sandboxesDir, { recursive: true, mode: 0o700 });
  }

  create(spec: SandboxSpec): SandboxHandle {
    return new GvisorSandbox(spec, this);
  }

  /** @internal the runsc command line prefix shared by every call. */
  runscArgs(...args: string[]): string[] {
    return ["--root", this.opts.runscRoot, "--platform=ptrace", "--network=none", "--overlay2=none", ...args];
  }

  /**
   * The `runsc run` command line. With a network, runsc runs with `--network=sandbox` under a
   * private mount namespace where a read-only tmpfs hides /proc/sys/net: this runsc decides "root
   * network namespace" by a file every namespace has on this kernel and refuses to start
   * (shared/traps.md, gVisor).
   */
  runCommand(bundle: string, id: string, networked: boolean): [string, string[]] {
    const args = this.runscArgs("run", "--bundle", bundle, id);
    if (!networked) return [this.runsc, args];
    const withNetwork = args.map((a) => (a === "--network=none" ? "--network=sandbox" : a));
    return ["unshare", ["--mount", "--propagation", "private", "sh", "-c", 'mount -t tmpfs -o ro,size=4k bothy-nonet /proc/sys/net && exec "$@"', "bothy-runsc", this.runsc, ...withNetwork]];
  }

  get runscPath(): string {
    return this.runsc;
  }

  get options(): GvisorOptions {
    return this.opts;
  }

  async reconcile(): Promise<HostObject[]> {
    const found: HostObject[] = [];
    for (const c of await this.listContainers()) found.push({ sandboxId: c, kind: "runsc-container", description: `runsc container ${c}` });
    for (const m of await this.listMounts()) found.push({ sandboxId: m.id, kind: "overlay-mount", description: `overlay mount ${m.target}` });
    const entries = await readdir(this.opts.sandboxesDir).catch(() => [] as string[]);
    for (const id of entries) {
      if (SANDBOX_ID_RE.test(id)) found.push({ sandboxId: id, kind: "sandbox-dir", description: join(this.opts.sandboxesDir, id), disk: true });
    }
    return found;
  }

  async removeOrphan(sandboxId: string): Promise<void> {
    if (!SANDBOX_ID_RE.test(sandboxId)) throw new BothyError("invalid_sandbox_id", `Refusing to remove ${sandboxId}: not a sandbox id.`);
    try {
      if (await this.hasContainerState(sandboxId)) await this.removeContainer(sandboxId);
    } finally {
      // The disk goes even when runsc misbehaves: a mount left behind is the worse leak.
      await this.removeDisk(join(this.opts.sandboxesDir, sandboxId));
    }
  }

  /** Ends the container and unmounts its root; the upper directory (its files) stays. */
  async release(sandboxId: string): Promise<void> {
    if (!SANDBOX_ID_RE.test(sandboxId)) throw new BothyError("invalid_sandbox_id", `Refusing to release ${sandboxId}: not a sandbox id.`);
    try {
      if (await this.hasContainerState(sandboxId)) await this.removeContainer(sandboxId);
    } finally {
      await this.unmountRoot(join(this.opts.sandboxesDir, sandboxId));
    }
  }

  /**
   * Kills and deletes a container. A sandbox that is already on its way out makes runsc fail in
   * several ways (control socket refused or reset, a delete that times out while stopping); what
   * counts is that runsc holds no state for the id afterwards.
   */
  async removeContainer(id: string): Promise<void> {
    const kill = await run(this.runsc, this.runscArgs("kill", "--all", id, "KILL"), { timeoutMs: RUNSC_TIMEOUT_MS }).then(
      () => undefined,
      (err: unknown) => err,
    );
    let lastError: unknown = kill;
    for (let attempt = 0; attempt < 3 && (await this.hasContainerState(id)); attempt++) {
      lastError = await run(this.runsc, this.runscArgs("delete", "--force", id), { timeoutMs: RUNSC_TIMEOUT_MS }).then(
        () => undefined,
        (err: unknown) => err,
      );
    }
    if (await this.hasContainerState(id)) {
      throw new BothyError("internal", `runsc could not remove container ${id}: ${lastError instanceof Error ? lastError.message : "unknown error"}`, { cause: lastError });
    }
    if (lastError instanceof HostCommandError) this.opts.log("runsc_remove_retried", { sandbox_id: id, error: lastError.message.slice(0, 300) });
  }

  /** Whether runsc still keeps state for this container (it removes it when `run` ends). */
  async hasContainerState(id: string): Promise<boolean> {
    const entries = await readdir(this.opts.runscRoot).catch(() => [] as string[]);
    return entries.some((e) => e.startsWith(`${id}_`));
  }

  /** @internal unmounts the sandbox's root overlay and removes its directory. */
  async removeDisk(dir: string): Promise<void> {
    await this.unmountRoot(dir);
    await rm(dir, { recursive: true, force: true });
  }

  private async unmountRoot(dir: string): Promise<void> {
    const rootfs = join(dir, "rootfs");
    if ((await this.listMounts()).some((m) => m.target === rootfs)) {
      await run("umount", [rootfs], { timeoutMs: MOUNT_TIMEOUT_MS }).catch(async (err) => {
        // A process of ours may still hold it for a moment; detach now, the kernel frees it after.
        this.opts.log("umount_lazy", { dir, error: (err as Error).message });
        await run("umount", ["-l", rootfs], { timeoutMs: MOUNT_TIMEOUT_MS });
      });
    }
  }

  private async listContainers(): Promise<string[]> {
    if (!existsSync(this.opts.runscRoot)) return [];
    const { stdout } = await run(this.runsc, ["--root", this.opts.runscRoot, "list", "-quiet"], { timeoutMs: RUNSC_TIMEOUT_MS });
    return stdout.split("\n").map((s) => s.trim()).filter((s) => SANDBOX_ID_RE.test(s));
  }

  private async listMounts(): Promise<Array<{ id: string; target: string }>> {
    const text = await readFile("/proc/self/mounts", "utf8");
    const prefix = this.opts.sandboxesDir.replace(/\/$/, "") + "/";
    const out: Array<{ id: string; target: string }> = [];
    for (const line of text.split("\n")) {
      const target = line.split(" ")[1]?.replace(/\\040/g, " ");
      if (!target?.startsWith(prefix)) continue;
      const id = target.slice(prefix.length).split("/")[0] ?? "";
      if (SANDBOX_ID_RE.test(id)) out.push({ id, target });
    }
    return out;
  }
}

class GvisorSandbox implements SandboxHandle {
  private child: ChildProcessByStdio<Writable, Readable, Readable> | undefined;
  private exit: Promise<ExitInfo> | undefined;
  private stderrTail = "";
  private destroying: Promise<void> | undefined;

  constructor(
    private readonly spec: SandboxSpec,
    private readonly driver: GvisorDriver,
  ) {}

  get id(): string {
    return this.spec.id;
  }

  async start(signal?: AbortSignal): Promise<GuestStream> {
    if (this.child || this.destroying) throw new BothyError("internal", `Sandbox ${this.id} was already started.`);
    const { dir } = this.spec;
    const rootfs = join(dir, "rootfs");
    try {
      // A new sandbox's directory must not exist yet; a stopped one's holds its files in upper/.
      const reuse = this.spec.reuseDisk === true;
      await mkdir(dir, { recursive: reuse, mode: 0o700 });
      await Promise.all(["upper", "work", "rootfs", "bundle"].map((d) => mkdir(join(dir, d), { recursive: reuse })));
      signal?.throwIfAborted();
      // The template stays read-only underneath; every write lands in this sandbox's upper dir.
      await run("mount", ["-t", "overlay", "overlay", "-o", `lowerdir=${this.spec.templateRoot},upperdir=${join(dir, "upper")},workdir=${join(dir, "work")}`, rootfs], {
        timeoutMs: MOUNT_TIMEOUT_MS,
      });
      const network = this.spec.network;
      const resolvConf = network ? join(dir, "bundle", "resolv.conf") : undefined;
      if (network && resolvConf) await writeFile(resolvConf, network.dns.map((d) => `nameserver ${d}\n`).join(""), { mode: 0o644 });
      const oci = buildOciSpec({ ...this.spec, rootfs, agentPath: this.driver.options.agentPath, ...(resolvConf ? { resolvConf } : {}) });
      await writeFile(join(dir, "bundle", "config.json"), JSON.stringify(oci));
      signal?.throwIfAborted();
      const [file, args] = this.driver.runCommand(join(dir, "bundle"), this.id, network !== undefined);
      const child = spawn(file, args, {
        stdio: ["pipe", "pipe", "pipe"],
        // Out of the server's process group: a terminal's Ctrl-C goes to the server, which then
        // stops its sandboxes in order, instead of killing runsc mid-flight.
        detached: true,
      });
      this.child = child;
      this.exit = new Promise<ExitInfo>((resolve) => {
        child.once("error", (err) => {
          this.stderrTail += `\n${err.message}`;
          resolve({ code: null, signal: null });
        });
        child.once("exit", (code, sig) => resolve({ code, signal: sig }));
      });
      child.stderr.setEncoding("utf8");
      child.stderr.on("data", (s: string) => {
        this.stderrTail = (this.stderrTail + s).slice(-4096);
      });
      return { input: child.stdout, output: child.stdin };
    } catch (err) {
      // A failed restart keeps the disk: the files are the sandbox's, not this attempt's.
      await (this.spec.reuseDisk ? this.stop() : this.destroy());
      if (err instanceof BothyError) throw err;
      throw new BothyError("create_failed", `Could not start the gVisor sandbox: ${(err as Error).message}`, { cause: err });
    }
  }

  /** What runsc printed last; useful when the agent never said hello. */
  get diagnostics(): string {
    return this.stderrTail.trim();
  }

  wait(): Promise<ExitInfo> {
    return this.exit ?? Promise.resolve({ code: null, signal: null });
  }

  async shutdown(timeoutMs: number): Promise<void> {
    if (!this.child || this.child.exitCode !== null || this.child.signalCode !== null) return;
    // The agent exits when its channel closes; the container ends with it.
    this.child.stdin.end();
    const timer = new Promise<"timeout">((r) => setTimeout(() => r("timeout"), timeoutMs).unref());
    if ((await Promise.race([this.wait(), timer])) === "timeout") await this.kill();
  }

  async kill(): Promise<void> {
    if (await this.driver.hasContainerState(this.id)) await this.driver.removeContainer(this.id);
    const child = this.child;
    if (child && child.exitCode === null && child.signalCode === null) {
      const timer = new Promise<"timeout">((r) => setTimeout(() => r("timeout"), 5_000).unref());
      if ((await Promise.race([this.wait(), timer])) === "timeout") child.kill("SIGKILL");
      await this.wait();
    }
  }

  async stop(): Promise<void> {
    try {
      await this.shutdown(SHUTDOWN_GRACE_MS);
    } finally {
      await this.driver.release(this.id);
    }
  }

  destroy(): Promise<void> {
    this.destroying ??= (async () => {
      // Closing the agent's stdin ends the container and runsc removes its own state: much
      // cheaper than two more runsc invocations. A wedged agent is killed after the grace time.
      try {
        await this.shutdown(SHUTDOWN_GRACE_MS);
      } finally {
        await this.driver.removeOrphan(this.id);
      }
    })().catch((err: unknown) => {
      this.destroying = undefined; // a failed destroy may be tried again
      throw err;
    });
    return this.destroying;
  }
}
