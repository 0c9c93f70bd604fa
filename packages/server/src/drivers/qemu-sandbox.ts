import { existsSync, readFileSync } from "node:fs";
import { mkdir, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { BothyError } from "@bothy/protocol";
import { ensureDiskImage } from "../images/disk-chain.ts";
import { volumeSerial } from "../images/guest-init.ts";
import type { ExitInfo, GuestStream, GuestVolume, SandboxHandle, SandboxSpec } from "./driver.ts";
import type { CleanupStack } from "../util/cleanup-stack.ts";
import type { QemuDriver } from "./qemu-driver.ts";
import { resumeIncoming, saveVm, thawVm, VmProcess, vmFiles } from "./qemu-process.ts";
import { clearFrozen, frozenByCapture, holdForTest, markFrozen } from "./capture-freeze.ts";
import { readVmSnapshot, vmSnapshotFiles, type FreezableVm, type VmSnapshotMeta } from "./qemu-snapshot.ts";
import type { QmpClient } from "./qmp-client.ts";
import { BootError } from "../errors/internal-errors.ts";

/** Written first into a QEMU sandbox's directory, so reconcile knows the directory is a VM's. */
export const VM_MARKER = "vm.json";
/** A paused sandbox's memory and device state, in its directory. */
export const MEMORY_STATE = "memory.state";
const RESTORE_TIMEOUT_MS = 60_000;
const SAVE_TIMEOUT_MS = 60_000;
const QUIT_GRACE_MS = 3_000;
/** The disk's id on QEMU's command line (qemu-process.ts). */
const ROOT_DRIVE = "root";

/**
 * One QEMU sandbox. Its directory holds the disk overlay, sockets, pid file, console log and,
 * while paused, the memory state. `wait()` resolves when the sandbox ends for good: a pause ends
 * the QEMU process but not the sandbox.
 */
export class QemuSandbox implements SandboxHandle, FreezableVm {
  readonly needsIdentity = true;
  private vm: VmProcess | undefined;
  private qmp: QmpClient | undefined;
  private started = false;
  private paused = false;
  private rootBytes: number | undefined;
  private destroying: Promise<void> | undefined;
  private resolveEnd!: (exit: ExitInfo) => void;
  private readonly ended = new Promise<ExitInfo>((r) => (this.resolveEnd = r));

  constructor(
    private readonly spec: SandboxSpec,
    private readonly driver: QemuDriver,
  ) {}

  get id(): string {
    return this.spec.id;
  }

  private get disk(): string {
    return join(this.spec.dir, "disk.qcow2");
  }

  private get memoryState(): string {
    return join(this.spec.dir, MEMORY_STATE);
  }

  async start(undo: CleanupStack, signal?: AbortSignal, hostReady?: Promise<void>): Promise<GuestStream> {
    if (this.started || this.destroying) throw new BothyError("internal", `Sandbox ${this.id} was already started.`);
    this.started = true;
    if (this.spec.attach) return this.attach(undo, signal);
    await this.driver.requireHostLimits();
    if (this.spec.reuseDisk) return this.restart(undo, signal, hostReady);
    await mkdir(this.spec.dir, { recursive: false, mode: 0o700 });
    undo.push("sandbox directory", () => rm(this.spec.dir, { recursive: true, force: true }));
    await writeFile(join(this.spec.dir, VM_MARKER), JSON.stringify({ driver: "qemu", id: this.id }));
    signal?.throwIfAborted();
    const snapshot = await readVmSnapshot(this.spec.templateRoot);
    if (snapshot) return this.startFromSnapshot(snapshot, undo, signal, hostReady);
    // The warm-start snapshot's VM had no volume disks, and a restore needs the devices it saved:
    // a sandbox with volumes boots.
    if (this.driver.warmStart && !this.spec.volumes?.length) {
      const base = await this.driver.baseSnapshot(this.spec.templateRoot, this.spec);
      signal?.throwIfAborted();
      await this.driver.createOverlay(this.disk, base.disk, "qcow2");
      return this.launch(undo, base.memory, signal, hostReady);
    }
    const image = await ensureDiskImage(this.spec.templateRoot);
    await this.driver.createOverlay(
      this.disk,
      image.path,
      image.format,
      await this.driver.diskBytes(this.spec.templateRoot, this.spec.diskMib),
    );
    return this.launch(undo, undefined, signal, hostReady);
  }

  /**
   * A sandbox started from a QEMU snapshot: its disk is an overlay over the snapshot's frozen
   * member, of the member's size. With the snapshot's memory it resumes the processes the source
   * ran (the warm start's restore, so the boot's identify, network and limits steps give it its own
   * hostname, machine id, entropy and address); a snapshot without memory, or one whose machine
   * this VM cannot restore (another size, another kernel), boots cold on that disk.
   */
  private async startFromSnapshot(
    snapshot: VmSnapshotMeta,
    undo: CleanupStack,
    signal?: AbortSignal,
    hostReady?: Promise<void>,
  ): Promise<GuestStream> {
    const files = vmSnapshotFiles(this.spec.templateRoot);
    await this.driver.createOverlay(this.disk, files.disk, "qcow2");
    const restorable = snapshot.memory && !this.spec.volumes?.length && snapshot.machine === this.machine.key;
    if (snapshot.memory && !restorable)
      this.driver.options.log("qemu_snapshot_cold_boot", {
        sandbox_id: this.id,
        reason: "its size, devices or kernel differ from the snapshot's VM",
      });
    return this.launch(undo, restorable ? files.memory : undefined, signal, hostReady);
  }

  /** What a restore of this VM's memory needs to match: see `QemuDriver.machineKey`. */
  get machine(): { key: string; vcpu: number; memoryMib: number; volumes: number } {
    return {
      key: this.driver.machineKey(this.spec),
      vcpu: this.spec.vcpu,
      memoryMib: this.spec.memoryMib,
      volumes: this.spec.volumes?.length ?? 0,
    };
  }

  /**
   * Runs `copy` with the VM stopped: `stop` drains and flushes its disks, so its overlay at rest is
   * the guest's disk at that instant. With `memoryTo` its memory and devices are saved there first
   * (as a pause saves them). The VM runs again after, whatever `copy` did.
   */
  async frozen<T>(copy: () => Promise<T>, memoryTo?: string): Promise<{ value: T; frozenMs: number }> {
    const qmp = this.qmp;
    if (this.destroying || this.paused || !this.vm?.running || !qmp)
      throw new BothyError("sandbox_not_running", `Sandbox ${this.id} has no running VM to snapshot.`);
    const t0 = performance.now();
    let value: T;
    // A server that dies while the VM is stopped leaves it so: the marker tells the take-over to run it again.
    await markFrozen(this.spec.dir);
    try {
      if (memoryTo === undefined) await qmp.command("stop");
      else await saveVm(qmp, memoryTo, SAVE_TIMEOUT_MS);
      value = await copy();
      await holdForTest();
    } finally {
      // After a save QEMU is in `postmigrate`, its disks inactive: `cont` takes them back too.
      await qmp.command("cont");
      await clearFrozen(this.spec.dir);
    }
    return { value, frozenMs: Math.round(performance.now() - t0) };
  }

  /**
   * Starts a stopped sandbox again on its own disk: from the memory its pause saved when the
   * pipeline says so (`fromMemory`, its `wake`), else a cold boot that drops any saved memory.
   * The disk is never this start's to remove.
   */
  private async restart(undo: CleanupStack, signal?: AbortSignal, hostReady?: Promise<void>): Promise<GuestStream> {
    if (!existsSync(this.disk)) throw new BootError("prepare", `Sandbox ${this.id} has no disk left to start from.`);
    if (!this.spec.fromMemory) {
      await rm(this.memoryState, { force: true });
      return this.launch(undo, undefined, signal, hostReady);
    }
    if (!existsSync(this.memoryState))
      throw new BootError("prepare", `Sandbox ${this.id} has no saved memory to start from.`);
    // Until the restore holds, its QEMU ending is not the sandbox ending.
    this.paused = true;
    return this.launchFromMemory(undo, signal, hostReady);
  }

  /**
   * Takes over the VM an earlier server started (it crashed or was killed): QMP and the agent's
   * socket accept the new server, and the agent, which noticed its host leave, says hello again.
   * A VM a capture stopped (its marker is there) runs again (`thawVm`); any other VM that is not
   * running (stopped in the middle of a pause) is not taken over: the undo stops it and keeps its
   * disk.
   */
  private async attach(undo: CleanupStack, signal?: AbortSignal): Promise<GuestStream> {
    const pid = await this.driver.sandboxPid(this.id);
    if (pid === undefined) throw new BootError("attach", `Sandbox ${this.id} has no running VM to attach to.`);
    const vm = VmProcess.adopt(pid, this.driver.vmConfig(this.spec, this.spec.dir, this.disk));
    this.vm = vm;
    undo.push("vm", () => this.stop());
    void vm.exited.then((exit) => {
      if (this.vm === vm && !this.paused) this.resolveEnd(exit);
    });
    this.qmp = await vm.qmp(signal);
    let status = ((await this.qmp.command("query-status")) as { status?: string }).status;
    if (status !== "running" && frozenByCapture(this.spec.dir)) {
      await thawVm(this.qmp, SAVE_TIMEOUT_MS);
      this.driver.options.log("snapshot_capture_thawed", { sandbox_id: this.id, was: status ?? "unknown" });
      status = ((await this.qmp.command("query-status")) as { status?: string }).status;
    }
    await clearFrozen(this.spec.dir);
    if (status !== "running")
      throw new BootError("attach", `Sandbox ${this.id}'s VM is ${status ?? "in an unknown state"}, not running.`);
    const sock = await vm.connectSocket(vmFiles(this.spec.dir).agentSocket, signal);
    return { input: sock, output: sock, resync: true };
  }

  /**
   * Starts QEMU on this sandbox's disk: a cold boot, or a restore of `incoming`. Its cgroup, its
   * process with its sockets and pid file, and its QMP connection each go onto `undo` once made.
   */
  private async launch(
    undo: CleanupStack,
    incoming: string | undefined,
    signal?: AbortSignal,
    hostReady?: Promise<void>,
  ): Promise<GuestStream> {
    // Before it is made: a cgroup made in part is removed all the same.
    undo.push("cgroup", () => this.driver.removeSandboxCgroup(this.id));
    const cgroupProcs = await this.driver.sandboxCgroup(this.spec);
    signal?.throwIfAborted();
    const files = vmFiles(this.spec.dir);
    undo.push("vm files", async () => {
      for (const f of [files.agentSocket, files.qmpSocket, files.pidFile]) await rm(f, { force: true });
    });
    // The tap, made meanwhile, must exist before QEMU opens it.
    await hostReady;
    signal?.throwIfAborted();
    const volumes = this.spec.volumes ?? [];
    if (volumes.length > 0) {
      if (!this.spec.volumeHost)
        throw new BootError("start", `Sandbox ${this.id} has volumes but no host to ask about them.`);
      await this.spec.volumeHost.unmountForVm(volumes.map((v) => v.volumeId));
    }
    const config = {
      ...this.driver.vmConfig(this.spec, this.spec.dir, this.disk, incoming),
      volumes: volumes.map((v) => ({ image: v.image, readOnly: v.readOnly })),
    };
    const vm = await VmProcess.spawn(config, cgroupProcs);
    this.vm = vm;
    undo.push("vm", () => vm.stop(undefined, 0));
    void vm.exited.then((exit) => {
      // A pause ends the process on purpose; anything else ends the sandbox.
      if (this.vm === vm && !this.paused) this.resolveEnd(exit);
    });
    const qmp = (this.qmp = await vm.qmp(signal));
    undo.push("qmp", () => qmp.close());
    if (incoming !== undefined) await resumeIncoming(qmp, RESTORE_TIMEOUT_MS);
    // A restored guest already fills its disk unless it had to grow now; a booting one is told its size.
    const disk = await this.growDisk(qmp);
    this.rootBytes = disk.grown || incoming === undefined ? disk.bytes : undefined;
    const sock = await vm.connectSocket(files.agentSocket, signal);
    return { input: sock, output: sock, resync: incoming !== undefined };
  }

  /**
   * Grows the VM's disk to the template's image plus `diskMib` if it is smaller (never shrinks
   * it); says what size it should have and whether it grew now. New sandboxes already have that
   * size (from their snapshot, or made so); a sandbox from before disk sizes, started again, gets
   * its `diskMib` now.
   */
  private async growDisk(qmp: QmpClient): Promise<{ bytes: number; grown: boolean }> {
    const bytes = await this.driver.diskBytes(this.spec.templateRoot, this.spec.diskMib);
    const drives = (await qmp.command("query-block")) as Array<{
      device?: string;
      inserted?: { image?: { "virtual-size"?: number } };
    }>;
    const current = drives.find((d) => d.device === ROOT_DRIVE)?.inserted?.image?.["virtual-size"];
    if (current === undefined) throw new BootError("start", "QEMU reported no root disk for the sandbox.");
    if (current >= bytes) return { bytes, grown: false };
    await qmp.command("block_resize", { device: ROOT_DRIVE, size: bytes });
    return { bytes, grown: true };
  }

  /** Each volume is the disk with its index's serial (qemu-process.ts), in the spec's order. */
  get guestVolumes(): GuestVolume[] {
    return (this.spec.volumes ?? []).map((v, i) => ({
      serial: volumeSerial(i),
      path: v.guestPath,
      readOnly: v.readOnly,
    }));
  }

  get guestRootBytes(): number | undefined {
    return this.rootBytes;
  }

  /** QEMU's last words and the guest console's last lines. */
  get diagnostics(): string {
    let consoleTail = "";
    try {
      consoleTail = readFileSync(vmFiles(this.spec.dir).console, "utf8").trim().split("\n").slice(-5).join(" | ");
    } catch {
      consoleTail = ""; // no console file: QEMU never got that far
    }
    return consoleTail ? `console: ${consoleTail}` : "";
  }

  wait(): Promise<ExitInfo> {
    return this.ended;
  }

  async shutdown(timeoutMs: number): Promise<void> {
    // `quit` flushes the disk and ends QEMU; the guest has no one listening for ACPI power-off.
    await this.vm?.stop(this.qmp, timeoutMs);
  }

  async kill(): Promise<void> {
    if (this.vm?.running) this.vm.kill();
    await this.vm?.exited;
  }

  /** Saves memory and device state into the sandbox's directory and ends QEMU. */
  async pause(): Promise<void> {
    if (this.destroying) throw new BothyError("sandbox_not_running", `Sandbox ${this.id} is being deleted.`);
    if (this.paused) return;
    const vm = this.vm;
    const qmp = this.qmp;
    if (!vm?.running || !qmp)
      throw new BothyError("sandbox_not_running", `Sandbox ${this.id} has no running VM to pause.`);
    await saveVm(qmp, this.memoryState, SAVE_TIMEOUT_MS);
    this.paused = true;
    await vm.stop(qmp, QUIT_GRACE_MS);
    qmp.close();
    this.qmp = undefined;
    // A paused sandbox holds its disk and memory file only; the resume makes its cgroup again.
    await this.driver.removeSandboxCgroup(this.id);
    for (const f of [vmFiles(this.spec.dir).agentSocket, vmFiles(this.spec.dir).qmpSocket])
      await rm(f, { force: true });
  }

  /**
   * Starts QEMU from the saved memory; once it runs, the sandbox is no longer paused and the state
   * file goes. Until then a failure leaves it paused with its state file (the undos end the new QEMU).
   */
  private async launchFromMemory(
    undo: CleanupStack,
    signal?: AbortSignal,
    hostReady?: Promise<void>,
  ): Promise<GuestStream> {
    const stream = await this.launch(undo, this.memoryState, signal, hostReady);
    this.paused = false;
    await rm(this.memoryState, { force: true });
    return stream;
  }

  /** Restores a paused sandbox from its memory state; the state file goes once QEMU runs it. */
  async resume(undo: CleanupStack, signal?: AbortSignal): Promise<GuestStream> {
    if (this.destroying) throw new BothyError("sandbox_not_running", `Sandbox ${this.id} is being deleted.`);
    if (!this.paused) throw new BothyError("internal", `Sandbox ${this.id} is not paused.`);
    return this.launchFromMemory(undo, signal);
  }

  /** Ends the VM (QEMU's `quit` flushes the disk first); the disk stays for a later start. */
  async stop(): Promise<void> {
    await this.vm?.stop(this.qmp, QUIT_GRACE_MS);
    this.qmp?.close();
    await this.driver.release(this.id);
    this.resolveEnd({ code: null, signal: null });
  }

  destroy(): Promise<void> {
    this.destroying ??= (async () => {
      await this.vm?.stop(this.qmp, QUIT_GRACE_MS);
      this.qmp?.close();
      // Discovery, not memory: whatever QEMU of this sandbox still runs goes too.
      await this.driver.killSandboxProcesses(this.id);
      try {
        await this.driver.removeSandboxCgroup(this.id);
      } finally {
        await rm(this.spec.dir, { recursive: true, force: true });
      }
      this.resolveEnd({ code: null, signal: null });
    })();
    return this.destroying;
  }
}
