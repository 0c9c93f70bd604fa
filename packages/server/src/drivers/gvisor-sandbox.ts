import { spawn, type ChildProcess } from "node:child_process";
import { closeSync, constants as fsConstants, existsSync, openSync, readFileSync } from "node:fs";
import { Socket } from "node:net";
import { mkdir, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { BothyError, resyncPreamble } from "@bothy/protocol";
import { run } from "../util/host-command.ts";
import { cgroupPath } from "../util/host-names.ts";
import type { ExitInfo, GuestStream, SandboxHandle, SandboxSpec } from "./driver.ts";
import type { CleanupStack } from "../util/cleanup-stack.ts";
import type { GvisorDriver } from "./gvisor-driver.ts";
import { hostCgroupLayout, restoreSandboxCpuWeight } from "./host-cgroups.ts";
import { buildOciSpec, machineIdOf } from "./oci-spec.ts";
import { BootError } from "../errors/internal-errors.ts";
import { lowerDirsOf } from "../images/layer-store.ts";
import { thawAfterCrash } from "./gvisor-snapshot.ts";

/** How long a mount, unmount or mkfs may take. */
export const MOUNT_TIMEOUT_MS = 10_000;
/** A sandbox's disk: the file system image and where it is mounted, in its directory. */
const DISK_IMAGE = "disk.ext4";
export const DISK_MOUNT = "disk";
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
/** How long the container's waiter is given to end after its sentry was killed (by us or by `runsc delete`) before the next, harder step. */
const SENTRY_EXIT_MS = 5_000;

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
export class GvisorSandbox implements SandboxHandle {
  private started = false;
  private ended = false;
  private exit: Promise<ExitInfo> | undefined;
  /** The container's waiter this server started (runsc.ts runCommand), or `runsc wait` for one it attached to. */
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
    const machineIdFile = join(dir, "bundle", "machine-id");
    await writeFile(machineIdFile, `${machineIdOf(this.id)}\n`, { mode: 0o444 });
    const oci = buildOciSpec({
      ...this.spec,
      rootfs,
      agentPath: this.driver.options.agentPath,
      ...(this.driver.options.agentNode === undefined ? {} : { agentNode: this.driver.options.agentNode }),
      agentStart: this.driver.options.agentStart ?? "boot",
      ...(this.driver.agentSnapshot === undefined ? {} : { agentSnapshot: this.driver.agentSnapshot }),
      cgroupsPath: cgroupPath(this.driver.options.hostTag, this.id),
      hostLimits,
      ...(resolvConf ? { resolvConf } : {}),
      machineIdFile,
    });
    await writeFile(join(dir, "bundle", "config.json"), JSON.stringify(oci));
    this.startSteps["bundle"] = Math.round(performance.now() - t0);
    // The network's namespace, made meanwhile, must be whole before runsc enters it.
    if (hostReady) await this.phase("network-wait", () => hostReady);
    signal?.throwIfAborted();
    const [file, args] = this.driver.runsc.runCommand(join(dir, "bundle"), this.id, network !== undefined);
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
    // A capture the old server died in the middle of left it frozen: it runs on from where it was.
    if (await thawAfterCrash(this.driver.runsc, this.id, this.spec.dir))
      this.driver.options.log("snapshot_capture_thawed", { sandbox_id: this.id });
    if (!(await this.driver.runsc.running(this.id)))
      throw new BootError("attach", `Sandbox ${this.id} has no running container to attach to.`);
    const [file, args] = this.driver.runsc.waitCommand(this.id);
    this.watch(spawn(file, args, { stdio: "ignore" }), false);
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
    await this.driver.runsc.signal(this.id, "TERM").catch(() => undefined);
    if (!(await this.exitsWithin(timeoutMs))) await this.kill();
  }

  /** Whether the container's waiter ends within `ms`. */
  private async exitsWithin(ms: number): Promise<boolean> {
    const timer = new Promise<"timeout">((r) => setTimeout(() => r("timeout"), ms).unref());
    return (await Promise.race([this.wait(), timer])) !== "timeout";
  }

  async kill(): Promise<void> {
    if (await this.driver.runsc.hasState(this.id)) await this.driver.runsc.remove(this.id);
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
        if (this.watcher && !this.ended && (await this.driver.runsc.killSentry(this.id))) {
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
