import { existsSync } from "node:fs";
import { mkdir, readdir, readFile, rename, rm, truncate, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { BothyError, SANDBOX_ID_RE } from "@bothy/protocol";
import { run } from "../util/host-command.ts";
import type { Driver, HostObject, SandboxHandle, SandboxSpec } from "./driver.ts";
import { hostCgroupLayout, limitsProblem, requireHostLimits } from "./host-cgroups.ts";
import { agentSnapshot } from "./agent-snapshot.ts";
import { AGENT_SNAPSHOT_SCRIPT, GVISOR_COMPAT_FILES } from "./oci-spec.ts";
import type { Logger } from "../events/server-events.ts";
import { describeCauses, HostSetupError } from "../errors/internal-errors.ts";
import { Runsc } from "./runsc.ts";
import { DISK_MOUNT, GvisorSandbox, MOUNT_TIMEOUT_MS } from "./gvisor-sandbox.ts";
import { captureUpper } from "./gvisor-snapshot.ts";

/** The host's waiter on each container, in the guest package's dist/ beside the agent (runsc.ts runCommand). */
const RUNSC_WAITER = "runsc-waiter";

export interface GvisorOptions {
  /** Where runsc keeps its container state. */
  runscRoot: string;
  /** Parent of every sandbox directory; each sandbox dir is `<sandboxesDir>/<id>`. */
  sandboxesDir: string;
  /** The bundled guest agent on the host, bind-mounted read-only into each sandbox. */
  agentPath: string;
  /** A Node on the host that runs the agent (config.ts BOTHY_AGENT_NODE); unset: the template's. */
  agentNode?: string;
  /** When the agent's Node starts (config.ts BOTHY_AGENT_START); default `boot`. */
  agentStart?: "boot" | "lazy";
  /** The home's tag (util/host-names.ts): names each sandbox's cgroup. */
  hostTag: string;
  /** The runsc binary (BOTHY_RUNSC); default `runsc` on PATH. */
  runscPath?: string;
  /** gVisor's platform (BOTHY_RUNSC_PLATFORM); shown as the sandbox's `acceleration`. */
  platform?: "ptrace" | "systrap";
  /** `off`: a host whose cgroups cannot limit sandboxes runs them unlimited instead of refusing (BOTHY_HOST_LIMITS). */
  hostLimits?: "required" | "off";
  log: Logger;
}

/**
 * The gVisor driver: checks the host, makes sandboxes (gvisor-sandbox.ts), and finds and removes
 * what sandboxes leave on the host (runsc containers, mounts, directories). The runsc command
 * lines are runsc.ts's.
 */
export class GvisorDriver implements Driver {
  readonly name = "gvisor";
  readonly acceleration: "ptrace" | "systrap";
  /** Containers run on when the server dies; the agent's FIFOs take a new server. */
  readonly attaches = true;
  /** @internal the runsc command lines and container verbs. */
  readonly runsc: Runsc;
  /** Empty disk images by size in MiB (blankDisk). */
  private readonly blanks = new Map<number, Promise<string>>();
  /** The agent's startup snapshot for `agentNode` (agent-snapshot.ts), once preflight made it. */
  private snapshot: string | undefined;

  constructor(private readonly opts: GvisorOptions) {
    this.acceleration = opts.platform ?? "ptrace";
    this.runsc = new Runsc({
      ...(opts.runscPath === undefined ? {} : { path: opts.runscPath }),
      root: opts.runscRoot,
      platform: this.acceleration,
      waiter: join(dirname(opts.agentPath), RUNSC_WAITER),
      log: opts.log,
    });
  }

  async preflight(): Promise<void> {
    try {
      await this.runsc.version();
    } catch (err) {
      throw new HostSetupError(
        `${this.runsc.path} (gVisor) is not there: run \`apt-get install runsc\` or set BOTHY_RUNSC.`,
        {
          cause: err,
        },
      );
    }
    for (const file of [
      this.opts.agentPath,
      this.runsc.waiter,
      ...GVISOR_COMPAT_FILES.map((f) => join(dirname(this.opts.agentPath), f.name)),
    ]) {
      if (!existsSync(file)) throw new HostSetupError(`${file} is missing: run \`npm run build\`.`);
    }
    if (this.opts.agentNode !== undefined && !existsSync(this.opts.agentNode))
      throw new HostSetupError(
        `${this.opts.agentNode} (BOTHY_AGENT_NODE, the Node that runs the agent) is missing: set BOTHY_AGENT_NODE=host or template.`,
      );
    await mkdir(this.opts.runscRoot, { recursive: true, mode: 0o700 });
    await mkdir(this.opts.sandboxesDir, { recursive: true, mode: 0o700 });
    if (this.opts.agentNode !== undefined)
      this.snapshot = await agentSnapshot({
        node: this.opts.agentNode,
        script: join(dirname(this.opts.agentPath), AGENT_SNAPSHOT_SCRIPT),
        dir: join(dirname(this.opts.sandboxesDir), "agent-snapshot"),
        log: this.opts.log,
      });
  }

  captureFiles(sandbox: { id: string; dir: string; running: boolean }, dest: string): Promise<{ frozenMs: number }> {
    return captureUpper(this.runsc, sandbox, dest);
  }

  create(spec: SandboxSpec): SandboxHandle {
    return new GvisorSandbox(spec, this);
  }

  /** @internal the agent's startup snapshot, when its Node could build one. */
  get agentSnapshot(): string | undefined {
    return this.snapshot;
  }

  /**
   * @internal An empty ext4 image of `mib` MiB, made once per size and process: a new sandbox's
   * disk is a sparse copy of it (`cp --sparse=always`, ~10 ms here) instead of its own mkfs (~50 ms
   * and a CPU-bound step in every cold create).
   */
  blankDisk(mib: number): Promise<string> {
    let made = this.blanks.get(mib);
    if (!made) {
      made = this.makeBlankDisk(mib).catch((err: unknown) => {
        this.blanks.delete(mib);
        throw err;
      });
      this.blanks.set(mib, made);
    }
    return made;
  }

  private async makeBlankDisk(mib: number): Promise<string> {
    const dir = join(dirname(this.opts.sandboxesDir), "disk-blanks");
    await mkdir(dir, { recursive: true, mode: 0o700 });
    const path = join(dir, `${mib}.ext4`);
    const partial = `${path}.${process.pid}.partial`;
    try {
      await writeFile(partial, "", { mode: 0o600 });
      await truncate(partial, mib * 1024 * 1024);
      await run(
        "mkfs.ext4",
        ["-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", partial],
        { timeoutMs: MOUNT_TIMEOUT_MS },
      );
      await rename(partial, path);
      return path;
    } catch (err) {
      await rm(partial, { force: true });
      throw err;
    }
  }

  /**
   * @internal whether sandboxes get their cgroup limits (runsc applies them on either layout);
   * throws a NotSupportedError, saying how to fix the host, when it cannot and the operator did not opt out.
   */
  async hostLimits(): Promise<boolean> {
    const layout = await hostCgroupLayout();
    requireHostLimits(layout, this.opts.hostLimits ?? "required");
    return limitsProblem(layout) === undefined;
  }

  get options(): GvisorOptions {
    return this.opts;
  }

  async reconcile(): Promise<HostObject[]> {
    const found: HostObject[] = [];
    for (const c of await this.runsc.list())
      found.push({ sandboxId: c, kind: "runsc-container", description: `runsc container ${c}` });
    for (const m of await this.listMounts())
      found.push({ sandboxId: m.id, kind: "mount", description: `mount ${m.target}` });
    const entries = await readdir(this.opts.sandboxesDir).catch(() => [] as string[]);
    for (const id of entries) {
      if (SANDBOX_ID_RE.test(id))
        found.push({ sandboxId: id, kind: "sandbox-dir", description: join(this.opts.sandboxesDir, id), disk: true });
    }
    return found;
  }

  async removeOrphan(sandboxId: string): Promise<void> {
    try {
      await this.release(sandboxId);
    } finally {
      // The directory goes even when runsc misbehaves (release has unmounted what it could).
      await rm(join(this.opts.sandboxesDir, sandboxId), { recursive: true, force: true });
    }
  }

  /** Ends the container and unmounts its root and disk; the disk (its files) stays. */
  async release(sandboxId: string): Promise<void> {
    if (!SANDBOX_ID_RE.test(sandboxId))
      throw new BothyError("invalid_sandbox_id", `Refusing to remove ${sandboxId}: not a sandbox id.`);
    try {
      if (await this.runsc.hasState(sandboxId)) await this.runsc.remove(sandboxId);
    } finally {
      // A mount left behind is the worse leak: unmount even when runsc misbehaves.
      await this.unmountRoot(join(this.opts.sandboxesDir, sandboxId));
    }
  }

  /**
   * Unmounts the sandbox's root overlay, then its disk (the overlay's upper layer lives on it),
   * with one `umount` for both: each spawn costs the server a fork of its address space.
   */
  private async unmountRoot(dir: string): Promise<void> {
    const wanted = [join(dir, "rootfs"), join(dir, DISK_MOUNT)];
    const mounted = await this.listMounts();
    const targets = wanted.filter((t) => mounted.some((m) => m.target === t));
    if (targets.length === 0) return;
    await run("umount", targets, { timeoutMs: MOUNT_TIMEOUT_MS }).catch(async (err) => {
      // umount goes on past a busy target; what is still mounted is detached one by one, in order.
      for (const target of targets) await this.unmountLazily(target, err);
    });
  }

  /** @internal unmounts `target` if something is mounted there. */
  async unmount(target: string): Promise<void> {
    if (!(await this.listMounts()).some((m) => m.target === target)) return;
    await run("umount", [target], { timeoutMs: MOUNT_TIMEOUT_MS }).catch((err) => this.unmountLazily(target, err));
  }

  /**
   * After a failed `umount`: a process of ours may still hold the target for a moment; detach it
   * now (if still mounted), the kernel frees it after.
   */
  private async unmountLazily(target: string, err: unknown): Promise<void> {
    if (!(await this.listMounts()).some((m) => m.target === target)) return;
    this.opts.log("umount_lazy", { dir: dirname(target), target, error: describeCauses(err) });
    await run("umount", ["-l", target], { timeoutMs: MOUNT_TIMEOUT_MS });
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
