import { realpathSync } from "node:fs";
import { cpus, totalmem } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { z } from "zod";
import { createSandboxRequest, DRIVER_NAMES, TEMPLATE_NAME_RE, type DriverName } from "@bothy/protocol";
import { parseRetention } from "./events/event-retention.ts";
import type { EventRetention } from "./ledger/event-rows.ts";

/** Fewer and a command's own shell, pipeline and helpers could not start. */
const MIN_PROCESSES = 16;

const int = (def: number) => z.coerce.number().int().positive().default(def);

const envSchema = z.object({
  BOTHY_HOST: z.string().default("127.0.0.1"),
  BOTHY_PORT: z.coerce.number().int().min(0).max(65535).default(8080),
  BOTHY_HOME: z.string().default("/var/lib/bothy"),
  BOTHY_TEMPLATES_DIR: z.string().optional(),
  /** The ledger on PostgreSQL (`postgres://…`); unset or empty: SQLite in BOTHY_HOME. Never echoed: it may hold a password. */
  BOTHY_DATABASE_URL: z
    .string()
    .optional()
    .refine((v) => v === undefined || v === "" || /^postgres(ql)?:\/\/[^/\s]/.test(v), {
      message: "must be a postgres:// or postgresql:// URL (unset it for the SQLite ledger in BOTHY_HOME)",
    }),
  BOTHY_MAX_VCPU: int(cpus().length),
  BOTHY_MAX_MEMORY_MIB: int(Math.max(1024, Math.floor(totalmem() / 1024 / 1024 / 2))),
  BOTHY_MAX_SANDBOXES: int(64),
  /** A sandbox's own disk (what it writes beyond its template), in MiB: default and maximum. */
  BOTHY_DEFAULT_DISK_MIB: int(4096),
  BOTHY_MAX_DISK_MIB: int(65536),
  /** How many processes (threads included) a sandbox's commands may run at once: default and maximum. */
  BOTHY_DEFAULT_MAX_PROCESSES: int(1024),
  BOTHY_LIMIT_MAX_PROCESSES: int(32768),
  BOTHY_POOL_SIZE: z.coerce.number().int().min(0).max(32).default(1),
  /**
   * The shapes the warm pool keeps sandboxes of, comma-separated `TEMPLATE:VCPU:MEMORY_MIB[:DRIVER]`
   * (default: a create's defaults on the default driver); a create of any other shape boots its own.
   */
  BOTHY_POOL_SHAPES: z.string().optional(),
  BOTHY_LOG_LEVEL: z.enum(["fatal", "error", "warn", "info", "debug", "trace", "silent"]).default("info"),
  BOTHY_BOOT_TIMEOUT_S: int(60),
  /**
   * `required`: a host whose cgroups cannot limit a sandbox's CPU, memory and processes refuses
   * to start sandboxes (saying how to fix it); `off`: they run without host limits.
   */
  BOTHY_HOST_LIMITS: z.enum(["required", "off"]).default("required"),
  /** The gVisor runtime binary (a path, or a name on PATH): e.g. a newer runsc unpacked beside the system's. */
  BOTHY_RUNSC: z.string().min(1).default("runsc"),
  /** gVisor's platform: `ptrace` works everywhere; `systrap` needs runsc 2023 or later (docs/performance.md). */
  BOTHY_RUNSC_PLATFORM: z.enum(["ptrace", "systrap"]).default("ptrace"),
  /**
   * gVisor: the Node that runs the guest agent. `host`: the server's own Node, bind-mounted
   * read-only, when it is a self-contained build with a startup snapshot (Debian's Node 18 in the
   * templates has no snapshot or code cache and starts ~0.3 s slower under ptrace); `template`:
   * the template's /usr/bin/node; or a path to a Node on the host. A template whose libraries the
   * chosen Node cannot load runs the agent on its own Node (bothy-init --fallback).
   */
  BOTHY_AGENT_NODE: z
    .string()
    .refine((v) => v === "host" || v === "template" || v.startsWith("/"), "host, template or an absolute path")
    .default("host"),
  /**
   * gVisor: `boot` starts the agent's Node at boot; `lazy` has bothy-init answer the host's hello
   * and `limits` itself and start Node on the first frame that needs it (issue #31: a boot at the
   * raw `runsc run` floor, 0.42x the sandbox's CPU of a `boot` one, but until exec is native the
   * first command pays Node's start instead, so `boot` stays the default).
   */
  BOTHY_AGENT_START: z.enum(["boot", "lazy"]).default("boot"),
  /** The default driver; `auto` is qemu with KVM where hardware virtualization works, else gvisor. */
  BOTHY_DRIVER: z.enum(["auto", "gvisor", "qemu"]).default("auto"),
  /** QEMU: restore new sandboxes from a per-template memory snapshot (1) or boot each (0). */
  BOTHY_QEMU_WARM: z.enum(["0", "1"]).default("1"),
  /**
   * QEMU under TCG: translation cache in MiB, the bulk of an idle VM's memory beyond the guest's.
   * 64: a command's round trip ~0.5 s; at 16 (~48 MB less per VM) the agent's Node no longer fits
   * and every command took 2-3 s, at 32 ~2 s (measured, docs/architecture.md).
   */
  BOTHY_QEMU_TB_MIB: int(64),
  /** Where the QEMU guest kernel is unpacked; default `$BOTHY_HOME/kernel`. */
  BOTHY_KERNEL_DIR: z.string().optional(),
  BOTHY_WEBHOOK_URL: z.url({ protocol: /^https?$/ }).optional(),
  BOTHY_WEBHOOK_RETRY_MS: int(1000),
  /** Signs every webhook POST (`Bothy-Signature: t=<unix s>,v1=<hex HMAC-SHA256 of "<t>.<body>">`); unset: unsigned. */
  BOTHY_WEBHOOK_SECRET: z.string().min(16, "at least 16 characters").optional(),
  /** How long an `ask` waits for a person's decision before it expires (and the request is refused). */
  BOTHY_APPROVAL_TIMEOUT_S: int(180),
  BOTHY_COMMAND_REPLAY_BYTES: int(1024 * 1024),
  /**
   * How long the events table keeps a row (SSE replay, the webhook's record, sandbox audits): an
   * age, a number of rows, or both (`7d,1000000`); the sweeper deletes what is past either.
   */
  BOTHY_EVENTS_RETENTION: z
    .string()
    .default("7d,1000000")
    .transform((text, ctx) => {
      const parsed = parseRetention(text);
      if (typeof parsed === "string") {
        ctx.addIssue({ code: "custom", message: parsed });
        return z.NEVER;
      }
      return parsed;
    }),
  /** Sandbox lifetime when a create names none, and the most a create or POST /timeout may ask. */
  BOTHY_DEFAULT_TIMEOUT_S: int(3600),
  BOTHY_MAX_TIMEOUT_S: int(86400),
  /**
   * How long a sandbox its timeout put to sleep (`on_timeout: "sleep"`) is kept asleep before it
   * is deleted; 30 days, E2B's retention of paused sandboxes.
   */
  BOTHY_SLEEP_RETENTION_S: int(2_592_000),
  /** How long a delete_on_disconnect sandbox waits for its client to come back. */
  BOTHY_DISCONNECT_GRACE_S: z.coerce.number().int().min(0).max(3600).default(10),
  /** How often the sweeper deletes expired sandboxes, checks deaths and removes orphans. */
  BOTHY_SWEEP_INTERVAL_S: int(30),
  /** Monthly caps for the owner's running sandboxes; crossing one warns (log, event, webhook). */
  BOTHY_BUDGET_VCPU_HOURS: z.coerce.number().positive().optional(),
  BOTHY_BUDGET_GIB_HOURS: z.coerce.number().positive().optional(),
  /** Over a monthly budget: `warn` (log, event, webhook) or also `block` the tenant's new creates. */
  BOTHY_BUDGET_ACTION: z.enum(["warn", "block"]).default("warn"),
  /** `keys`: every request needs an API key; `none`: no authentication (refused unless bound to loopback). */
  BOTHY_AUTH: z.enum(["keys", "none"]).default("keys"),
  /** The admin key the first start mints instead of a random one (for provisioning); a bothy key. */
  BOTHY_ADMIN_KEY: z
    .string()
    .regex(/^bothy_[0-9a-f]{64}$/, "bothy_ and 64 hex digits, as `bothy keys create` prints them")
    .optional(),
  /** PEM certificate chain and key: the server speaks HTTPS itself. */
  BOTHY_TLS_CERT: z.string().optional(),
  BOTHY_TLS_KEY: z.string().optional(),
  /** 1: a non-loopback address may serve plain HTTP (a TLS proxy in front does TLS). */
  BOTHY_INSECURE_HTTP: z.enum(["0", "1"]).default("0"),
  /** How often running sandboxes' usage is added up. */
  BOTHY_METER_INTERVAL_S: z.coerce.number().positive().default(15),
  /** A sandbox with no command running and no client attached this long goes to sleep (0: never). */
  BOTHY_IDLE_TIMEOUT_S: z.coerce.number().int().min(0).default(900),
  /** Per-sandbox networking with the egress posture of packages/server/src/network/ (off: no network at all). */
  BOTHY_NETWORK: z.enum(["on", "off"]).default("on"),
  /** IPv4 block each sandbox's /30 is carved from. */
  BOTHY_NET_POOL: z.string().default("10.179.0.0/16"),
  /** Interface sandboxes' traffic leaves by (NAT); default: the default route's interface. */
  BOTHY_UPLINK: z.string().optional(),
  /** Resolvers for the guests' resolv.conf, comma-separated; must be public addresses. */
  BOTHY_DNS: z.string().default("1.1.1.1,8.8.8.8"),
  /** More destinations every sandbox is refused, comma-separated CIDRs (e.g. a cloud's metadata on a public address). */
  BOTHY_NET_BLOCK: z.string().default(""),
  /**
   * The private, metadata or BOTHY_NET_BLOCK blocks a create's `allow_out` may open (for a key with
   * `network:private`), comma-separated CIDRs; empty: none.
   */
  BOTHY_ALLOW_OUT_PERMIT: z.string().default(""),
  /** With BOTHY_DATABASE_URL: the URL the other nodes reach this one at. */
  BOTHY_NODE_URL: z.url({ protocol: /^https?$/ }).optional(),
  /** With BOTHY_DATABASE_URL: this node's id; default: one made at its first start, kept in $BOTHY_HOME/node-id. */
  BOTHY_NODE_ID: z
    .string()
    .regex(/^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$/, "lower-case letters, digits, dots and dashes, as a host name")
    .optional(),
  /**
   * The vault's key, 32 bytes, read from this file (a mounted secret) and never made; unset:
   * `$BOTHY_HOME/secrets/vault.key`, made at the first start. Several nodes need the same one.
   */
  BOTHY_VAULT_KEY_FILE: z.string().startsWith("/", "an absolute path").optional(),
  /** How long a node's lease, and the leader's, lasts past its last renewal (three per lease). */
  BOTHY_NODE_LEASE_S: z.coerce.number().int().min(3).max(300).default(15),
  /**
   * With BOTHY_DATABASE_URL: a file holding the cluster's secret (the same on every node, 32 bytes
   * or more), which signs requests one node forwards to another (cluster/cluster-secret.ts).
   */
  BOTHY_CLUSTER_SECRET_FILE: z.string().optional(),
  /** Serves `{port}-{sandbox id}.<this domain>` as that sandbox's port (a wildcard DNS name for the server). */
  BOTHY_PREVIEW_DOMAIN: z
    .string()
    .regex(
      /^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$/,
      "a lower-case DNS name such as preview.example.com",
    )
    .optional(),
});

/** One shape of the warm pool (BOTHY_POOL_SHAPES); its disk and process limit are the host's defaults. */
export interface PoolShapeConfig {
  template: string;
  vcpu: number;
  memoryMib: number;
  driver: DriverName | undefined;
}

/** The most shapes the warm pool keeps: each costs BOTHY_POOL_SIZE booted sandboxes. */
export const MAX_POOL_SHAPES = 8;

export interface Config {
  host: string;
  port: number;
  home: string;
  /** The ledger's PostgreSQL database (BOTHY_DATABASE_URL); undefined: SQLite at `home`/ledger.sqlite. */
  databaseUrl: string | undefined;
  templatesDir: string;
  templateSources: string;
  agentPath: string;
  limits: {
    minVcpu: number;
    maxVcpu: number;
    minMemoryMib: number;
    maxMemoryMib: number;
    minDiskMib: number;
    maxDiskMib: number;
    defaultDiskMib: number;
    minProcesses: number;
    maxProcesses: number;
    defaultProcesses: number;
    maxSandboxes: number;
  };
  poolSize: number;
  /** What the warm pool keeps `poolSize` sandboxes of each; `driver` undefined: the default driver. */
  poolShapes: PoolShapeConfig[];
  logLevel: z.infer<typeof envSchema>["BOTHY_LOG_LEVEL"];
  bootTimeoutMs: number;
  bodyLimitBytes: number;
  /** Host names `{port}-{id}.<previewDomain>` reach that sandbox's port (unset: only the path form). */
  previewDomain: string | undefined;
  driver: "auto" | "gvisor" | "qemu";
  hostLimits: "required" | "off";
  qemu: { warmStart: boolean; tbSizeMib: number; kernelDir: string };
  /** `agentNode`: the host file of the Node that runs the agent in gVisor sandboxes (BOTHY_AGENT_NODE); unset: the template's. */
  gvisor: {
    runsc: string;
    platform: "ptrace" | "systrap";
    agentNode: string | undefined;
    /** BOTHY_AGENT_START: when the agent's Node starts in a gVisor sandbox. */
    agentStart: "boot" | "lazy";
  };
  webhook: { url: string; retryBaseMs: number; secret: string | undefined } | undefined;
  approvals: { timeoutMs: number };
  /** BOTHY_VAULT_KEY_FILE; undefined: the home's `secrets/vault.key`. */
  vaultKeyFile: string | undefined;
  commandReplayBytes: number;
  /** What the sweeper prunes from the events table (BOTHY_EVENTS_RETENTION). */
  eventRetention: EventRetention;
  metering: {
    intervalMs: number;
    budget: { vcpuHours: number | undefined; gibHours: number | undefined };
    budgetAction: "warn" | "block";
  };
  auth: { mode: "keys" | "none"; adminKey: string | undefined };
  tls: { cert: string; key: string } | undefined;
  insecureHttp: boolean;
  lifecycle: {
    defaultTimeoutS: number;
    maxTimeoutS: number;
    /** BOTHY_SLEEP_RETENTION_S: a sandbox asleep after its timeout is deleted this long after. */
    sleepRetentionS: number;
    disconnectGraceS: number;
    sweepIntervalMs: number;
    idleTimeoutMs: number;
  };
  network: {
    enabled: boolean;
    pool: string;
    uplink: string | undefined;
    dns: string[];
    extraBlocked: string[];
    allowOutPermit: string[];
  };
  /** Set with BOTHY_DATABASE_URL: this node's place in a cluster (cluster/cluster-node.ts). */
  cluster: ClusterConfig | undefined;
}

export interface ClusterConfig {
  databaseUrl: string;
  nodeUrl: string;
  /** Undefined: the id kept in $BOTHY_HOME/node-id (made at the first start). */
  nodeId: string | undefined;
  leaseMs: number;
  /** Undefined: this node forwards nothing and places no create elsewhere (it answers all itself). */
  secretFile: string | undefined;
}

const list = (s: string): string[] =>
  s
    .split(",")
    .map((x) => x.trim())
    .filter(Boolean);

const repoRoot = fileURLToPath(new URL("../../../", import.meta.url));

/** Reads the configuration from the environment; a bad value stops start-up with its name. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env, overrides: Partial<Config> = {}): Config {
  const parsed = envSchema.safeParse(env);
  if (!parsed.success) {
    const issues = parsed.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`).join("; ");
    throw new Error(`Invalid configuration: ${issues}`);
  }
  const e = parsed.data;
  if ((e.BOTHY_TLS_CERT === undefined) !== (e.BOTHY_TLS_KEY === undefined))
    throw new Error("Invalid configuration: BOTHY_TLS_CERT and BOTHY_TLS_KEY go together; set both or neither");
  if (e.BOTHY_DEFAULT_TIMEOUT_S > e.BOTHY_MAX_TIMEOUT_S)
    throw new Error(
      `Invalid configuration: BOTHY_DEFAULT_TIMEOUT_S (${e.BOTHY_DEFAULT_TIMEOUT_S}) exceeds BOTHY_MAX_TIMEOUT_S (${e.BOTHY_MAX_TIMEOUT_S})`,
    );
  return {
    host: e.BOTHY_HOST,
    port: e.BOTHY_PORT,
    home: e.BOTHY_HOME,
    databaseUrl: e.BOTHY_DATABASE_URL === "" ? undefined : e.BOTHY_DATABASE_URL,
    templatesDir: e.BOTHY_TEMPLATES_DIR ?? join(e.BOTHY_HOME, "templates"),
    templateSources: join(repoRoot, "templates"),
    agentPath: join(repoRoot, "packages/guest/dist/agent.mjs"),
    limits: {
      minVcpu: 1,
      maxVcpu: e.BOTHY_MAX_VCPU,
      minMemoryMib: 128,
      maxMemoryMib: e.BOTHY_MAX_MEMORY_MIB,
      minDiskMib: 64,
      maxDiskMib: e.BOTHY_MAX_DISK_MIB,
      defaultDiskMib: Math.min(e.BOTHY_DEFAULT_DISK_MIB, e.BOTHY_MAX_DISK_MIB),
      minProcesses: MIN_PROCESSES,
      maxProcesses: e.BOTHY_LIMIT_MAX_PROCESSES,
      defaultProcesses: Math.max(MIN_PROCESSES, Math.min(e.BOTHY_DEFAULT_MAX_PROCESSES, e.BOTHY_LIMIT_MAX_PROCESSES)),
      maxSandboxes: e.BOTHY_MAX_SANDBOXES,
    },
    poolSize: e.BOTHY_POOL_SIZE,
    poolShapes: poolShapes(e.BOTHY_POOL_SHAPES, e.BOTHY_MAX_VCPU, e.BOTHY_MAX_MEMORY_MIB),
    logLevel: e.BOTHY_LOG_LEVEL,
    bootTimeoutMs: e.BOTHY_BOOT_TIMEOUT_S * 1000,
    bodyLimitBytes: 1024 * 1024,
    previewDomain: e.BOTHY_PREVIEW_DOMAIN,
    driver: e.BOTHY_DRIVER,
    hostLimits: e.BOTHY_HOST_LIMITS,
    gvisor: {
      runsc: e.BOTHY_RUNSC,
      platform: e.BOTHY_RUNSC_PLATFORM,
      agentNode: agentNode(e.BOTHY_AGENT_NODE),
      agentStart: e.BOTHY_AGENT_START,
    },
    qemu: {
      warmStart: e.BOTHY_QEMU_WARM === "1",
      tbSizeMib: e.BOTHY_QEMU_TB_MIB,
      kernelDir: e.BOTHY_KERNEL_DIR ?? join(e.BOTHY_HOME, "kernel"),
    },
    webhook:
      e.BOTHY_WEBHOOK_URL === undefined
        ? undefined
        : { url: e.BOTHY_WEBHOOK_URL, retryBaseMs: e.BOTHY_WEBHOOK_RETRY_MS, secret: e.BOTHY_WEBHOOK_SECRET },
    approvals: { timeoutMs: e.BOTHY_APPROVAL_TIMEOUT_S * 1000 },
    vaultKeyFile: e.BOTHY_VAULT_KEY_FILE,
    commandReplayBytes: e.BOTHY_COMMAND_REPLAY_BYTES,
    eventRetention: e.BOTHY_EVENTS_RETENTION,
    metering: {
      intervalMs: e.BOTHY_METER_INTERVAL_S * 1000,
      budget: { vcpuHours: e.BOTHY_BUDGET_VCPU_HOURS, gibHours: e.BOTHY_BUDGET_GIB_HOURS },
      budgetAction: e.BOTHY_BUDGET_ACTION,
    },
    auth: { mode: e.BOTHY_AUTH, adminKey: e.BOTHY_ADMIN_KEY },
    tls: e.BOTHY_TLS_CERT && e.BOTHY_TLS_KEY ? { cert: e.BOTHY_TLS_CERT, key: e.BOTHY_TLS_KEY } : undefined,
    insecureHttp: e.BOTHY_INSECURE_HTTP === "1",
    lifecycle: {
      defaultTimeoutS: e.BOTHY_DEFAULT_TIMEOUT_S,
      maxTimeoutS: e.BOTHY_MAX_TIMEOUT_S,
      sleepRetentionS: e.BOTHY_SLEEP_RETENTION_S,
      disconnectGraceS: e.BOTHY_DISCONNECT_GRACE_S,
      sweepIntervalMs: e.BOTHY_SWEEP_INTERVAL_S * 1000,
      idleTimeoutMs: e.BOTHY_IDLE_TIMEOUT_S * 1000,
    },
    network: {
      enabled: e.BOTHY_NETWORK === "on",
      pool: e.BOTHY_NET_POOL,
      uplink: e.BOTHY_UPLINK,
      dns: list(e.BOTHY_DNS),
      extraBlocked: list(e.BOTHY_NET_BLOCK),
      allowOutPermit: list(e.BOTHY_ALLOW_OUT_PERMIT),
    },
    cluster: clusterConfig(e),
    ...overrides,
  };
}

function clusterConfig(e: z.infer<typeof envSchema>): ClusterConfig | undefined {
  if (e.BOTHY_DATABASE_URL === undefined || e.BOTHY_DATABASE_URL === "") {
    if (e.BOTHY_NODE_URL !== undefined || e.BOTHY_NODE_ID !== undefined || e.BOTHY_CLUSTER_SECRET_FILE !== undefined)
      throw new Error(
        "Invalid configuration: BOTHY_NODE_URL, BOTHY_NODE_ID and BOTHY_CLUSTER_SECRET_FILE are for several machines and need BOTHY_DATABASE_URL (their shared PostgreSQL); unset them for one machine.",
      );
    return undefined;
  }
  if (e.BOTHY_NODE_URL === undefined)
    throw new Error(
      "Invalid configuration: BOTHY_DATABASE_URL is set (several machines), so BOTHY_NODE_URL must be too: the URL the other nodes reach this one at, e.g. http://10.0.0.11:8080.",
    );
  return {
    databaseUrl: e.BOTHY_DATABASE_URL,
    nodeUrl: e.BOTHY_NODE_URL,
    nodeId: e.BOTHY_NODE_ID,
    leaseMs: e.BOTHY_NODE_LEASE_S * 1000,
    secretFile: e.BOTHY_CLUSTER_SECRET_FILE,
  };
}

/**
 * BOTHY_AGENT_NODE's file: with `host`, this process's Node when it can run in a sandbox on its
 * own (not linked to a shared libnode the template lacks) and has a startup snapshot (else it
 * would be no faster than the template's).
 */
function agentNode(choice: string): string | undefined {
  if (choice === "template") return undefined;
  if (choice !== "host") return choice;
  const v = process.config.variables as Record<string, unknown>;
  if (v["node_shared"] === true || v["node_use_node_snapshot"] !== true) return undefined;
  return realpathSync(process.execPath);
}

/**
 * BOTHY_POOL_SHAPES: `TEMPLATE:VCPU:MEMORY_MIB[:DRIVER]`, comma-separated, at most MAX_POOL_SHAPES;
 * unset: the one shape a create gets when it names nothing (the protocol's defaults).
 */
function poolShapes(text: string | undefined, maxVcpu: number, maxMemoryMib: number): PoolShapeConfig[] {
  if (text === undefined) {
    const d = createSandboxRequest.parse({});
    return [{ template: d.template, vcpu: d.vcpu, memoryMib: d.memory_mib, driver: undefined }];
  }
  const bad = (why: string): never => {
    throw new Error(`Invalid configuration: BOTHY_POOL_SHAPES: ${why}; e.g. seed:1:512,code-interpreter:2:1024:gvisor`);
  };
  const shapes = list(text).map((item): PoolShapeConfig => {
    const [template = "", vcpu = "", memory = "", driver, ...rest] = item.split(":");
    if (!TEMPLATE_NAME_RE.test(template) || rest.length > 0) bad(`"${item}" is not TEMPLATE:VCPU:MEMORY_MIB[:DRIVER]`);
    const v = Number(vcpu);
    const m = Number(memory);
    if (!Number.isInteger(v) || v < 1 || v > maxVcpu) bad(`"${item}": vcpu must be 1 to ${maxVcpu} (BOTHY_MAX_VCPU)`);
    if (!Number.isInteger(m) || m < 128 || m > maxMemoryMib)
      bad(`"${item}": memory must be 128 to ${maxMemoryMib} MiB (BOTHY_MAX_MEMORY_MIB)`);
    if (driver !== undefined && !(DRIVER_NAMES as readonly string[]).includes(driver))
      bad(`"${item}": the driver is one of ${DRIVER_NAMES.join(", ")}`);
    return { template, vcpu: v, memoryMib: m, driver: driver as DriverName | undefined };
  });
  if (shapes.length > MAX_POOL_SHAPES) bad(`at most ${MAX_POOL_SHAPES} shapes`);
  return shapes;
}
