import { z } from "zod";
import { ptySize, signalName } from "./guest-frames.ts";
import { MAX_SANDBOX_VOLUMES, volumeMount } from "./volumes-api.ts";
import {
  AUDIT_EVENT_TYPES,
  effectiveHostPolicy,
  hostPolicyRequest,
  MAX_SANDBOX_SECRETS,
  secretName,
} from "./egress-api.ts";

/** Template names are plain identifiers: no path characters, so they can never escape the store. */
export const TEMPLATE_NAME_RE = /^[a-z0-9][a-z0-9-]{0,62}$/;
/** Sandbox ids: `sbx_` and 20 lowercase base32 characters. */
export const SANDBOX_ID_RE = /^sbx_[a-z2-7]{20}$/;
export const COMMAND_ID_RE = /^cmd_[a-z2-7]{20}$/;
/** Idempotency keys: printable ASCII without spaces, as in the IETF Idempotency-Key draft. */
export const IDEMPOTENCY_KEY_RE = /^[\x21-\x7e]{1,255}$/;

/**
 * `paused`: memory saved to disk (QEMU). `stopped`: no processes, disk kept (gVisor asleep, a
 * sandbox whose VM died, every running sandbox after a server restart). The next call to a paused
 * or stopped sandbox starts it again with the same id and files.
 */
export const SANDBOX_STATES = ["creating", "running", "paused", "stopped", "deleting", "deleted", "failed"] as const;
export const sandboxState = z.enum(SANDBOX_STATES);
export type SandboxState = z.infer<typeof sandboxState>;
/** States in which a sandbox still owns host resources. */
export const LIVE_STATES: readonly SandboxState[] = ["creating", "running", "paused", "stopped", "deleting"];
/** States of a sandbox that exists but runs nothing; the next call wakes it. */
export const DORMANT_STATES: readonly SandboxState[] = ["paused", "stopped"];

/** Sandbox drivers: gVisor (a user-space kernel) and QEMU microvm (a VM per sandbox). */
export const DRIVER_NAMES = ["gvisor", "qemu"] as const;
export type DriverName = (typeof DRIVER_NAMES)[number];

/** An IPv4 address or CIDR block (`203.0.113.7`, `203.0.113.0/24`); sandboxes have no IPv6. */
export const IPV4_CIDR_RE =
  /^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}(\/(3[0-2]|[12]?\d))?$/;
const ipv4Cidr = z.string().regex(IPV4_CIDR_RE, "an IPv4 address or CIDR block, e.g. 203.0.113.0/24");
export const MAX_EGRESS_RULES = 64;

/** A sandbox's effective network policy as the server applies it. */
export const networkPolicy = z.object({
  /** False when the server runs without networking (BOTHY_NETWORK=off): the sandbox has no interface. */
  enabled: z.boolean(),
  internet: z.boolean(),
  allow_out: z.array(z.string()),
  deny_out: z.array(z.string()),
  /** Resolvers named in the guest's /etc/resolv.conf. */
  dns: z.array(z.string()),
});
export type NetworkPolicy = z.infer<typeof networkPolicy>;

export const MAX_METADATA_KEYS = 32;
export const sandboxMetadata = z
  .record(
    z.string().regex(/^[A-Za-z0-9_.:-]{1,64}$/, "metadata keys are 1-64 letters, digits or _ . : -"),
    z.string().max(1024, "metadata values are at most 1024 characters"),
  )
  .refine((m) => Object.keys(m).length <= MAX_METADATA_KEYS, `at most ${MAX_METADATA_KEYS} metadata keys`);

/** What a sandbox's timeout does to it. */
export const onTimeout = z.enum(["delete", "sleep"]);
export type OnTimeout = z.infer<typeof onTimeout>;

export const createSandboxRequest = z
  .object({
    template: z.string().default("seed"),
    vcpu: z.number().int().default(1),
    memory_mib: z.number().int().default(512),
    /** The sandbox's disk in MiB (its own files, beyond the template); omitted: BOTHY_DEFAULT_DISK_MIB. */
    disk_mib: z.number().int().optional(),
    /** At most this many processes (threads included) run under its commands; omitted: BOTHY_DEFAULT_MAX_PROCESSES. */
    max_processes: z.number().int().optional(),
    /** Omitted: the server's default (BOTHY_DRIVER). */
    driver: z.enum(DRIVER_NAMES).optional(),
    /** Seconds from when it runs until the sweeper deletes it; omitted: BOTHY_DEFAULT_TIMEOUT_S. Range checked by the server. */
    timeout_s: z.number().int().optional(),
    /**
     * What its timeout does: `delete` (the default), or `sleep`: stopped with its disk kept (gVisor)
     * or paused with its memory (QEMU), then deleted once BOTHY_SLEEP_RETENTION_S more have passed.
     */
    on_timeout: onTimeout.optional(),
    /**
     * Whether a call (a command, a file call, a port request, an E2B envd call) wakes it after its
     * timeout or a pause put it to sleep; default true. With false such a call is refused with 409
     * `sandbox_asleep` until `POST /sandboxes/{id}/resume` wakes it.
     */
    auto_wake: z.boolean().optional(),
    /** Delete it when its last WebSocket drops without a clean close and none comes back in time. */
    delete_on_disconnect: z.boolean().optional(),
    /** That grace period in seconds; omitted: BOTHY_DISCONNECT_GRACE_S. */
    disconnect_grace_s: z.number().int().optional(),
    /** false: no egress at all (only `allow_out` destinations). Default true. */
    internet: z.boolean().optional(),
    /**
     * Destinations opened even when denied. A private, metadata or BOTHY_NET_BLOCK address only
     * within the operator's BOTHY_ALLOW_OUT_PERMIT and for a key with `network:private`; other
     * sandboxes and the host never.
     */
    allow_out: z.array(ipv4Cidr).max(MAX_EGRESS_RULES).optional(),
    /** Destinations blocked in addition to the private ranges. */
    deny_out: z.array(ipv4Cidr).max(MAX_EGRESS_RULES).optional(),
    /** The caller's own labels (e.g. a conversation or user id), returned with the sandbox. */
    metadata: sandboxMetadata.optional(),
    /** Host rules for its HTTP(S), applied after its tenant's (egress-api.ts). */
    policy: hostPolicyRequest.optional(),
    /** Vault secrets it may use: each becomes a placeholder variable (`github` → `GITHUB=bothy_ph_…`). */
    secrets: z.array(secretName).max(MAX_SANDBOX_SECRETS).optional(),
    /** Volumes of its tenant mounted at `path` (volumes-api.ts); the server checks paths and who else mounts them. */
    volumes: z.array(volumeMount).max(MAX_SANDBOX_VOLUMES).optional(),
    /**
     * Start from this snapshot of the tenant (its id, or its name): its files over its template's,
     * with a new identity. The template and driver are the snapshot's.
     */
    snapshot: z.string().min(1).max(80).optional(),
  })
  .strict();
export type CreateSandboxRequest = z.input<typeof createSandboxRequest>;

/** `POST /sandboxes/{id}/timeout`: the sandbox now expires `timeout_s` seconds from now. */
export const setTimeoutRequest = z.object({ timeout_s: z.number().int() }).strict();

export const sandboxInfo = z.object({
  sandbox_id: z.string(),
  metadata: z.record(z.string(), z.string()),
  state: sandboxState,
  template: z.string(),
  driver: z.string(),
  /** How the driver runs guests: "ptrace" (gVisor), "kvm" or "tcg" (QEMU software emulation). */
  acceleration: z.string().nullable(),
  vcpu: z.number().int(),
  memory_mib: z.number().int(),
  /** Null for sandboxes made before disk sizes existed. */
  disk_mib: z.number().int().nullable().optional(),
  /** Null for sandboxes made before process limits could be chosen (they had 1024 in VMs, none in gVisor). */
  max_processes: z.number().int().nullable().optional(),
  created_at: z.string(),
  deleted_at: z.string().nullable(),
  /** When the sweeper deletes it (ISO time); null for sandboxes made before timeouts existed. */
  expires_at: z.string().nullable(),
  delete_on_disconnect: z.boolean(),
  /** What its timeout does (`sleep`: expires_at is then, once asleep, its final deadline). */
  on_timeout: onTimeout.optional(),
  /** Whether a call wakes it from a sleep its timeout or a pause began (else only resume does). */
  auto_wake: z.boolean().optional(),
  /** Null for sandboxes made before network policies existed. */
  network: networkPolicy.nullable().optional(),
  /** The host and tool policy in force (its tenant's rules, then its own); null: none, its HTTP(S) goes out directly. */
  policy: effectiveHostPolicy.nullable().optional(),
  error: z.string().nullable().optional(),
});
export type SandboxInfo = z.infer<typeof sandboxInfo>;

export const sandboxList = z.object({ sandboxes: z.array(sandboxInfo) });

export const healthz = z.object({
  status: z.literal("ok"),
  uptime_s: z.number(),
  sandboxes: z.record(z.string(), z.number().int()),
});

// ---- the command WebSocket ------------------------------------------------------------------------

const envMap = z.record(
  z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, "environment names are letters, digits and _"),
  z.string(),
);

/** The first message on `/sandboxes/{id}/command`; `type` may be omitted. */
export const commandRequest = z
  .object({
    type: z.literal("command").optional(),
    cmd: z
      .string()
      .min(1, "cmd must not be empty")
      .max(256 * 1024),
    cwd: z.string().min(1).max(4096).optional(),
    env: envMap.optional(),
    timeout_s: z.number().positive().max(86400).optional(),
    stdin: z.boolean().optional(),
    /** Keep running after the socket closes; re-attach at /sandboxes/{id}/commands/{command_id}. */
    background: z.boolean().optional(),
    /** Run on a terminal (`true`: 80x24); output arrives as stdout only, stdin is open. */
    pty: z.union([z.literal(true), ptySize]).optional(),
  })
  .strict();
export type CommandRequest = z.infer<typeof commandRequest>;

/** Messages a client may send while its command runs. */
export const commandInput = z.discriminatedUnion("type", [
  z.object({ type: z.literal("stdin"), data: z.string(), encoding: z.enum(["utf8", "base64"]).optional() }).strict(),
  z.object({ type: z.literal("stdin_eof") }).strict(),
  z.object({ type: z.literal("signal"), signal: signalName }).strict(),
  z.object({ type: z.literal("resize"), cols: ptySize.shape.cols, rows: ptySize.shape.rows }).strict(),
]);
export type CommandInput = z.infer<typeof commandInput>;

/** The last message of a command that ran to its end. */
const processExited = z.object({
  type: z.literal("process_exited"),
  command_id: z.string(),
  exit_code: z.number().int().nullable(),
  signal: z.string().optional(),
  timed_out: z.boolean().optional(),
  /** The sandbox's kernel ran out of memory and ended it: raise memory_mib or use less. */
  oom_killed: z.boolean().optional(),
});

export const commandEvent = z.discriminatedUnion("type", [
  z.object({ type: z.literal("started"), command_id: z.string(), sandbox_id: z.string(), pid: z.number().int() }),
  z.object({
    type: z.enum(["stdout", "stderr"]),
    command_id: z.string(),
    data: z.string(),
    encoding: z.literal("base64").optional(),
  }),
  processExited,
  z.object({ type: z.literal("error"), code: z.string(), message: z.string(), command_id: z.string().optional() }),
  /** On re-attach: this many bytes of older output were dropped from the bounded replay buffer. */
  z.object({ type: z.literal("output_dropped"), command_id: z.string(), bytes: z.number().int() }),
  /**
   * Only on a kept socket (`?keep=true`): the socket takes a command. Its first frame, and again
   * after every command's end (`process_exited`, an `error` that ends it, or a refusal). After
   * `process_exited` the next command may go at once; after an `error`, wait for this (a command
   * refused at its start, e.g. a missing cwd, sends an `error` and still ends with
   * `process_exited`). A server that does not keep sockets never sends it.
   */
  z.object({ type: z.literal("ready") }),
]);
export type CommandEvent = z.infer<typeof commandEvent>;

/** Output kept per stream by `POST /sandboxes/{id}/commands`; beyond it output is dropped. */
export const COMMAND_OUTPUT_CAP_BYTES = 16 * 1024 * 1024;

/**
 * The answer of `POST /sandboxes/{id}/commands` (body: a CommandRequest without stdin,
 * background or pty): how the command ended, as `process_exited` says, and its whole output.
 * A stream that is not UTF-8 comes as base64 with its `*_encoding`; `truncated` says output past
 * COMMAND_OUTPUT_CAP_BYTES of a stream was dropped while the command ran on.
 */
export const commandResult = processExited.omit({ type: true }).extend({
  stdout: z.string(),
  stderr: z.string(),
  stdout_encoding: z.literal("base64").optional(),
  stderr_encoding: z.literal("base64").optional(),
  truncated: z.boolean().optional(),
});
export type CommandResultBody = z.infer<typeof commandResult>;

export const COMMAND_STATES = ["running", "exited", "lost"] as const;

export const commandInfo = z.object({
  command_id: z.string(),
  sandbox_id: z.string(),
  cmd: z.string(),
  state: z.enum(COMMAND_STATES),
  background: z.boolean(),
  exit_code: z.number().int().nullable(),
  signal: z.string().nullable(),
  timed_out: z.boolean(),
  started_at: z.string(),
  ended_at: z.string().nullable(),
});
export type CommandInfo = z.infer<typeof commandInfo>;

/** What `GET /events` streams and the webhook posts. */
export const EVENT_TYPES = [
  "sandbox.created",
  "sandbox.deleted",
  "sandbox.failed",
  "sandbox.stopped",
  "sandbox.woken",
  "command.exited",
  "budget.exceeded",
  // The egress gateway's audit (every policy decision; a secret by name only) and approvals.
  ...AUDIT_EVENT_TYPES,
] as const;
export const bothyEvent = z.object({
  seq: z.number().int(),
  type: z.enum(EVENT_TYPES),
  sandbox_id: z.string().nullable(),
  data: z.record(z.string(), z.unknown()),
  created_at: z.string(),
});
export type BothyEvent = z.infer<typeof bothyEvent>;

// ---- files ------------------------------------------------------------------------------------

/** A path inside the sandbox: absolute, or relative to /workspace. Resolved by the guest agent. */
export const sandboxPath = z
  .string()
  .min(1, "path must not be empty")
  .max(4096)
  .refine((p) => !p.includes("\0"), "path contains a NUL byte");

const flag = z.enum(["true", "false", "1", "0"]).transform((v) => v === "true" || v === "1");

/**
 * `GET /sandboxes/{id}/command?keep=true`: a kept command socket. After a command's last message
 * (`process_exited`, or an `error` that ends it) the socket stays open and the next message
 * starts the next command, one at a time; without `keep` the server closes it after one command.
 */
export const commandSocketQuery = z.object({ keep: flag.optional() });

/** `DELETE /sandboxes/{id}?wait=true` answers once the teardown has ended (`deleted`), not once it began. */
export const sandboxDeleteQuery = z.object({ wait: flag.optional() }).strict();

export const fileQuery = z.object({ path: sandboxPath }).strict();
export const fileWriteQuery = z
  .object({
    path: sandboxPath,
    mode: z
      .string()
      .regex(/^[0-7]{3,4}$/, "mode is octal, e.g. 644")
      .optional(),
  })
  .strict();
export const fileDeleteQuery = z.object({ path: sandboxPath, recursive: flag.optional() }).strict();
export const fileStatQuery = z.object({ path: sandboxPath, sha256: flag.optional() }).strict();
export const mkdirRequest = z.object({ path: sandboxPath, parents: z.boolean().optional() }).strict();
export const renameRequest = z.object({ from: sandboxPath, to: sandboxPath }).strict();

// ---- usage ------------------------------------------------------------------------------------

export const usageReport = z.object({
  month: z.string(),
  owners: z.array(
    z.object({
      owner: z.string(),
      vcpu_hours: z.number(),
      gib_hours: z.number(),
      budget: z.object({ vcpu_hours: z.number().nullable(), gib_hours: z.number().nullable() }),
      over_budget: z.array(z.string()),
    }),
  ),
  sandbox: z.object({ sandbox_id: z.string(), vcpu_hours: z.number(), gib_hours: z.number() }).optional(),
});
export type UsageReportBody = z.infer<typeof usageReport>;

/** `GET /usage/days?days=N`: the last N UTC days (today included), 1 to 92; default 31. */
export const usageDaysQuery = z.strictObject({ days: z.coerce.number().int().min(1).max(92).default(31) });

/** Metered hours per owner (tenant) and UTC day; a day without use has no entry. */
export const usageDays = z.object({
  /** The first day asked for (`2026-11-03`); the last is today. */
  from: z.string(),
  days: z.array(z.object({ day: z.string(), owner: z.string(), vcpu_hours: z.number(), gib_hours: z.number() })),
});
export type UsageDaysBody = z.infer<typeof usageDays>;
/** `GET /usage/sandboxes`: what each live sandbox of the caller's tenant has metered so far. */
export const sandboxUsageList = z.object({
  sandboxes: z.array(
    z.object({
      sandbox_id: z.string(),
      vcpu_seconds: z.number(),
      gib_seconds: z.number(),
    }),
  ),
});
export type SandboxUsageList = z.infer<typeof sandboxUsageList>;
