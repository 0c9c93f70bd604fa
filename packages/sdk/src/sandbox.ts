/**
 * A sandbox: create (also from a snapshot), connect, list, kill, pause/resume, snapshot and fork
 * and its lifetime, with `commands`,
 * `pty` and `files` for what runs inside. Everything goes over bothy's public API.
 */
import {
  auditList,
  forkResult,
  sandboxInfo,
  sandboxList,
  snapshotInfo,
  type AUDIT_EVENT_TYPES,
  type DriverName,
  type HostPolicyRequest,
  type OnTimeout,
  type SandboxInfo,
  type SandboxState,
  type SnapshotInfo,
} from "@bothy/protocol";
import { Commands } from "./commands.ts";

type AuditEventType = (typeof AUDIT_EVENT_TYPES)[number];
import { streamEvents, type BothyEvent, type EventOptions } from "./events.ts";
import { NotFoundError } from "./errors.ts";
import { Files } from "./files.ts";
import { HttpClient, type CallOptions, type ConnectionOptions, type RequestOptions } from "./http-client.ts";
import { Desktop } from "./desktop.ts";
import { Ports } from "./ports.ts";
import { Pty } from "./pty.ts";

export type { DriverName, SandboxInfo, SandboxState };

export interface SandboxOptions extends ConnectionOptions, CallOptions {}

export interface KillOptions {
  /** Answer once the sandbox is `deleted` (its teardown on the host ended), not once it is `deleting`. */
  wait?: boolean;
}

export interface SandboxCreateOptions extends SandboxOptions {
  /** Template name (default "seed"). */
  template?: string;
  vcpu?: number;
  memoryMib?: number;
  /** Room for the sandbox's own files beyond its template, in MiB (default: the server's, 4096). */
  diskMib?: number;
  /** At most this many processes (threads included) under its commands (default: the server's, 1024). */
  maxProcesses?: number;
  /** Seconds from when it runs until the server deletes it (default: the server's, 1 h). */
  timeoutS?: number;
  /**
   * What its timeout does: `delete` (default) or `sleep`: asleep (gVisor: files kept, processes
   * ended; QEMU: memory kept) until a call or `resume` wakes it with its timeout again, and
   * deleted after the server's BOTHY_SLEEP_RETENTION_S (30 days) asleep.
   */
  onTimeout?: OnTimeout;
  /**
   * Whether a call (command, file, port) wakes it after its timeout or `pause` put it to sleep
   * (default true). With false such calls throw ConflictError (`sandbox_asleep`) until `resume`.
   */
  autoWake?: boolean;
  /** gvisor or qemu (default: the server's BOTHY_DRIVER). */
  driver?: DriverName;
  /** The same key with the same options answers the same sandbox instead of booting another. */
  idempotencyKey?: string;
  /** Delete the sandbox when this client's sockets drop without a clean close. */
  deleteOnDisconnect?: boolean;
  disconnectGraceS?: number;
  /** Your own labels, returned with the sandbox (at most 32 keys). */
  metadata?: Record<string, string>;
  /**
   * Egress: `internet: false` blocks all of it; `allowOut` opens IPv4 addresses or CIDR blocks
   * (a private or metadata one only with a key holding `network:private`, inside the server's
   * BOTHY_ALLOW_OUT_PERMIT; other sandboxes and the host never); `denyOut` blocks more. Needs
   * networking on the server (BOTHY_NETWORK=on).
   */
  network?: { internet?: boolean; allowOut?: string[]; denyOut?: string[] };
  /**
   * Host and tool rules, after the tenant's (the server's `hostPolicyRequest`, wire names:
   * `allow_hosts`, `deny_hosts`, `rules`, `default`, `tools`).
   */
  policy?: HostPolicyRequest;
  /** Vault secrets it may use; each becomes a placeholder variable (`github` → `GITHUB`). */
  secrets?: string[];
  /**
   * Volumes of the tenant to mount (`Volume.create`): each at its absolute `path`, read-write by
   * one sandbox at a time or `readOnly` by any number (gVisor sandboxes only, for now).
   */
  volumes?: Array<{ name: string; path: string; readOnly?: boolean }>;
  /**
   * Start from this snapshot of the tenant (id or name; `sandbox.snapshot()`): its files, a new
   * identity. Its template and driver are the snapshot's: leave `template` out.
   */
  snapshot?: string;
}

/** `sandbox.fork(n, options)`. */
export interface ForkOptions extends CallOptions {
  /** A name for the fork's snapshot. */
  name?: string;
  /** Each child's timeout (default: the server's). */
  timeoutS?: number;
  /**
   * Keep memory and processes in the snapshot, so each child resumes them (QEMU); a driver that
   * cannot (gVisor here) throws NotSupportedError and makes nothing.
   */
  memory?: boolean;
  /** Labels every child gets. */
  metadata?: Record<string, string>;
  /** The same key answers the same snapshot and children instead of making more. */
  idempotencyKey?: string;
}

export class Sandbox {
  readonly sandboxId: string;
  readonly commands: Commands;
  readonly pty: Pty;
  readonly files: Files;
  readonly ports: Ports;
  /** The screen, mouse and keyboard of a sandbox of the `desktop` template. */
  readonly desktop: Desktop;
  private readonly http: HttpClient;
  private last: SandboxInfo;

  private constructor(http: HttpClient, info: SandboxInfo) {
    this.http = http;
    this.sandboxId = info.sandbox_id;
    this.last = info;
    this.commands = new Commands(http, info.sandbox_id);
    this.pty = new Pty(this.commands);
    this.files = new Files(http, info.sandbox_id);
    this.ports = new Ports(http, info.sandbox_id);
    this.desktop = new Desktop(http, info.sandbox_id);
  }

  /** Boots a new sandbox and answers once it runs. */
  static async create(options: SandboxCreateOptions = {}): Promise<Sandbox> {
    const http = new HttpClient(options);
    const body = {
      ...(options.template === undefined ? {} : { template: options.template }),
      ...(options.vcpu === undefined ? {} : { vcpu: options.vcpu }),
      ...(options.memoryMib === undefined ? {} : { memory_mib: options.memoryMib }),
      ...(options.diskMib === undefined ? {} : { disk_mib: options.diskMib }),
      ...(options.maxProcesses === undefined ? {} : { max_processes: options.maxProcesses }),
      ...(options.timeoutS === undefined ? {} : { timeout_s: options.timeoutS }),
      ...(options.onTimeout === undefined ? {} : { on_timeout: options.onTimeout }),
      ...(options.autoWake === undefined ? {} : { auto_wake: options.autoWake }),
      ...(options.driver === undefined ? {} : { driver: options.driver }),
      ...(options.deleteOnDisconnect === undefined ? {} : { delete_on_disconnect: options.deleteOnDisconnect }),
      ...(options.disconnectGraceS === undefined ? {} : { disconnect_grace_s: options.disconnectGraceS }),
      ...(options.metadata === undefined ? {} : { metadata: options.metadata }),
      ...(options.network?.internet === undefined ? {} : { internet: options.network.internet }),
      ...(options.network?.allowOut === undefined ? {} : { allow_out: options.network.allowOut }),
      ...(options.network?.denyOut === undefined ? {} : { deny_out: options.network.denyOut }),
      ...(options.policy === undefined ? {} : { policy: options.policy }),
      ...(options.secrets === undefined ? {} : { secrets: options.secrets }),
      ...(options.volumes === undefined
        ? {}
        : {
            volumes: options.volumes.map((v) => ({
              name: v.name,
              path: v.path,
              ...(v.readOnly === undefined ? {} : { read_only: v.readOnly }),
            })),
          }),
      ...(options.snapshot === undefined ? {} : { snapshot: options.snapshot }),
    };
    const info = await http.json("POST", "/sandboxes", sandboxInfo, {
      body,
      ...(options.idempotencyKey === undefined ? {} : { headers: { "idempotency-key": options.idempotencyKey } }),
      ...signalOf(options),
    });
    return new Sandbox(http, info);
  }

  /** A handle on an existing sandbox (NotFoundError when there is none; a deleted one is still answered). */
  static async connect(sandboxId: string, options: SandboxOptions = {}): Promise<Sandbox> {
    const http = new HttpClient(options);
    return new Sandbox(http, await http.json("GET", `/sandboxes/${sandboxId}`, sandboxInfo, signalOf(options)));
  }

  /** The live sandboxes (creating, running, paused, deleting). */
  static async list(options: SandboxOptions = {}): Promise<SandboxInfo[]> {
    return (await new HttpClient(options).json("GET", "/sandboxes", sandboxList, signalOf(options))).sandboxes;
  }

  /**
   * Deletes a sandbox by id; answers false when there was none. Deleting twice is fine. It answers
   * once the sandbox is `deleting` and unreachable; with `wait: true`, once its teardown has ended.
   */
  static async kill(sandboxId: string, options: SandboxOptions & KillOptions = {}): Promise<boolean> {
    try {
      await new HttpClient(options).json("DELETE", `/sandboxes/${sandboxId}`, sandboxInfo, killRequest(options));
      return true;
    } catch (err) {
      if (err instanceof NotFoundError) return false;
      throw err;
    }
  }

  /** Sandbox and command events (`sandbox.created`, `command.exited`, …) for all sandboxes. */
  static events(options: SandboxOptions & EventOptions = {}): AsyncGenerator<BothyEvent> {
    return streamEvents(new HttpClient(options), options);
  }

  /** The server's address and key this sandbox was reached with. */
  get connection(): ConnectionOptions {
    return this.http.connection;
  }

  /** What the server last said about this sandbox (refresh with `getInfo()`). */
  get info(): SandboxInfo {
    return this.last;
  }

  /** Where `port` inside the sandbox is reached, without the scheme: `ports.host(port)`. */
  getHost(port: number): string {
    return this.ports.host(port);
  }

  async getInfo(options: CallOptions = {}): Promise<SandboxInfo> {
    return this.update(this.http.json("GET", `/sandboxes/${this.sandboxId}`, sandboxInfo, signalOf(options)));
  }

  async isRunning(options: CallOptions = {}): Promise<boolean> {
    return (await this.getInfo(options)).state === "running";
  }

  /**
   * Deletes the sandbox and everything in it. Safe to call twice. It answers once the sandbox is
   * `deleting` and unreachable (the host finishes in the background); with `wait: true`, once it is
   * `deleted`.
   */
  async kill(options: CallOptions & KillOptions = {}): Promise<void> {
    this.commands.closeKept();
    await this.update(this.http.json("DELETE", `/sandboxes/${this.sandboxId}`, sandboxInfo, killRequest(options)));
  }

  /** The sandbox now expires `timeoutS` seconds from now (extends or shortens its life). */
  async setTimeout(timeoutS: number, options: CallOptions = {}): Promise<SandboxInfo> {
    return this.update(
      this.http.json("POST", `/sandboxes/${this.sandboxId}/timeout`, sandboxInfo, {
        body: { timeout_s: timeoutS },
        ...signalOf(options),
      }),
    );
  }

  /** Saves memory to disk and stops the VM (QEMU driver; gVisor throws NotSupportedError). */
  async pause(options: CallOptions = {}): Promise<SandboxInfo> {
    return this.update(this.http.json("POST", `/sandboxes/${this.sandboxId}/pause`, sandboxInfo, signalOf(options)));
  }

  /**
   * Keeps the sandbox's files (what it wrote over its template) as a snapshot, frozen only for the
   * copy; `Sandbox.create({ snapshot })` starts sandboxes from it. `memory: true` throws a
   * NotSupportedError on gVisor.
   */
  async snapshot(options: CallOptions & { name?: string; memory?: boolean } = {}): Promise<SnapshotInfo> {
    return this.http.json("POST", `/sandboxes/${this.sandboxId}/snapshots`, snapshotInfo, {
      body: {
        ...(options.name === undefined ? {} : { name: options.name }),
        ...(options.memory === undefined ? {} : { memory: options.memory }),
      },
      ...signalOf(options),
    });
  }

  /**
   * A snapshot of this sandbox and `count` new sandboxes started from it, each with its own
   * identity; all or none are made.
   */
  async fork(count: number, options: ForkOptions = {}): Promise<{ snapshot: SnapshotInfo; sandboxes: Sandbox[] }> {
    const result = await this.http.json("POST", `/sandboxes/${this.sandboxId}/fork`, forkResult, {
      body: {
        count,
        ...(options.name === undefined ? {} : { name: options.name }),
        ...(options.timeoutS === undefined ? {} : { timeout_s: options.timeoutS }),
        ...(options.memory === undefined ? {} : { memory: options.memory }),
        ...(options.metadata === undefined ? {} : { metadata: options.metadata }),
      },
      ...(options.idempotencyKey === undefined ? {} : { headers: { "idempotency-key": options.idempotencyKey } }),
      ...signalOf(options),
    });
    return { snapshot: result.snapshot, sandboxes: result.sandboxes.map((info) => new Sandbox(this.http, info)) };
  }

  /** Resumes a paused or sleeping sandbox (calls also wake it on their own, unless it was made with `autoWake: false`). */
  async resume(options: CallOptions = {}): Promise<SandboxInfo> {
    return this.update(this.http.json("POST", `/sandboxes/${this.sandboxId}/resume`, sandboxInfo, signalOf(options)));
  }

  /**
   * The egress gateway's decisions about this sandbox (`egress.allowed|denied|asked`, and its
   * secrets' and approvals' events), from the ledger, oldest first; `after` pages on by `seq`.
   */
  async audit(
    options: CallOptions & { types?: AuditEventType[]; after?: number; limit?: number } = {},
  ): Promise<BothyEvent[]> {
    const query = {
      ...(options.types ? { type: options.types.join(",") } : {}),
      ...(options.after === undefined ? {} : { after: options.after }),
      ...(options.limit === undefined ? {} : { limit: options.limit }),
    };
    const list = await this.http.json("GET", `/sandboxes/${this.sandboxId}/audit`, auditList, {
      query,
      ...signalOf(options),
    });
    return list.events;
  }

  /** This sandbox's events, replayed from `since` and then live (unless `follow: false`). */
  events(options: EventOptions = {}): AsyncGenerator<BothyEvent> {
    return streamEvents(this.http, { ...options, sandboxId: this.sandboxId });
  }

  private async update(info: Promise<SandboxInfo>): Promise<SandboxInfo> {
    this.last = await info;
    return this.last;
  }
}

function signalOf(options: CallOptions): CallOptions {
  return options.signal ? { signal: options.signal } : {};
}

function killRequest(options: CallOptions & KillOptions): RequestOptions {
  return { ...signalOf(options), ...(options.wait ? { query: { wait: true } } : {}) };
}
