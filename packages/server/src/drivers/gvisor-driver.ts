import { spawn, type ChildProcess } from "node:child_process";
import { closeSync, constants as fsConstants, existsSync, openSync, readFileSync } from "node:fs";
import { Socket } from "node:net";
import { mkdir, readdir, readFile, rename, rm, truncate, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { z } from "zod";
import { BothyError, resyncPreamble, SANDBOX_ID_RE } from "@bothy/protocol";
import { HostCommandError, run } from "../util/host-command.ts";
import { cgroupPath } from "../util/host-names.ts";
import type { Driver, ExitInfo, GuestStream, HostObject, SandboxHandle, SandboxSpec } from "./driver.ts";
import type { CleanupStack } from "../util/cleanup-stack.ts";
import { hostCgroupLayout, limitsProblem, requireHostLimits, restoreSandboxCpuWeight } from "./host-cgroups.ts";
import { agentSnapshot } from "./agent-snapshot.ts";
import { AGENT_SNAPSHOT_SCRIPT, buildOciSpec, GVISOR_COMPAT_FILES } from "./oci-spec.ts";
import type { Logger } from "../events/server-events.ts";
import { BootError, describeCauses, HostSetupError } from "../errors/internal-errors.ts";
import { lowerDirsOf } from "../images/layer-store.ts";

export interface GvisorOptions {
  /** Where runsc keeps its container state. */
  runscRoot: string;
  /** Parent of every sandbox directory; each sandbox dir is `<sandboxesDir>/<id>`. */
  sandboxesDir: string;
  /** The bundled guest agent on the host, bind-mounted read-only into each sandbox. */
  agentPath: string;
  /** A Node on the host that runs the agent (config.ts BOTHY_AGENT_NODE); unset: the template's. */
  agentNode?: string;
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

const MOUNT_TIMEOUT_MS = 10_000;
/** A sandbox's disk: the file system image and where it is mounted, in its directory. */
const DISK_IMAGE = "disk.ext4";
const DISK_MOUNT = "disk";
const RUNSC_TIMEOUT_MS = 15_000;
/**
 * mountRoot's host command; every path comes as an argument, never in the script. $1 the disk
 * image ("" for a layer in the directory itself), $2 the blank to copy it from ("" when it exists),
 * $3 where it is mounted, $4 and $5 the overlay's upper and work dirs, $6 the overlay's options,
 * $7 the root, $8 and $9 the agent's FIFOs.
 */
const MOUNT_ROOT_SCRIPT = [
  "set -e",
  'if [ -n "$2" ]; then cp --sparse=always "$2" "$1"; fi',
  'if [ -n "$1" ]; then mount -o loop,nosuid,nodev "$1" "$3"; fi',
  'mkdir -p "$4" "$5"',
  'mount -t overlay overlay -o "$6" "$7"',
  'exec mkfifo -m 600 "$8" "$9"',
].join("\n");
const SHUTDOWN_GRACE_MS = 3_000;
/** How long `runsc run` is given to end after its sentry was killed (by us or by `runsc delete`) before the next, harder step. */
const SENTRY_EXIT_MS = 5_000;
/** What killSentry reads of runsc's state file (`<root>/<id>_sandbox:<id>.state`). */
const RUNSC_STATE = z.object({ sandbox: z.object({ pid: z.number().int().positive() }) });

export class GvisorDriver implements Driver {
  readonly name = "gvisor";
  readonly acceleration: "ptrace" | "systrap";
  /** Containers run on when the server dies; the agent's FIFOs take a new server. */
  readonly attaches = true;
  private readonly runsc: string;
  /** Empty disk images by size in MiB (blankDisk). */
  private readonly blanks = new Map<number, Promise<string>>();
  /** The agent's startup snapshot for `agentNode` (agent-snapshot.ts), once preflight made it. */
  private snapshot: string | undefined;

  constructor(private readonly opts: GvisorOptions) {
    this.runsc = opts.runscPath ?? "runsc";
    this.acceleration = opts.platform ?? "ptrace";
  }

  async preflight(): Promise<void> {
    try {
      await run(this.runsc, ["--version"], { timeoutMs: 10_000 });
    } catch (err) {
      throw new HostSetupError(
        `${this.runsc} (gVisor) is not there: run \`apt-get install runsc\` or set BOTHY_RUNSC.`,
        {
          cause: err,
        },
      );
    }
    for (const file of [
      this.opts.agentPath,
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

  /** @internal the runsc command line prefix shared by every call. */
  runscArgs(...args: string[]): string[] {
    return [
      "--root",
      this.opts.runscRoot,
      `--platform=${this.acceleration}`,
      "--network=none",
      "--overlay2=none",
      ...args,
    ];
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
    return [
      "unshare",
      [
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount -t tmpfs -o ro,size=4k bothy-nonet /proc/sys/net && exec "$@"',
        "bothy-runsc",
        this.runsc,
        ...withNetwork,
      ],
    ];
  }

  get runscPath(): string {
    return this.runsc;
  }

  get options(): GvisorOptions {
    return this.opts;
  }

  async reconcile(): Promise<HostObject[]> {
    const found: HostObject[] = [];
    for (const c of await this.listContainers())
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
      if (await this.hasContainerState(sandboxId)) await this.removeContainer(sandboxId);
    } finally {
      // A mount left behind is the worse leak: unmount even when runsc misbehaves.
      await this.unmountRoot(join(this.opts.sandboxesDir, sandboxId));
    }
  }

  /**
   * Kills and deletes a container. A sandbox that is already on its way out makes runsc fail in
   * several ways (control socket refused or reset, a delete that times out while stopping); what
   * counts is that runsc holds no state for the id afterwards.
   */
  async removeContainer(id: string): Promise<void> {
    const kill = await run(this.runsc, this.runscArgs("kill", "--all", id, "KILL"), {
      timeoutMs: RUNSC_TIMEOUT_MS,
    }).then(
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
      throw new BothyError("internal", `runsc could not remove container ${id}.`, { cause: lastError });
    }
    if (lastError instanceof HostCommandError)
      this.opts.log("runsc_remove_retried", { sandbox_id: id, error: lastError.message.slice(0, 300) });
  }

  /** Whether runsc reports the container as running. */
  async containerRunning(id: string): Promise<boolean> {
    if (!(await this.hasContainerState(id))) return false;
    const state = await run(this.runsc, this.runscArgs("state", id), { timeoutMs: RUNSC_TIMEOUT_MS }).catch(
      () => undefined,
    );
    if (!state) return false;
    try {
      return (JSON.parse(state.stdout) as { status?: string }).status === "running";
    } catch {
      return false;
    }
  }

  /**
   * SIGKILLs the sandbox's sentry, named by runsc's state file and checked by its command line
   * (a pid runsc recorded may since have been reused): the container ends, and the `runsc run`
   * that started it removes its state and cgroup, as after any sandbox death. No runsc command
   * is spawned, where `runsc kill` is a Go program's start and the sentry's control server's
   * work. Whether it found one to kill.
   */
  async killSentry(id: string): Promise<boolean> {
    // No state file, or one runsc is still writing: the caller takes the runsc path instead.
    const state = await readFile(join(this.opts.runscRoot, `${id}_sandbox:${id}.state`), "utf8")
      .then((text) => RUNSC_STATE.safeParse(JSON.parse(text)))
      .catch(() => undefined);
    const pid = state?.success ? state.data.sandbox.pid : undefined;
    if (pid === undefined) return false;
    const argv = (await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "")).split("\0");
    if (!argv.includes("boot") || !argv.includes(`--root=${this.opts.runscRoot}`) || argv.at(-2) !== id) return false;
    try {
      process.kill(pid, "SIGKILL");
      return true;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ESRCH") return false; // it ended on its own meanwhile
      throw err;
    }
  }

  /** Whether runsc still keeps state for this container (it removes it when `run` ends). */
  async hasContainerState(id: string): Promise<boolean> {
    const entries = await readdir(this.opts.runscRoot).catch(() => [] as string[]);
    return entries.some((e) => e.startsWith(`${id}_`));
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

  private async listContainers(): Promise<string[]> {
    if (!existsSync(this.opts.runscRoot)) return [];
    const { stdout } = await run(this.runsc, ["--root", this.opts.runscRoot, "list", "-quiet"], {
      timeoutMs: RUNSC_TIMEOUT_MS,
    });
    return stdout
      .split("\n")
      .map((s) => s.trim())
      .filter((s) => SANDBOX_ID_RE.test(s));
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

/** The agent's channel: two FIFOs in the sandbox's directory, and where runsc writes its own messages. */
function channelFiles(dir: string): { toGuest: string; fromGuest: string; log: string } {
  return { toGuest: join(dir, "agent.in"), fromGuest: join(dir, "agent.out"), log: join(dir, "runsc.log") };
}

/**
 * One gVisor sandbox. The agent's stdio are two FIFOs that runsc holds open at both ends, not
 * pipes to the server: when the server dies the agent sees no end of input and its writes wait
 * for a reader, so the sandbox runs on, and a restarted server opens the FIFOs again (`attach`),
 * sending the resync preamble first since the old server may have died in the middle of a frame.
 */
class GvisorSandbox implements SandboxHandle {
  private started = false;
  private ended = false;
  private exit: Promise<ExitInfo> | undefined;
  /** The runsc process this server started, or `runsc wait` for one it attached to. */
  private watcher: ChildProcess | undefined;
  private destroying: Promise<void> | undefined;
  /** ms of each phase of `start` (SandboxHandle.startSteps). */
  readonly startSteps: Record<string, number> = {};
  /** Started in a cgroup with limits, at the lowest CPU weight (a `background` boot) until `prioritize`. */
  private lowWeight = false;

  constructor(
    private readonly spec: SandboxSpec,
    private readonly driver: GvisorDriver,
  ) {}

  /** Runs one phase of `start`, noting how long it took. */
  private async phase<T>(name: string, work: () => Promise<T>): Promise<T> {
    const t0 = performance.now();
    try {
      return await work();
    } finally {
      this.startSteps[name] = Math.round(performance.now() - t0);
    }
  }

  async prioritize(): Promise<void> {
    if (!this.lowWeight) return;
    await restoreSandboxCpuWeight(await hostCgroupLayout(), this.driver.options.hostTag, this.id);
    this.lowWeight = false;
  }

  get id(): string {
    return this.spec.id;
  }

  async start(undo: CleanupStack, signal?: AbortSignal, hostReady?: Promise<void>): Promise<GuestStream> {
    if (this.started || this.destroying) throw new BothyError("internal", `Sandbox ${this.id} was already started.`);
    this.started = true;
    await this.acquireVolumes(undo);
    if (this.spec.attach) return this.attach(undo);
    const hostLimits = await this.phase("limits", () => this.driver.hostLimits());
    this.lowWeight = hostLimits && this.spec.background === true;
    const { dir } = this.spec;
    const rootfs = join(dir, "rootfs");
    // A new sandbox's directory must not exist yet; a stopped one's holds its disk, which is not this start's to remove.
    const reuse = this.spec.reuseDisk === true;
    await mkdir(dir, { recursive: reuse, mode: 0o700 });
    if (!reuse) undo.push("sandbox directory", () => rm(dir, { recursive: true, force: true }));
    await Promise.all(["rootfs", "bundle"].map((d) => mkdir(join(dir, d), { recursive: reuse })));
    const files = channelFiles(dir);
    await this.phase("mounts", () => this.mountRoot(rootfs, files, undo));
    signal?.throwIfAborted();
    const t0 = performance.now();
    const network = this.spec.network;
    const resolvConf = network ? join(dir, "bundle", "resolv.conf") : undefined;
    if (network && resolvConf)
      await writeFile(resolvConf, network.dns.map((d) => `nameserver ${d}\n`).join(""), { mode: 0o644 });
    const oci = buildOciSpec({
      ...this.spec,
      rootfs,
      agentPath: this.driver.options.agentPath,
      ...(this.driver.options.agentNode === undefined ? {} : { agentNode: this.driver.options.agentNode }),
      ...(this.driver.agentSnapshot === undefined ? {} : { agentSnapshot: this.driver.agentSnapshot }),
      cgroupsPath: cgroupPath(this.driver.options.hostTag, this.id),
      hostLimits,
      ...(resolvConf ? { resolvConf } : {}),
    });
    await writeFile(join(dir, "bundle", "config.json"), JSON.stringify(oci));
    this.startSteps["bundle"] = Math.round(performance.now() - t0);
    // The network's namespace, made meanwhile, must be whole before runsc enters it.
    if (hostReady) await this.phase("network-wait", () => hostReady);
    signal?.throwIfAborted();
    const [file, args] = this.driver.runCommand(join(dir, "bundle"), this.id, network !== undefined);
    // Read-write opens never block on a FIFO and keep both ends open in runsc for its lifetime.
    const fds = [
      openSync(files.toGuest, fsConstants.O_RDWR),
      openSync(files.fromGuest, fsConstants.O_RDWR),
      openSync(files.log, "a", 0o600),
    ];
    // The container (runsc removes its cgroup with it).
    undo.push("container", () => this.kill());
    try {
      // Out of the server's process group and session: a terminal's Ctrl-C goes to the server,
      // which stops its sandboxes in order, and a server that dies leaves them running.
      this.watch(spawn(file, args, { stdio: fds, detached: true }), true);
    } finally {
      for (const fd of fds) closeSync(fd);
    }
    return this.connect(false);
  }

  /**
   * The sandbox's root and channel, made by one host command (each spawn from the server's
   * process costs it a fork of its whole address space, several ms of CPU at a server's size):
   * the sandbox's own disk, an ext4 file system of `diskMib` in a sparse file (`disk.ext4`, copied
   * from the blank image on first start), loop-mounted at `disk/` and holding the overlay's upper
   * and work directories, so a sandbox that fills its disk gets ENOSPC instead of filling the
   * host's; the root overlay, the template read-only underneath, every write in the upper dir; and
   * the agent's FIFOs. Without `diskMib` (sandboxes made before disk sizes) the layer lives in the
   * directory itself. Each undo goes on before the command: one cut short by its timeout may
   * still have mounted.
   */
  private async mountRoot(
    rootfs: string,
    files: { toGuest: string; fromGuest: string },
    undo: CleanupStack,
  ): Promise<void> {
    const { dir, diskMib } = this.spec;
    const image = join(dir, DISK_IMAGE);
    const onDisk = diskMib !== undefined || existsSync(image);
    const base = onDisk ? join(dir, DISK_MOUNT) : dir;
    const blank = onDisk && !existsSync(image) ? await this.driver.blankDisk(diskMib ?? 0) : "";
    if (onDisk) {
      await mkdir(base, { recursive: true });
      undo.push("disk mount", () => this.driver.unmount(base));
    }
    await Promise.all([files.toGuest, files.fromGuest].map((f) => rm(f, { force: true })));
    undo.push("root overlay", () => this.driver.unmount(rootfs));
    const upper = join(base, "upper");
    const work = join(base, "work");
    // The template's whole chain of layers, top first, under the sandbox's own upper.
    const lower = (await lowerDirsOf(this.spec.templateRoot)).join(":");
    await run(
      "sh",
      [
        "-c",
        MOUNT_ROOT_SCRIPT,
        "bothy-mount-root",
        onDisk ? image : "",
        blank,
        base,
        upper,
        work,
        `lowerdir=${lower},upperdir=${upper},workdir=${work}`,
        rootfs,
        files.toGuest,
        files.fromGuest,
      ],
      { timeoutMs: MOUNT_TIMEOUT_MS },
    );
  }

  /**
   * The host mounts of the sandbox's volumes, made (or, on a take-over, found still there) before
   * runsc binds them; released when the sandbox stops or is destroyed.
   */
  private async acquireVolumes(undo: CleanupStack): Promise<void> {
    const { volumes, volumeHost } = this.spec;
    if (!volumes?.length || !volumeHost) return;
    await this.phase("volumes", () =>
      volumeHost.acquire(
        this.id,
        volumes.map((v) => v.volumeId),
      ),
    );
    undo.push("volumes", () => volumeHost.release(this.id));
  }

  private async releaseVolumes(): Promise<void> {
    await this.spec.volumeHost?.release(this.id);
  }

  /**
   * Takes over a container an earlier server started: `runsc wait` tells when it ends. A take-over
   * that fails stops the sandbox (its disk stays).
   */
  private async attach(undo: CleanupStack): Promise<GuestStream> {
    if (!(await this.driver.containerRunning(this.id)))
      throw new BootError("attach", `Sandbox ${this.id} has no running container to attach to.`);
    this.watch(spawn(this.driver.runscPath, this.driver.runscArgs("wait", this.id), { stdio: "ignore" }), false);
    undo.push("container", () => this.stop());
    return this.connect(true);
  }

  private watch(child: ChildProcess, exitIsTheSandbox: boolean): void {
    this.watcher = child;
    this.exit = new Promise<ExitInfo>((resolve) => {
      child.once("error", () => resolve({ code: null, signal: null }));
      child.once("exit", (code, sig) =>
        resolve(exitIsTheSandbox ? { code, signal: sig } : { code: null, signal: null }),
      );
    }).finally(() => {
      this.ended = true;
    });
  }

  /** Opens the server's ends of the agent's FIFOs (never blocking: runsc holds the other ends). */
  private connect(resync: boolean): GuestStream {
    const files = channelFiles(this.spec.dir);
    const output = new Socket({
      fd: openSync(files.toGuest, fsConstants.O_WRONLY | fsConstants.O_NONBLOCK),
      readable: false,
      writable: true,
    });
    const input = new Socket({
      fd: openSync(files.fromGuest, fsConstants.O_RDONLY | fsConstants.O_NONBLOCK),
      readable: true,
      writable: false,
    });
    if (resync) output.write(resyncPreamble());
    return { input, output, resync };
  }

  /** What runsc printed last; useful when the agent never said hello. */
  get diagnostics(): string {
    try {
      return readFileSync(channelFiles(this.spec.dir).log, "utf8").slice(-4096).trim();
    } catch {
      return "";
    }
  }

  wait(): Promise<ExitInfo> {
    return this.exit ?? Promise.resolve({ code: null, signal: null });
  }

  async shutdown(timeoutMs: number): Promise<void> {
    if (!this.watcher || this.ended) return;
    // bothy-init passes SIGTERM to the agent, which ends its commands and exits; the container ends with it.
    await run(this.driver.runscPath, this.driver.runscArgs("kill", this.id, "TERM"), {
      timeoutMs: RUNSC_TIMEOUT_MS,
    }).catch(() => undefined);
    if (!(await this.exitsWithin(timeoutMs))) await this.kill();
  }

  /** Whether `runsc run` ends within `ms`. */
  private async exitsWithin(ms: number): Promise<boolean> {
    const timer = new Promise<"timeout">((r) => setTimeout(() => r("timeout"), ms).unref());
    return (await Promise.race([this.wait(), timer])) !== "timeout";
  }

  async kill(): Promise<void> {
    if (await this.driver.hasContainerState(this.id)) await this.driver.removeContainer(this.id);
    const child = this.watcher;
    if (child && !this.ended) {
      if (!(await this.exitsWithin(SENTRY_EXIT_MS))) child.kill("SIGKILL");
      await this.wait();
    }
  }

  async stop(): Promise<void> {
    try {
      await this.shutdown(SHUTDOWN_GRACE_MS);
    } finally {
      try {
        await this.driver.release(this.id);
      } finally {
        await this.releaseVolumes();
      }
    }
  }

  destroy(): Promise<void> {
    this.destroying ??= (async () => {
      // Nothing of the sandbox is kept, so nothing inside needs a graceful end: its sentry is
      // killed and the container ends at once. Where that cannot be done, the agent is asked to
      // exit and a wedged one is killed after the grace time. runsc removes its own state either
      // way; what it leaves, release removes.
      try {
        if (this.watcher && !this.ended && (await this.driver.killSentry(this.id))) {
          if (!(await this.exitsWithin(SENTRY_EXIT_MS))) await this.kill();
        } else await this.shutdown(SHUTDOWN_GRACE_MS);
      } finally {
        try {
          await this.driver.removeOrphan(this.id);
        } finally {
          await this.releaseVolumes();
        }
      }
    })().catch((err: unknown) => {
      this.destroying = undefined; // a failed destroy may be tried again
      throw err;
    });
    return this.destroying;
  }
}
