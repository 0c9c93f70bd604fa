/**
 * One QEMU microvm process: its command line, its sockets, and the save/restore verbs (memory to
 * a file and back). The flags are the ones measured to work here (shared/traps.md, QEMU): microvm
 * keeps ACPI on (this kernel finds virtio-mmio devices only through it), the command line carries
 * tsc_early_khz (without it boot can hang at "Marking TSC unstable"), and under TCG the
 * translation cache is bounded, which is most of an idle VM's memory beyond the guest's own.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { connect, type Socket } from "node:net";
import { basename, join } from "node:path";
import type { Readable } from "node:stream";
import { BothyError } from "@bothy/protocol";
import { AGENT_PORT_NAME, ROOT_SERIAL, volumeSerial } from "../images/guest-init.ts";
import type { ExitInfo } from "./driver.ts";
import { QmpClient } from "./qmp-client.ts";
import { BootError, HostSetupError } from "../errors/internal-errors.ts";

export type Acceleration = "kvm" | "tcg";

export interface VmConfig {
  qemuPath: string;
  accel: Acceleration;
  /** Translation cache size in MiB under TCG. */
  tbSizeMib: number;
  vmlinuz: string;
  initramfs: string;
  /** The VM's own writable disk (a qcow2 overlay). */
  disk: string;
  vcpu: number;
  memoryMib: number;
  /** Where the VM's sockets, pid file and console log live. */
  dir: string;
  /** A memory state file to restore from instead of booting. */
  incoming?: string;
  /** The tap device behind the VM's virtio-net (QEMU makes a transient one when it does not exist). */
  tap?: string;
  /**
   * Volume images (raw ext4), each a virtio disk after the root with serial `volumeSerial(i)`, in
   * this order: a VM restored from memory must get the same list as the one saved.
   */
  volumes?: ReadonlyArray<{ image: string; readOnly: boolean }>;
}

const SOCKET_WAIT_MS = 10_000;
/** How long an emulated guest's agent waits after a short read of a command's output. */
const TCG_OUTPUT_REST_MS = 25;
/** Paths that go into QEMU's `exec:` migration URIs, which QEMU runs with /bin/sh. */
const SHELL_SAFE_PATH = /^\/[A-Za-z0-9._/-]+$/;

export const vmFiles = (dir: string) => ({
  agentSocket: join(dir, "agent.sock"),
  qmpSocket: join(dir, "qmp.sock"),
  pidFile: join(dir, "qemu.pid"),
  console: join(dir, "console.log"),
});

let hostKhz: number | undefined;
/** The host TSC frequency the guest kernel is told (tsc_early_khz), from /proc/cpuinfo. */
export async function hostCpuKhz(): Promise<number> {
  if (hostKhz !== undefined) return hostKhz;
  const mhz = /cpu MHz\s*:\s*([0-9.]+)/.exec(await readFile("/proc/cpuinfo", "utf8"))?.[1];
  hostKhz = mhz === undefined ? 2_000_000 : Math.round(Number(mhz) * 1000);
  return hostKhz;
}

export async function qemuArgs(c: VmConfig): Promise<string[]> {
  const f = vmFiles(c.dir);
  const khz = await hostCpuKhz();
  const args = [
    "-M",
    "microvm",
    "-accel",
    c.accel === "kvm" ? "kvm" : `tcg,tb-size=${c.tbSizeMib}`,
    "-cpu",
    c.accel === "kvm" ? "host" : "max",
    "-smp",
    String(c.vcpu),
    "-m",
    `${c.memoryMib}M`,
    "-nodefaults",
    "-no-user-config",
    "-display",
    "none",
    "-no-reboot",
    "-kernel",
    c.vmlinuz,
    "-initrd",
    c.initramfs,
    // Under emulation the agent lets a command's output gather in its pipe between reads
    // (see OUTPUT_REST_MS in the agent): each read and frame costs milliseconds there.
    "-append",
    `console=ttyS0 quiet panic=-1 tsc_early_khz=${khz}${c.accel === "kvm" ? "" : ` bothy.output_rest_ms=${TCG_OUTPUT_REST_MS}`}`,
    "-serial",
    `file:${f.console}`,
    "-drive",
    `id=root,file=${c.disk},format=qcow2,if=none,cache=writeback,discard=unmap`,
    "-device",
    `virtio-blk-device,drive=root,serial=${ROOT_SERIAL}`,
    // Always raw: a format QEMU probed could be a qcow2 header the guest wrote, naming a host file.
    ...(c.volumes ?? []).flatMap((v, i) => [
      "-drive",
      `id=vol${i},file=${driveSafe(v.image)},format=raw,if=none,cache=writeback,readonly=${v.readOnly ? "on" : "off"}`,
      "-device",
      `virtio-blk-device,drive=vol${i},serial=${volumeSerial(i)}`,
    ]),
    "-device",
    "virtio-serial-device",
    "-chardev",
    `socket,id=agent,path=${f.agentSocket},server=on,wait=off`,
    "-device",
    `virtserialport,chardev=agent,name=${AGENT_PORT_NAME}`,
    "-qmp",
    `unix:${f.qmpSocket},server=on,wait=off`,
    "-pidfile",
    f.pidFile,
  ];
  if (c.tap !== undefined)
    args.push(
      "-netdev",
      `tap,id=net0,ifname=${c.tap},script=no,downscript=no`,
      "-device",
      "virtio-net-device,netdev=net0",
    );
  if (c.incoming !== undefined) args.push("-incoming", `exec:cat ${shellSafe(c.incoming)}`);
  return args;
}

/** A path for a `-drive` option, where a comma would start another option. */
function driveSafe(path: string): string {
  if (!SHELL_SAFE_PATH.test(path))
    throw new HostSetupError(
      `The path ${path} has characters a QEMU drive option cannot take; use a plain BOTHY_HOME.`,
    );
  return path;
}

function shellSafe(path: string): string {
  if (!SHELL_SAFE_PATH.test(path))
    throw new HostSetupError(`The path ${path} has characters QEMU's exec: URI cannot take; use a plain BOTHY_HOME.`);
  return path;
}

/** How the server holds a QEMU: as its child, or by pid after a restart (the VM outlived the old server). */
interface HeldProcess {
  readonly pid: number | undefined;
  readonly exited: Promise<ExitInfo>;
  running(): boolean;
  kill(): void;
}

const ADOPTED_POLL_MS = 500;

function childProcess(child: ChildProcess, onError: (message: string) => void): HeldProcess {
  const exited = new Promise<ExitInfo>((resolve) => {
    child.once("error", (err) => {
      onError(err.message);
      resolve({ code: null, signal: null });
    });
    child.once("exit", (code, signal) => resolve({ code, signal }));
  });
  return {
    pid: child.pid,
    exited,
    running: () => child.exitCode === null && child.signalCode === null,
    kill: () => child.kill("SIGKILL"),
  };
}

/** A process another server started: alive while /proc has it (its parent is gone, so it is never our zombie). */
function adoptedProcess(pid: number): HeldProcess {
  const alive = (): boolean => {
    try {
      return readFileSync(`/proc/${pid}/cmdline`, "utf8") !== "";
    } catch {
      return false; // gone (its /proc entry went between two looks)
    }
  };
  const exited = new Promise<ExitInfo>((resolve) => {
    // Not unref'd: whoever waits for this VM to end must keep the process alive until it has.
    const timer = setInterval(() => {
      if (alive()) return;
      clearInterval(timer);
      resolve({ code: null, signal: null });
    }, ADOPTED_POLL_MS);
  });
  return {
    pid,
    exited,
    running: alive,
    kill: () => {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // already gone
      }
    },
  };
}

/** A started QEMU: its process, exit promise, and the tail of what it printed. */
export class VmProcess {
  readonly exited: Promise<ExitInfo>;
  private stderrTail = "";

  private readonly proc: HeldProcess;

  private constructor(
    hold: (noteError: (message: string) => void) => HeldProcess,
    readonly config: VmConfig,
    stderr?: Readable | null,
  ) {
    this.proc = hold((message) => (this.stderrTail += `\n${message}`));
    this.exited = this.proc.exited;
    stderr?.setEncoding("utf8");
    stderr?.on("data", (s: string) => {
      this.stderrTail = (this.stderrTail + s).slice(-4096);
    });
  }

  /**
   * Starts QEMU; with `cgroupProcs`, in those cgroups from its first instruction: a shell writes
   * its own pid into each `cgroup.procs`, then becomes QEMU (same pid), so nothing QEMU allocates
   * escapes the sandbox's limits.
   */
  static async spawn(config: VmConfig, cgroupProcs: readonly string[] = []): Promise<VmProcess> {
    const [file, args] =
      cgroupProcs.length === 0
        ? [config.qemuPath, await qemuArgs(config)]
        : [
            "sh",
            [
              "-c",
              'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n - 1)); done; exec "$@"',
              "bothy-cgexec",
              String(cgroupProcs.length),
              ...cgroupProcs,
              config.qemuPath,
              ...(await qemuArgs(config)),
            ],
          ];
    // Its own session: a terminal's Ctrl-C goes to the server, not to every VM, and a VM outlives
    // a server that crashed, so the next one can attach to it.
    const child = spawn(file, args, { stdio: ["ignore", "ignore", "pipe"], detached: true });
    return new VmProcess((noteError) => childProcess(child, noteError), config, child.stderr);
  }

  /** The QEMU of `pid`, started by an earlier server, whose sockets are in `config.dir`. */
  static adopt(pid: number, config: VmConfig): VmProcess {
    return new VmProcess(() => adoptedProcess(pid), config);
  }

  get running(): boolean {
    return this.proc.running();
  }

  kill(): void {
    this.proc.kill();
  }

  /** What QEMU printed and the guest console's last lines: why a boot failed, usually. */
  async diagnostics(): Promise<string> {
    const consoleTail = await readFile(vmFiles(this.config.dir).console, "utf8").then(
      (s) => s.trim().split("\n").slice(-5).join(" | "),
      () => "",
    );
    return [this.stderrTail.trim(), consoleTail].filter(Boolean).join("; console: ");
  }

  /** Connects to one of QEMU's server sockets once it exists; fails if QEMU exits first. */
  async connectSocket(path: string, signal?: AbortSignal): Promise<Socket> {
    const deadline = Date.now() + SOCKET_WAIT_MS;
    for (;;) {
      signal?.throwIfAborted();
      if (!this.running)
        throw new BootError("start", `QEMU exited before opening ${basename(path)}.`, {
          diagnostics: await this.diagnostics(),
        });
      if (existsSync(path)) {
        const sock = await new Promise<Socket | undefined>((resolve) => {
          const s = connect(path);
          s.once("connect", () => resolve(s));
          s.once("error", () => resolve(undefined));
        });
        if (sock) return sock;
      }
      if (Date.now() > deadline)
        throw new BootError("start", `QEMU did not open ${basename(path)} within ${SOCKET_WAIT_MS} ms.`);
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  async qmp(signal?: AbortSignal): Promise<QmpClient> {
    return QmpClient.over(await this.connectSocket(vmFiles(this.config.dir).qmpSocket, signal));
  }

  /** Ends the process: QMP `quit` when given, SIGKILL when it does not go within `graceMs`. */
  async stop(qmp: QmpClient | undefined, graceMs: number): Promise<void> {
    if (!this.running) return;
    if (qmp) await qmp.command("quit", undefined, graceMs).catch(() => undefined);
    const timer = new Promise<"timeout">((r) => setTimeout(() => r("timeout"), graceMs).unref());
    if ((await Promise.race([this.exited, timer])) === "timeout") this.proc.kill();
    await this.exited;
  }
}

/**
 * Saves the stopped VM's memory and device state to `file`. The bandwidth cap is raised (QEMU's
 * default is 32 MiB/s); the writer renames its temp file into place only when it has finished,
 * since QEMU reports "completed" before the writer process exits.
 */
export async function saveVm(qmp: QmpClient, file: string, timeoutMs: number): Promise<void> {
  const tmp = `${file}.partial`;
  await qmp.command("migrate-set-parameters", { "max-bandwidth": 64 * 1024 * 1024 * 1024 });
  await qmp.command("stop");
  await qmp.command("migrate", { uri: `exec:cat > ${shellSafe(tmp)} && mv ${shellSafe(tmp)} ${shellSafe(file)}` });
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const info = (await qmp.command("query-migrate")) as { status?: string; "error-desc"?: string };
    if (info.status === "failed" || info.status === "cancelled")
      throw new BothyError("internal", `Saving the VM failed: ${info["error-desc"] ?? info.status}`);
    if (info.status === "completed" && existsSync(file)) return;
    if (Date.now() > deadline)
      throw new BothyError(
        "internal",
        `Saving the VM did not finish within ${timeoutMs} ms (status ${info.status ?? "?"}).`,
      );
    await new Promise((r) => setTimeout(r, 20));
  }
}

/**
 * Runs again a VM a capture stopped (`stop`, or `saveVm`'s stop and migration) whose server died
 * before its `cont`: a migration still under way is cancelled first (its file is a staging copy
 * nobody will publish), then `cont`, which also takes back the disks a finished save left
 * inactive (`postmigrate`).
 */
export async function thawVm(qmp: QmpClient, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const info = (await qmp.command("query-migrate")) as { status?: string };
    if (!["setup", "active", "cancelling", "device", "pre-switchover"].includes(info.status ?? "")) break;
    if (info.status !== "cancelling") await qmp.command("migrate_cancel");
    if (Date.now() > deadline)
      throw new BootError("attach", `The capture's migration did not end within ${timeoutMs} ms.`);
    await new Promise((r) => setTimeout(r, 20));
  }
  await qmp.command("cont");
}

/** Waits until an `-incoming` VM has loaded its state, then lets it run. */
export async function resumeIncoming(qmp: QmpClient, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const st = (await qmp.command("query-status")) as { status?: string };
    if (st.status !== "inmigrate") {
      if (st.status === "internal-error" || st.status === "shutdown")
        throw new BootError("restore", `Restoring the VM failed (state ${st.status}).`);
      break;
    }
    if (Date.now() > deadline)
      throw new BootError("restore", `Restoring the VM did not finish within ${timeoutMs} ms.`);
    await new Promise((r) => setTimeout(r, 10));
  }
  await qmp.command("cont");
}
