import { PassThrough } from "node:stream";
import { BothyError, encodeFrame, FrameDecoder, hostFrame, PROTOCOL_GENERATION } from "@bothy/protocol";
import { BootError } from "../../src/errors/internal-errors.ts";
import type {
  Driver,
  ExitInfo,
  GuestStream,
  HostObject,
  SandboxHandle,
  SandboxSpec,
} from "../../src/drivers/driver.ts";
import type { CleanupStack } from "../../src/util/cleanup-stack.ts";

/**
 * What exists on the fake host for one sandbox: its disk (files, and a paused VM's saved memory
 * with them), and whether a guest runs. A running guest is one in-memory agent.
 */
export interface FakeMachine {
  driver: string;
  disk: boolean;
  /** A pause saved the guest's memory next to its disk. */
  savedMemory: boolean;
  guest: FakeGuest | undefined;
}

/**
 * The host all fake drivers share, and what a test can do to it: make the next start fail, kill a
 * guest, or have the server's process die (guests of drivers that do not attach die with it).
 * It outlives any one SandboxManager, as a real host outlives a server.
 */
export class FakeHost {
  readonly machines = new Map<string, FakeMachine>();
  /** How many of the next starts (boots, wakes, resumes) fail. */
  failStarts = 0;
  /** How many of the next removals (destroy, removeOrphan) fail, leaving everything in place. */
  failRemovals = 0;
  /** Bumped when the server process "dies": handles of an older process do nothing any more. */
  epoch = 0;

  /** Ids with anything on the host. */
  ids(): string[] {
    return [...this.machines.keys()];
  }

  running(id: string): boolean {
    return this.machines.get(id)?.guest !== undefined;
  }

  /** The guest of `id` dies on its own (its VM or container was killed). */
  kill(id: string): boolean {
    const guest = this.machines.get(id)?.guest;
    if (!guest) return false;
    guest.end({ code: null, signal: "SIGKILL" });
    return true;
  }

  /**
   * The channel to `id`'s guest closes while its process runs on, as when a gVisor sentry is
   * killed and `runsc run` is still cleaning up.
   */
  loseChannel(id: string): boolean {
    const guest = this.machines.get(id)?.guest;
    guest?.detach();
    return guest !== undefined;
  }

  /**
   * The server's process died: its handles and channels are dead with it (nothing of that process
   * hears of what follows); guests of drivers that attach (QEMU) run on, the others (gVisor's
   * runsc children) end.
   */
  crashServer(attaching: ReadonlySet<string>): void {
    this.epoch++;
    for (const m of this.machines.values()) {
      m.guest?.abandon();
      if (m.guest && !attaching.has(m.driver)) m.guest.end({ code: null, signal: "SIGKILL" }, true);
    }
  }

  takeRemovalFailure(): boolean {
    if (this.failRemovals === 0) return false;
    this.failRemovals--;
    return true;
  }

  takeStartFailure(): boolean {
    if (this.failStarts === 0) return false;
    this.failStarts--;
    return true;
  }
}

/** The guest agent, in memory: says hello, applies identity and limits, runs every command as exit 0. */
export class FakeGuest {
  private stream: { toHost: PassThrough; fromHost: PassThrough } | undefined;
  private readonly onEnd = new Set<(exit: ExitInfo) => void>();
  ended = false;

  constructor(private readonly machine: FakeMachine) {}

  /** A new channel to this guest; the old one, if any, closes. `resync`: the guest runs on and says hello when asked. */
  connect(resync: boolean): GuestStream {
    this.detach();
    const toHost = new PassThrough();
    const fromHost = new PassThrough();
    const decoder = new FrameDecoder();
    // Answers arrive on a later turn of the event loop, as over a real channel.
    const send = (header: object): void => {
      setImmediate(() => {
        if (!toHost.writableEnded) toHost.write(encodeFrame(header));
      });
    };
    fromHost.on("data", (chunk: Buffer) => {
      for (const raw of decoder.push(chunk)) {
        const frame = hostFrame.parse(raw.header);
        switch (frame.t) {
          case "resync":
            send({ t: "hello", gen: PROTOCOL_GENERATION, agent: "fake", pid: 1 });
            break;
          case "identity":
            send({ t: "identity_done", id: frame.id });
            break;
          case "limits":
          case "mkdir":
          case "remove":
          case "rename":
            send({ t: "done", id: frame.id });
            break;
          case "exec":
            send({ t: "started", id: frame.id, pid: 2 });
            send({ t: "exited", id: frame.id, code: 0, signal: null });
            break;
          case "hello_ack":
          case "credit":
          case "cancel":
            break;
          default:
            send({ t: "error", id: "id" in frame ? frame.id : undefined, code: "unknown_request", message: frame.t });
        }
      }
    });
    fromHost.on("error", () => undefined);
    toHost.on("error", () => undefined);
    this.stream = { toHost, fromHost };
    if (!resync) send({ t: "hello", gen: PROTOCOL_GENERATION, agent: "fake", pid: 1 });
    return { input: toHost, output: fromHost, ...(resync ? { resync: true } : {}) };
  }

  /** Closes the channel; the guest runs on. */
  detach(): void {
    this.stream?.toHost.end();
    this.stream = undefined;
  }

  /** Forgets the channel without closing it: the server process at its other end is gone. */
  abandon(): void {
    this.stream = undefined;
  }

  /** Listens for the guest's end (its process exits). */
  whenEnded(fn: (exit: ExitInfo) => void): void {
    this.onEnd.add(fn);
  }

  /** The guest's process ends: the channel closes and the machine runs nothing. */
  end(exit: ExitInfo, quietly = false): void {
    if (this.ended) return;
    this.ended = true;
    this.detach();
    if (this.machine.guest === this) this.machine.guest = undefined;
    if (!quietly) for (const fn of this.onEnd) fn(exit);
    this.onEnd.clear();
  }
}

/** Lets other promise chains run between a fake's steps, so interleavings happen as with real I/O. */
const tick = (): Promise<void> => new Promise((r) => setImmediate(r));

/**
 * One sandbox of a fake driver. Like the real ones: `start` once; `wait` resolves when the guest
 * ends for good (not at a pause); `stop` keeps the disk; `destroy` removes everything.
 */
class FakeHandle implements SandboxHandle {
  readonly id: string;
  readonly needsIdentity = true;
  readonly diagnostics = undefined;
  private started = false;
  private guest: FakeGuest | undefined;
  private paused = false;
  private readonly ended: Promise<ExitInfo>;
  private resolveEnd!: (exit: ExitInfo) => void;
  private readonly epoch: number;
  readonly pause?: () => Promise<void>;
  readonly resume?: (undo: CleanupStack, signal?: AbortSignal) => Promise<GuestStream>;

  constructor(
    private readonly driver: FakeDriver,
    private readonly spec: SandboxSpec,
  ) {
    this.id = spec.id;
    this.epoch = driver.host.epoch;
    this.ended = new Promise((r) => (this.resolveEnd = r));
    if (driver.canPause) {
      this.pause = () => this.doPause();
      this.resume = (undo) => this.doResume(undo);
    }
  }

  private get host(): FakeHost {
    return this.driver.host;
  }

  /** A handle of a server process that died does nothing: that process is gone. */
  private get dead(): boolean {
    return this.host.epoch !== this.epoch;
  }

  private machine(): FakeMachine {
    let m = this.host.machines.get(this.id);
    if (!m) {
      m = { driver: this.driver.name, disk: false, savedMemory: false, guest: undefined };
      this.host.machines.set(this.id, m);
    }
    return m;
  }

  /** Like the real drivers, it leaves the cleanup of a failed start to the undos it pushes. */
  async start(undo: CleanupStack, _signal?: AbortSignal, hostReady?: Promise<void>): Promise<GuestStream> {
    if (this.started) throw new BothyError("internal", `Sandbox ${this.id} was already started.`);
    this.started = true;
    await tick();
    if (this.dead) throw new BootError("start", "The server's process is gone.");
    const existing = this.host.machines.get(this.id);
    if (this.spec.attach) {
      if (!existing?.guest) throw new BootError("attach", `Nothing of ${this.id} runs to attach to.`);
      undo.push("guest", () => this.stop());
      return this.adoptGuest(existing.guest, true);
    }
    if (this.spec.reuseDisk && !existing?.disk) throw new BootError("prepare", `${this.id} has no disk.`);
    if (!this.spec.reuseDisk && existing)
      throw new BothyError("internal", `${this.id} already has host objects; ids are never reused.`);
    const m = this.machine();
    if (!this.spec.reuseDisk) undo.push("disk", () => void this.host.machines.delete(this.id));
    m.disk = true;
    await tick();
    if (this.dead) throw new BootError("start", "The server's process is gone.");
    if (this.host.takeStartFailure())
      throw new BootError(this.spec.fromMemory ? "restore" : "start", "The fake host refused to start it.");
    if (m.guest) throw new BothyError("internal", `${this.id} already runs a guest.`);
    if (this.spec.fromMemory && !m.savedMemory) throw new BootError("prepare", `${this.id} has no saved memory.`);
    const fromMemory = this.spec.fromMemory === true;
    m.savedMemory = false;
    await hostReady;
    undo.push("guest", () => this.endGuest());
    return this.adoptGuest(this.newGuest(m), fromMemory);
  }

  private newGuest(m: FakeMachine): FakeGuest {
    const guest = new FakeGuest(m);
    m.guest = guest;
    return guest;
  }

  private adoptGuest(guest: FakeGuest, resync: boolean): GuestStream {
    this.guest = guest;
    guest.whenEnded((exit) => {
      if (this.guest === guest && !this.paused && !this.dead) this.resolveEnd(exit);
    });
    return guest.connect(resync);
  }

  wait(): Promise<ExitInfo> {
    return this.ended;
  }

  async shutdown(): Promise<void> {
    await this.kill();
  }

  async kill(): Promise<void> {
    if (this.dead) return;
    this.guest?.end({ code: null, signal: "SIGKILL" });
  }

  async stop(): Promise<void> {
    await tick();
    if (this.dead) return;
    this.endGuest();
    this.resolveEnd({ code: 0, signal: null });
  }

  async destroy(): Promise<void> {
    await tick();
    if (this.dead) return;
    if (this.host.takeRemovalFailure()) throw new BothyError("internal", `The fake host kept ${this.id}.`);
    this.endGuest();
    this.host.machines.delete(this.id);
    this.resolveEnd({ code: 0, signal: null });
  }

  private endGuest(): void {
    const g = this.guest;
    this.guest = undefined;
    g?.end({ code: 0, signal: null }, true);
  }

  private async doPause(): Promise<void> {
    if (this.dead) throw new BothyError("internal", "The server's process is gone.");
    if (this.paused) return;
    const m = this.host.machines.get(this.id);
    if (!this.guest || this.guest.ended || !m)
      throw new BothyError("sandbox_not_running", `Sandbox ${this.id} has no running guest to pause.`);
    this.paused = true;
    await tick();
    if (this.dead) throw new BothyError("internal", "The server's process is gone.");
    m.savedMemory = true;
    this.endGuest();
  }

  private async doResume(undo: CleanupStack): Promise<GuestStream> {
    if (this.dead) throw new BothyError("internal", "The server's process is gone.");
    if (!this.paused) throw new BothyError("internal", `Sandbox ${this.id} is not paused.`);
    await tick();
    if (this.dead) throw new BothyError("internal", "The server's process is gone.");
    const m = this.host.machines.get(this.id);
    if (!m?.savedMemory) throw new BothyError("agent_unavailable", `Sandbox ${this.id} has no saved memory.`);
    if (this.host.takeStartFailure()) throw new BothyError("agent_unavailable", "The fake host refused to restore it.");
    m.savedMemory = false;
    this.paused = false;
    undo.push("guest", () => this.endGuest());
    return this.adoptGuest(this.newGuest(m), true);
  }
}

/** A driver whose sandboxes are entries of a FakeHost. `qemu`-like: attaches and pauses; `gvisor`-like: neither. */
export class FakeDriver implements Driver {
  readonly acceleration = "none";
  readonly attaches: boolean;
  readonly canPause: boolean;

  constructor(
    readonly name: "qemu" | "gvisor",
    readonly host: FakeHost,
  ) {
    this.attaches = name === "qemu";
    this.canPause = name === "qemu";
  }

  async preflight(): Promise<void> {}

  savedMemory(spec: SandboxSpec): boolean {
    return this.host.machines.get(spec.id)?.savedMemory === true;
  }

  create(spec: SandboxSpec): SandboxHandle {
    return new FakeHandle(this, spec);
  }

  async reconcile(): Promise<HostObject[]> {
    await tick();
    const found: HostObject[] = [];
    for (const [id, m] of this.host.machines) {
      if (m.driver !== this.name) continue;
      if (m.disk) found.push({ sandboxId: id, kind: "disk", description: `disk of ${id}`, disk: true });
      if (m.guest) found.push({ sandboxId: id, kind: "guest", description: `guest of ${id}` });
    }
    return found;
  }

  async removeOrphan(sandboxId: string): Promise<void> {
    await tick();
    const m = this.host.machines.get(sandboxId);
    if (m?.driver !== this.name) return;
    if (this.host.takeRemovalFailure()) throw new BothyError("internal", `The fake host kept ${sandboxId}.`);
    m.guest?.end({ code: null, signal: "SIGKILL" });
    this.host.machines.delete(sandboxId);
  }

  async release(sandboxId: string): Promise<void> {
    await tick();
    const m = this.host.machines.get(sandboxId);
    if (m?.driver !== this.name) return;
    m.guest?.end({ code: null, signal: "SIGKILL" });
  }
}
