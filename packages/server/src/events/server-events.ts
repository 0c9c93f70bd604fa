import type { ApprovalInfo, SandboxState } from "@bothy/protocol";

type Failure = { sandbox_id: string; error: string };

/** One decision of the egress gateway (gateway/egress-proxy.ts); public as `egress.allowed|denied|asked`. */
export interface SecretUseFields {
  sandbox_id: string;
  secret: string;
  host: string;
  method: string;
  path: string;
}

export interface EgressDecisionFields {
  sandbox_id: string;
  host: string;
  /** Null on HTTPS the gateway passes through (it sees no request inside). */
  method: string | null;
  path: string | null;
  /** `tenant#0`, `sandbox#2`, `default`, or what refused it outside the rules (`address`, `placeholder`, `sni`). */
  rule: string;
  action: "allow" | "deny" | "ask";
  /** allowed, granted (an earlier host grant), approved, pending, denied, expired, cancelled, refused, unavailable. */
  outcome: string;
  reason?: string;
  /** The upstream address it was sent to (allowed only). */
  address?: string;
  /** The gateway's time from the request's arrival to this decision (none for refusals before a request was read). */
  ms?: number;
}

/**
 * Everything the server's parts report, by name, with its fields. This is the event bus: the
 * logger, the metrics, the public events (SSE and webhook) and tests subscribe to these typed
 * events; none of them reads log lines. A new event needs an entry here and a level below.
 */
export interface ServerEventMap {
  drivers: {
    default: string;
    ready: string[];
    unavailable: Record<string, string>;
    acceleration: string | null;
    host_tag: string;
    cgroups: string;
    host_limits: "enforced" | "off" | "refused";
  };
  kernel_fetch: { package: string };
  ip_forward_enabled: { sysctl: string; why: string };
  network_pool_public: { pool: string };
  network_ready: { pool: string; uplink: string; dns: readonly string[]; table: string };
  network_plumbed: { sandbox_id: string; iface: string; guest: string; ms: number };
  qemu_base_snapshot: { key: string; image: string; ms: number };
  /** A sandbox from a QEMU snapshot with memory booted cold instead (qemu-sandbox.ts says why). */
  qemu_snapshot_cold_boot: { sandbox_id: string; reason: string };
  /** The gVisor agent's V8 startup snapshot was built (drivers/agent-snapshot.ts). */
  agent_snapshot: { node: string; blob: string; ms: number };
  /** It could not be: gVisor agents load their script instead (slower to start, same agent). */
  agent_snapshot_failed: { node: string; error: string };
  runsc_remove_retried: Failure;
  umount_lazy: { dir: string; target: string; error: string };

  sandbox_created: {
    sandbox_id: string;
    template: string;
    vcpu: number;
    memory_mib: number;
    driver: string;
    warm: boolean;
    ms: number;
    /** A boot's steps and the driver's start phases (ms), for profiling; absent when warm. */
    steps?: Readonly<Record<string, number>>;
  };
  sandbox_create_failed: Failure;
  pool_boot_failed: Failure;
  /** A pool sandbox given up: the host was full and a create or wake needed its room, or its template was rebuilt. */
  pool_evicted: { sandbox_id: string; reason: string };
  /** A claimed pool sandbox could not get its CPU weight back (it runs on at the lowest). */
  pool_prioritize_failed: Failure;
  sandbox_paused: { sandbox_id: string };
  sandbox_resumed: { sandbox_id: string };
  sandbox_resume_failed: Failure;
  sandbox_idle: { sandbox_id: string; idle_ms: number };
  sandbox_slept: { sandbox_id: string };
  /** Its timeout passed and its create asked for sleep: asleep (`state`) until a wake, deleted after `deleted_after`. */
  sandbox_timed_out: { sandbox_id: string; state: SandboxState; deleted_after: string };
  sandbox_sleep_failed: Failure;
  sandbox_woken: { sandbox_id: string; from: SandboxState; driver: string; ms: number };
  sandbox_wake_failed: Failure;
  sandbox_restore_failed: Failure;
  sandbox_flush_failed: Failure;
  sandbox_stopped: { sandbox_id: string };
  sandbox_stop_failed: Failure;
  /** Its VM or container ended on its own: `code`/`signal` from the driver, or what the sweeper saw. */
  sandbox_died: {
    sandbox_id: string;
    code?: number | null;
    signal?: string | null;
    detected_by?: "sweeper";
    reason?: string;
  };
  /** A row no sandbox stands behind (half-made at a restart, or found by the sweeper). */
  sandbox_lost: { sandbox_id: string; previous_state: SandboxState };
  /** The E2B create's envVars the ledger keeps could not be opened (the vault's key was replaced): commands run without them. */
  e2b_envs_unreadable: Failure;
  sandbox_recovered: { sandbox_id: string; previous_state: SandboxState; state: SandboxState };
  sandbox_reattached: { sandbox_id: string; driver: string; ms: number };
  sandbox_reattach_failed: Failure;
  sandbox_timeout_set: { sandbox_id: string; timeout_s: number; expires_at: string };
  sandbox_expired: { sandbox_id: string; expires_at: string | null };
  sandbox_deleted: { sandbox_id: string; reason: string };
  /**
   * Internal: the sandbox reached `deleted` or `failed` (sandbox-actor.ts). Side state kept
   * beside its row (the command registry and its replay buffers, the E2B rows) is dropped on this
   * one event (sandbox-final.ts).
   */
  sandbox_final: { sandbox_id: string; state: SandboxState };
  /** A `sandbox_final` listener threw; the others ran. */
  sandbox_final_cleanup_failed: Failure;
  /** A ledger write nobody waits for (a command's record, a key's last use, E2B's pid map) failed. */
  ledger_write_failed: { what: string; sandbox_id: string | null; error: string };
  /** A ledger read nobody waits for (the cluster's event feed, an approval's recheck) failed; the next one tries again. */
  ledger_read_failed: { what: string; error: string };
  sandbox_delete_failed: Failure;
  orphan_removed: { sandbox_id: string; kind: string; description: string; by: string; disk_kept?: true };
  orphan_remove_failed: Failure;
  /** Template layers no build names and nothing mounts (images/layer-store.ts), removed. */
  layers_removed: { layers: string[]; by: "startup" | "sweeper" };
  volume_created: { volume_id: string; tenant: string; name: string; size_mib: number };
  volume_deleted: { volume_id: string; tenant: string; name: string };
  volume_unmount_failed: { volume_id: string; error: string };
  volume_orphan_removed: { volume_id: string; description: string; by: string };
  volume_orphan_remove_failed: { volume_id: string; error: string };
  snapshot_created: {
    snapshot_id: string;
    sandbox_id: string;
    tenant: string;
    bytes: number;
    frozen_ms: number;
    ms: number;
  };
  snapshot_deleted: { snapshot_id: string; tenant: string; layer: string };
  /** A take-over found the sandbox frozen by a capture its old server died in, and resumed it. */
  snapshot_capture_thawed: {
    sandbox_id: string;
    /** QEMU: the VM's state as the take-over found it (`paused`, `postmigrate`). */ was?: string;
  };
  /** Sandboxes booting from a snapshot ahead of creates from it (`warm`); `error`: none could be started. */
  snapshot_warming: { snapshot_id: string; count: number; error?: string };
  snapshot_orphan_remove_failed: { snapshot_id: string; error: string };
  /** Snapshot layers no snapshot row names and nothing mounts, removed. */
  snapshot_layers_removed: { layers: string[]; by: string };
  sandbox_forked: { sandbox_id: string; snapshot_id: string; count: number };
  sweep_failed: { error: string };
  sweep_delete_failed: Failure;
  disconnect_grace_started: { sandbox_id: string; close_code: number | undefined; grace_s: number };
  disconnect_grace_cancelled: { sandbox_id: string };
  disconnect_delete_failed: Failure;

  /** `ms`: from asking the agent for the command to its process running. */
  command_started: { sandbox_id: string; command_id: string; pid: number; background: boolean; ms: number };
  command_exited: {
    sandbox_id: string;
    command_id: string;
    exit_code: number | null;
    signal: string | null;
    timed_out: boolean;
  };
  command_lost: { sandbox_id: string; command_id: string; reason: string };

  /** The sweeper deleted events past BOTHY_EVENTS_RETENTION: `rows` of them, every one below seq `kept_from`. */
  events_pruned: { rows: number; kept_from: number };
  webhook_failed: { seq: number; attempt: number; status?: number; error?: string };
  webhook_gave_up: { seq: number; type: string; attempts: number };
  /** The webhook's backlog is full: events from `seq` on are not posted until it drains (they stay in the ledger). */
  webhook_dropped: { seq: number; waiting: number };
  egress_allowed: EgressDecisionFields;
  egress_denied: EgressDecisionFields;
  egress_asked: EgressDecisionFields;
  /** The gateway put a vault secret into a request to a bound host, or refused one sent elsewhere: by name, never its value. */
  secret_injected: SecretUseFields;
  secret_refused: SecretUseFields;
  budget_exceeded: {
    owner: string;
    month: string;
    kind: string;
    vcpu_hours: number;
    gib_hours: number;
    budget: Record<string, number | null>;
  };
  /** An `ask` rule held a request or a tool call; the excerpt is masked by the asker. */
  approval_requested: ApprovalInfo;
  /** It left pending: approved, denied, expired or cancelled (`reason` says why for the last). */
  approval_decided: ApprovalInfo;
}

export type ServerEventName = keyof ServerEventMap;

/** One event: its name in `event` (as logged) beside its fields. */
export type ServerEvent = { [K in ServerEventName]: { event: K } & ServerEventMap[K] }[ServerEventName];

/** How a part reports an event; `ServerEvents.emit` is one. */
export type Logger = <K extends ServerEventName>(event: K, fields: ServerEventMap[K]) => void;

export type LogLevel = "debug" | "info" | "warn" | "error";

/** The level each event is logged at: failures warn, and nothing the operator must act on hides at info. */
export const EVENT_LEVELS: Record<ServerEventName, LogLevel> = {
  drivers: "info",
  kernel_fetch: "info",
  ip_forward_enabled: "warn",
  network_pool_public: "warn",
  network_ready: "info",
  network_plumbed: "info",
  qemu_base_snapshot: "info",
  qemu_snapshot_cold_boot: "warn",
  agent_snapshot: "info",
  agent_snapshot_failed: "warn",
  runsc_remove_retried: "warn",
  umount_lazy: "warn",
  sandbox_created: "info",
  sandbox_create_failed: "warn",
  pool_boot_failed: "warn",
  pool_evicted: "info",
  pool_prioritize_failed: "warn",
  sandbox_paused: "info",
  sandbox_resumed: "info",
  sandbox_resume_failed: "error",
  sandbox_idle: "info",
  sandbox_slept: "info",
  sandbox_timed_out: "info",
  sandbox_sleep_failed: "warn",
  sandbox_woken: "info",
  sandbox_wake_failed: "warn",
  sandbox_restore_failed: "warn",
  sandbox_flush_failed: "warn",
  sandbox_stopped: "info",
  sandbox_stop_failed: "warn",
  sandbox_died: "warn",
  sandbox_lost: "warn",
  e2b_envs_unreadable: "warn",
  sandbox_recovered: "info",
  sandbox_reattached: "info",
  sandbox_reattach_failed: "warn",
  sandbox_timeout_set: "info",
  sandbox_expired: "info",
  sandbox_deleted: "info",
  sandbox_final: "debug",
  sandbox_final_cleanup_failed: "error",
  ledger_write_failed: "error",
  ledger_read_failed: "warn",
  sandbox_delete_failed: "warn",
  orphan_removed: "info",
  orphan_remove_failed: "warn",
  layers_removed: "info",
  volume_created: "info",
  volume_deleted: "info",
  volume_unmount_failed: "warn",
  volume_orphan_removed: "info",
  volume_orphan_remove_failed: "warn",
  snapshot_created: "info",
  snapshot_deleted: "info",
  snapshot_warming: "info",
  snapshot_capture_thawed: "warn",
  snapshot_orphan_remove_failed: "warn",
  snapshot_layers_removed: "info",
  sandbox_forked: "info",
  sweep_failed: "error",
  sweep_delete_failed: "warn",
  disconnect_grace_started: "info",
  disconnect_grace_cancelled: "info",
  disconnect_delete_failed: "warn",
  command_started: "info",
  command_exited: "info",
  command_lost: "info",
  events_pruned: "info",
  webhook_failed: "warn",
  webhook_gave_up: "error",
  webhook_dropped: "error",
  budget_exceeded: "warn",
  egress_allowed: "debug",
  egress_denied: "info",
  secret_injected: "debug",
  secret_refused: "warn",
  egress_asked: "info",
  approval_requested: "info",
  approval_decided: "info",
};

export type ServerEventListener = (event: ServerEvent) => void;

/** The in-process bus: parts emit, subscribers (logger, metrics, public events) listen. */
export class ServerEvents {
  private readonly listeners = new Set<ServerEventListener>();

  readonly emit: Logger = (event, fields) => {
    const ev = { event, ...fields } as ServerEvent;
    for (const listener of [...this.listeners]) listener(ev);
  };

  subscribe(listener: ServerEventListener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }
}
