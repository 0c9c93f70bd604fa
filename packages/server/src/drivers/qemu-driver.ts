import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { access, constants, mkdir, mkdtemp, readdir, readFile, rename, rm } from "node:fs/promises";
import { join } from "node:path";
import { BothyError, SANDBOX_ID_RE } from "@bothy/protocol";
import { AgentClient } from "../agent/agent-client.ts";
import { ensureDiskImage, type DiskImage } from "../images/disk-chain.ts";
import { GUEST_MAX_PROCESSES } from "../images/guest-init.ts";
import { ensureInitramfs } from "../images/initramfs.ts";
import { ensureKernel, type GuestKernel } from "../images/kernel.ts";
import { run } from "../util/host-command.ts";
import { snapshotTapName } from "../util/host-names.ts";
import {
  createSandboxCgroup,
  hostCgroupLayout,
  HOST_PIDS_BACKSTOP,
  limitsProblem,
  removeSandboxCgroup,
  requireHostLimits,
  sandboxCgroupDirs,
} from "./host-cgroups.ts";
import { bootTimeoutMs, type Driver, type HostObject, type SandboxHandle, type SandboxSpec } from "./driver.ts";
import { saveVm, VmProcess, vmFiles, type Acceleration, type VmConfig } from "./qemu-process.ts";
import { MEMORY_STATE, QemuSandbox, VM_MARKER } from "./qemu-sandbox.ts";
import { captureVm, readVmSnapshot } from "./qemu-snapshot.ts";
import type { Logger } from "../events/server-events.ts";
import { HostSetupError, TemplateError } from "../errors/internal-errors.ts";

export interface QemuOptions {
  home: string;
  /** The home's tag (util/host-names.ts): names the warm-start snapshot VM's tap. */
  hostTag: string;
  /** Where unpacked guest kernels are cached; default `<home>/kernel`. */
  kernelDir?: string;
  /** Parent of every sandbox directory; each sandbox dir is `<sandboxesDir>/<id>`. */
  sandboxesDir: string;
  agentPath: string;
  qemuPath?: string;
  /** Default: kvm when hardware virtualization is really usable, else tcg. */
  accel?: Acceleration;
  /** TCG translation cache in MiB; bounds an idle VM's memory beyond the guest's own. */
  tbSizeMib?: number;
  /** Restore new sandboxes from a per-template memory snapshot instead of booting each. */
  warmStart?: boolean;
  bootTimeoutMs?: number;
  /** Sandboxes get a virtio-net on a tap (network/); the warm-start snapshot then has one too. */
  network?: boolean;
  /** `off`: a host whose cgroups cannot limit VMs runs them unlimited instead of refusing (BOTHY_HOST_LIMITS). */
  hostLimits?: "required" | "off";
  log: Logger;
}

export interface BaseSnapshot {
  dir: string;
  disk: string;
  memory: string;
}

/** The same default as the server's BOTHY_QEMU_TB_MIB (config.ts). */
const DEFAULT_TB_SIZE_MIB = 64;
const MIB = 1024 * 1024;
const SAVE_TIMEOUT_MS = 60_000;
/**
 * What a VM's QEMU may use beyond the guest's memory and (under TCG) its translation cache: its
 * own code and buffers, and the host page cache its disk writes dirty (charged to its cgroup).
 */
const QEMU_OVERHEAD_MIB = 256;
const CPU_PERIOD_US = 100_000;

/**
 * Whether KVM can really run a guest here. The device node alone says nothing (this project's
 * development machine has a /dev/kvm that cannot run a stock kernel): the CPU must show vmx or
 * svm, and the node must open.
 */
export async function hardwareVirtualization(): Promise<boolean> {
  const flags = /^flags\s*:(.*)$/m.exec(await readFile("/proc/cpuinfo", "utf8").catch(() => ""))?.[1] ?? "";
  if (!/\b(vmx|svm)\b/.test(flags)) return false;
  return access("/dev/kvm", constants.R_OK | constants.W_OK).then(
    () => true,
    () => false,
  );
}

/**
 * The QEMU microvm driver: one VM per sandbox with its own qcow2 overlay over the template's
 * read-only ext4 image, the agent on a virtio-serial port, QMP for control. New sandboxes are
 * restored from a memory snapshot of the template booted once to agent-ready (warm start).
 */
export class QemuDriver implements Driver {
  readonly name = "qemu";
  /** A VM runs on when the server dies (its own session); its sockets take a new server. */
  readonly attaches = true;
  private accel: Acceleration;
  private kernel: GuestKernel | undefined;
  private initramfs: string | undefined;
  private readonly bases = new Map<string, Promise<BaseSnapshot>>();
  /** Snapshots being made now: their VM and temp dir are not leftovers for reconcile to remove. */
  private snapshotsInFlight = 0;

  constructor(private readonly opts: QemuOptions) {
    this.accel = opts.accel ?? "tcg";
  }

  get acceleration(): Acceleration {
    return this.accel;
  }

  get options(): QemuOptions {
    return this.opts;
  }

  get snapshotsDir(): string {
    return join(this.opts.home, "qemu", "snapshots");
  }

  async preflight(): Promise<void> {
    try {
      await run(this.qemuPath, ["--version"], { timeoutMs: 10_000 });
    } catch (err) {
      throw new HostSetupError("QEMU is not installed: run `apt-get install qemu-system-x86 qemu-utils`.", {
        cause: err,
      });
    }
    if (!existsSync(this.opts.agentPath))
      throw new HostSetupError(`The guest agent bundle ${this.opts.agentPath} is missing: run \`npm run build\`.`);
    if (this.opts.accel === undefined) this.accel = (await hardwareVirtualization()) ? "kvm" : "tcg";
    this.kernel = await ensureKernel(this.opts.kernelDir ?? join(this.opts.home, "kernel"), this.opts.log);
    this.initramfs = await ensureInitramfs({
      home: this.opts.home,
      kernel: this.kernel,
      agentPath: this.opts.agentPath,
    });
    await mkdir(this.opts.sandboxesDir, { recursive: true, mode: 0o700 });
    await mkdir(this.snapshotsDir, { recursive: true, mode: 0o700 });
  }

  create(spec: SandboxSpec): SandboxHandle {
    return new QemuSandbox(spec, this);
  }

  /** A pause wrote the VM's memory and devices to `memory.state` in its directory. */
  savedMemory(spec: SandboxSpec): boolean {
    return existsSync(join(spec.dir, MEMORY_STATE));
  }

  /** @internal throws a NotSupportedError, saying how to fix the host, when VMs could not be limited. */
  async requireHostLimits(): Promise<void> {
    requireHostLimits(await hostCgroupLayout(), this.opts.hostLimits ?? "required");
  }

  /**
   * @internal makes the sandbox's cgroup (`bothy-<tag>/<id>` on the host's layout) with its limits: CPU
   * quota `vcpu` × the period, memory for the guest, the translation cache and QEMU itself, and a
   * pids backstop; returns the `cgroup.procs` files its QEMU joins. None when the host cannot
   * limit and the operator opted out.
   */
  async sandboxCgroup(spec: { id: string; vcpu: number; memoryMib: number }): Promise<string[]> {
    const layout = await hostCgroupLayout();
    if (limitsProblem(layout) !== undefined) return [];
    const tb = this.accel === "tcg" ? (this.opts.tbSizeMib ?? DEFAULT_TB_SIZE_MIB) : 0;
    return createSandboxCgroup(layout, this.opts.hostTag, spec.id, {
      cpuQuotaUs: Math.round(spec.vcpu * CPU_PERIOD_US),
      cpuPeriodUs: CPU_PERIOD_US,
      memoryBytes: (spec.memoryMib + tb + QEMU_OVERHEAD_MIB) * MIB,
      pids: HOST_PIDS_BACKSTOP,
    });
  }

  /**
   * @internal removes the sandbox's cgroup: its QEMU was killed before (`killed`), so a task still
   * leaving is waited for; otherwise one that holds processes is another driver's and stays.
   */
  async removeSandboxCgroup(sandboxId: string, killed = true): Promise<void> {
    await removeSandboxCgroup(await hostCgroupLayout(), this.opts.hostTag, sandboxId, killed ? undefined : 0);
  }

  get qemuPath(): string {
    return this.opts.qemuPath ?? "qemu-system-x86_64";
  }

  /** @internal the parts of a VM's configuration every VM of this driver shares. */
  vmConfig(
    spec: { vcpu: number; memoryMib: number; network?: { tap?: string } },
    dir: string,
    disk: string,
    incoming?: string,
  ): VmConfig {
    if (!this.kernel || !this.initramfs)
      throw new BothyError("internal", "The QEMU driver was used before its preflight.");
    return {
      qemuPath: this.qemuPath,
      accel: this.accel,
      tbSizeMib: this.opts.tbSizeMib ?? DEFAULT_TB_SIZE_MIB,
      vmlinuz: this.kernel.vmlinuz,
      initramfs: this.initramfs,
      disk,
      vcpu: spec.vcpu,
      memoryMib: spec.memoryMib,
      dir,
      ...(incoming === undefined ? {} : { incoming }),
      ...(spec.network?.tap === undefined ? {} : { tap: spec.network.tap }),
    };
  }

  get warmStart(): boolean {
    return this.opts.warmStart ?? true;
  }

  /**
   * A qcow2 overlay at `path` over `backing` (the top of a template's disk chain, raw or qcow2, or
   * a warm-start snapshot's qcow2), of the backing file's size or, given `bytes`, that size.
   */
  async createOverlay(path: string, backing: string, backingFormat: "raw" | "qcow2", bytes?: number): Promise<void> {
    await run(
      "qemu-img",
      [
        "create",
        "-q",
        "-f",
        "qcow2",
        "-F",
        backingFormat,
        "-b",
        backing,
        path,
        ...(bytes === undefined ? [] : [String(bytes)]),
      ],
      { timeoutMs: 30_000 },
    );
  }

  /**
   * A sandbox's disk size: the template's image grown by `diskMib` (room for its own files);
   * sandboxes made before disk sizes (no `diskMib`) have the image's size.
   */
  async diskBytes(templateRoot: string, diskMib: number | undefined): Promise<number> {
    // A snapshot's disk already has its source's room; its sandboxes keep that size.
    const snapshot = await readVmSnapshot(templateRoot);
    if (snapshot) return snapshot.diskBytes;
    return (await ensureDiskImage(templateRoot)).bytes + (diskMib ?? 0) * MIB;
  }

  /**
   * The memory snapshot new sandboxes of this template, shape and disk size restore from: made
   * on first use by booting the template once to agent-ready with its disk grown to that size,
   * then kept (like the ext4 image, a cache). Each disk size has its own, so a restored
   * sandbox's disk never needs growing.
   */
  baseSnapshot(
    templateRoot: string,
    shape: { vcpu: number; memoryMib: number; diskMib?: number },
  ): Promise<BaseSnapshot> {
    const keyed = async (): Promise<{ key: string; image: DiskImage; diskBytes: number }> => {
      const image = await ensureDiskImage(templateRoot);
      const diskBytes = await this.diskBytes(templateRoot, shape.diskMib);
      const cfg = this.vmConfig(shape, "", "");
      const key = createHash("sha256")
        .update(JSON.stringify({ image: image.path, ...cfg, diskBytes, network: this.opts.network === true, v: 2 }))
        .digest("hex")
        .slice(0, 24);
      return { key, image, diskBytes };
    };
    return keyed().then(({ key, image, diskBytes }) => {
      let job = this.bases.get(key);
      if (job === undefined) {
        job = this.makeBase(key, image, diskBytes, shape);
        job.catch(() => this.bases.delete(key));
        this.bases.set(key, job);
      }
      return job;
    });
  }

  private async makeBase(
    key: string,
    image: DiskImage,
    diskBytes: number,
    shape: { vcpu: number; memoryMib: number; diskMib?: number },
  ): Promise<BaseSnapshot> {
    const dir = join(this.snapshotsDir, key);
    const done: BaseSnapshot = { dir, disk: join(dir, "disk.qcow2"), memory: join(dir, "memory.state") };
    if (existsSync(done.memory) && existsSync(done.disk)) return done;
    const started = Date.now();
    this.snapshotsInFlight++;
    let work: string | undefined;
    let vm: VmProcess | undefined;
    try {
      work = await mkdtemp(join(this.snapshotsDir, `.tmp-${key}-`));
      await this.createOverlay(join(work, "disk.qcow2"), image.path, image.format, diskBytes);
      // A restore needs the snapshot's devices: with networking the snapshot VM has a NIC too, on a
      // transient tap QEMU makes itself, down and without an address, gone when QEMU ends.
      const network = this.opts.network ? { tap: snapshotTapName(this.opts.hostTag, key) } : undefined;
      vm = await VmProcess.spawn(
        this.vmConfig({ ...shape, ...(network ? { network } : {}) }, work, join(work, "disk.qcow2")),
      );
      const qmp = await vm.qmp();
      const sock = await vm.connectSocket(vmFiles(work).agentSocket);
      const agent = new AgentClient(sock, sock);
      await agent.handshake(bootTimeoutMs(this.accel, this.opts.bootTimeoutMs ?? 60_000));
      // The guest boots on a disk larger than its file system: it grows the file system now, once
      // for every sandbox of this snapshot (each gets its own process limit at restore).
      if ((shape.diskMib ?? 0) > 0)
        await agent.applyLimits({ maxProcesses: GUEST_MAX_PROCESSES, rootBytes: diskBytes });
      // The host leaves before the save, so a restored agent starts out waiting for a host.
      agent.close(new BothyError("agent_unavailable", "Snapshot taken."));
      await saveVm(qmp, join(work, "memory.state"), SAVE_TIMEOUT_MS);
      await vm.stop(qmp, 5_000);
      qmp.close();
      for (const f of Object.values(vmFiles(work))) await rm(f, { force: true });
      await rename(work, dir);
      this.opts.log("qemu_base_snapshot", { key, image: image.path, ms: Date.now() - started });
      return done;
    } catch (err) {
      const diagnostics = vm ? await vm.diagnostics() : "";
      throw new TemplateError("Making the warm-start snapshot failed.", { cause: err, diagnostics });
    } finally {
      if (vm?.running) await vm.stop(undefined, 0);
      if (work !== undefined) await rm(work, { recursive: true, force: true });
      this.snapshotsInFlight--;
    }
  }

  /**
   * What a VM's memory can be restored into: the same QEMU, acceleration, translation cache,
   * kernel and initramfs, vCPUs, memory and NIC (a migration stream names the devices it saved).
   */
  machineKey(spec: { vcpu: number; memoryMib: number; network?: { tap?: string } }): string {
    const c = this.vmConfig(spec, "", "");
    const { qemuPath, accel, tbSizeMib, vmlinuz, initramfs, vcpu, memoryMib } = c;
    return createHash("sha256")
      .update(
        JSON.stringify({ qemuPath, accel, tbSizeMib, vmlinuz, initramfs, vcpu, memoryMib, nic: c.tap !== undefined }),
      )
      .digest("hex")
      .slice(0, 24);
  }

  /**
   * A snapshot of sandbox `dir` (qemu-snapshot.ts): its disk frozen over `baseRoot`'s image, its
   * memory too with `memory`; a running one is stopped for the copy only.
   */
  async captureImage(
    sandbox: { id: string; dir: string; handle?: SandboxHandle },
    baseRoot: string,
    out: string,
    memory: boolean,
  ): Promise<{ frozenMs: number; files: string[] }> {
    if (sandbox.handle !== undefined && !(sandbox.handle instanceof QemuSandbox))
      throw new BothyError("internal", `Sandbox ${sandbox.id} is not a QEMU sandbox.`);
    return captureVm({
      dir: sandbox.dir,
      vm: sandbox.handle,
      base: await ensureDiskImage(baseRoot),
      out,
      memory,
    });
  }

  async reconcile(): Promise<HostObject[]> {
    const found: HostObject[] = [];
    for (const p of await this.findProcesses()) {
      if (p.sandboxId) found.push({ sandboxId: p.sandboxId, kind: "qemu-process", description: `qemu pid ${p.pid}` });
    }
    const layout = await hostCgroupLayout();
    for (const id of await readdir(this.opts.sandboxesDir).catch(() => [] as string[])) {
      if (SANDBOX_ID_RE.test(id) && existsSync(join(this.opts.sandboxesDir, id, VM_MARKER))) {
        found.push({ sandboxId: id, kind: "vm-dir", description: join(this.opts.sandboxesDir, id), disk: true });
        // A start cut short by a crash can leave a stopped or paused VM's cgroup behind.
        const cgroups = sandboxCgroupDirs(layout, this.opts.hostTag, id).filter((d) => existsSync(d));
        if (cgroups.length > 0) found.push({ sandboxId: id, kind: "cgroup", description: cgroups.join(", ") });
      }
    }
    // A snapshot half made when the server stopped: its VM and temp dir go now (reconcile also
    // runs periodically, so never while this process is making one).
    if (this.snapshotsInFlight === 0) {
      for (const p of await this.findProcesses())
        if (!p.sandboxId && this.snapshotsInFlight === 0) await this.killPid(p.pid);
      for (const e of await readdir(this.snapshotsDir).catch(() => [] as string[])) {
        if (e.startsWith(".tmp-") && this.snapshotsInFlight === 0)
          await rm(join(this.snapshotsDir, e), { recursive: true, force: true });
      }
    }
    return found;
  }

  async removeOrphan(sandboxId: string): Promise<void> {
    if (!SANDBOX_ID_RE.test(sandboxId))
      throw new BothyError("invalid_sandbox_id", `Refusing to remove ${sandboxId}: not a sandbox id.`);
    // The VM's directory may be gone already (every driver removes an orphan's), its cgroup not.
    await this.removeSandboxCgroup(sandboxId, await this.killSandboxProcesses(sandboxId));
    await rm(join(this.opts.sandboxesDir, sandboxId), { recursive: true, force: true });
  }

  /** Kills the sandbox's QEMU and removes its sockets; the disk overlay and any saved memory stay. */
  async release(sandboxId: string): Promise<void> {
    if (!SANDBOX_ID_RE.test(sandboxId))
      throw new BothyError("invalid_sandbox_id", `Refusing to release ${sandboxId}: not a sandbox id.`);
    await this.removeSandboxCgroup(sandboxId, await this.killSandboxProcesses(sandboxId));
    const files = vmFiles(join(this.opts.sandboxesDir, sandboxId));
    // A save cut short leaves a partial state file; a whole one (memory.state) stays.
    for (const f of [
      files.agentSocket,
      files.qmpSocket,
      files.pidFile,
      join(this.opts.sandboxesDir, sandboxId, "memory.state.partial"),
    ])
      await rm(f, { force: true });
  }

  /** @internal the QEMU running for this sandbox, if any. */
  async sandboxPid(sandboxId: string): Promise<number | undefined> {
    return (await this.findProcesses()).find((p) => p.sandboxId === sandboxId)?.pid;
  }

  /** @internal kills every QEMU whose command line names this sandbox's directory; says whether there was one. */
  async killSandboxProcesses(sandboxId: string): Promise<boolean> {
    let killed = false;
    for (const p of await this.findProcesses())
      if (p.sandboxId === sandboxId) {
        await this.killPid(p.pid);
        killed = true;
      }
    return killed;
  }

  /** QEMU processes of this bothy home, found by their command lines (pid files can be stale). */
  private async findProcesses(): Promise<Array<{ pid: number; sandboxId: string | undefined }>> {
    const out: Array<{ pid: number; sandboxId: string | undefined }> = [];
    const prefix = `${this.opts.sandboxesDir.replace(/\/$/, "")}/`;
    const snaps = `${this.snapshotsDir}/`;
    for (const entry of await readdir("/proc")) {
      if (!/^\d+$/.test(entry)) continue;
      const argv = await readFile(`/proc/${entry}/cmdline`, "utf8").then(
        (s) => s.split("\0"),
        () => [] as string[],
      );
      if (!argv[0]?.includes("qemu-system")) continue;
      const joined = argv.join(" ");
      const at = joined.indexOf(prefix);
      if (at >= 0) out.push({ pid: Number(entry), sandboxId: joined.slice(at + prefix.length).split("/")[0] });
      else if (joined.includes(snaps)) out.push({ pid: Number(entry), sandboxId: undefined });
    }
    return out;
  }

  private async killPid(pid: number): Promise<void> {
    try {
      process.kill(pid, "SIGKILL");
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ESRCH") return;
      throw err;
    }
    for (let i = 0; i < 100 && existsSync(`/proc/${pid}/cmdline`); i++) {
      // A zombie child of ours keeps its /proc entry until reaped; its cmdline is then empty.
      if ((await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "")) === "") return;
      await new Promise((r) => setTimeout(r, 20));
    }
  }
}
