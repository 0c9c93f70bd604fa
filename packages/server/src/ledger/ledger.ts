import Database from "better-sqlite3";
import { BothyError, type NetworkPolicy, type SandboxInfo, type SandboxState } from "@bothy/protocol";
import { ApprovalRows } from "./approval-rows.ts";
import { AuthRows } from "./auth-rows.ts";
import { E2bRows } from "./e2b-rows.ts";
import { EventRows } from "./event-rows.ts";
import { SecretRows } from "./secret-rows.ts";
import { SessionRows } from "./session-rows.ts";
import { StatementCache } from "./statement-cache.ts";
import { VolumeRows } from "./volume-rows.ts";
import { canTransition, INITIAL_STATES, sqlStates, TransitionError } from "../sandboxes/lifecycle.ts";

/** Schema steps in order; `PRAGMA user_version` records how many have run. */
export const MIGRATIONS = [
  `CREATE TABLE sandboxes (
     id TEXT PRIMARY KEY,
     template TEXT NOT NULL,
     template_hash TEXT NOT NULL,
     driver TEXT NOT NULL,
     vcpu INTEGER NOT NULL,
     memory_mib INTEGER NOT NULL,
     state TEXT NOT NULL,
     created_at TEXT NOT NULL,
     updated_at TEXT NOT NULL,
     deleted_at TEXT,
     error TEXT
   );
   CREATE INDEX sandboxes_state ON sandboxes(state);
   CREATE TABLE commands (
     id TEXT PRIMARY KEY,
     sandbox_id TEXT NOT NULL REFERENCES sandboxes(id),
     cmd TEXT NOT NULL,
     state TEXT NOT NULL,
     exit_code INTEGER,
     signal TEXT,
     started_at TEXT NOT NULL,
     ended_at TEXT
   );
   CREATE INDEX commands_sandbox ON commands(sandbox_id);
   CREATE TABLE idempotency_keys (
     key TEXT PRIMARY KEY,
     fingerprint TEXT NOT NULL,
     sandbox_id TEXT NOT NULL REFERENCES sandboxes(id),
     created_at TEXT NOT NULL
   );`,
  `ALTER TABLE commands ADD COLUMN background INTEGER NOT NULL DEFAULT 0;
   ALTER TABLE commands ADD COLUMN timed_out INTEGER NOT NULL DEFAULT 0;
   CREATE TABLE events (
     seq INTEGER PRIMARY KEY AUTOINCREMENT,
     type TEXT NOT NULL,
     sandbox_id TEXT,
     data TEXT NOT NULL,
     created_at TEXT NOT NULL
   );
   CREATE INDEX events_sandbox ON events(sandbox_id, seq);`,
  // 3: which acceleration a sandbox's driver used (ptrace, kvm, tcg); rows before it have none.
  `ALTER TABLE sandboxes ADD COLUMN acceleration TEXT;`,
  // 4: lifetime: when the sweeper deletes it, and whether a dropped client deletes it sooner.
  `ALTER TABLE sandboxes ADD COLUMN expires_at TEXT;
   ALTER TABLE sandboxes ADD COLUMN delete_on_disconnect INTEGER NOT NULL DEFAULT 0;
   ALTER TABLE sandboxes ADD COLUMN disconnect_grace_s INTEGER;
   CREATE INDEX sandboxes_expires ON sandboxes(expires_at) WHERE expires_at IS NOT NULL;`,
  // 5: the sandbox's effective network policy (JSON of protocol's networkPolicy); null before it.
  `ALTER TABLE sandboxes ADD COLUMN network TEXT;`,
  `ALTER TABLE sandboxes ADD COLUMN metadata TEXT;`,
  `CREATE TABLE usage_sandbox (
     sandbox_id TEXT PRIMARY KEY,
     owner TEXT NOT NULL,
     vcpu_seconds REAL NOT NULL DEFAULT 0,
     gib_seconds REAL NOT NULL DEFAULT 0
   );
   CREATE TABLE usage_owner (
     owner TEXT NOT NULL,
     month TEXT NOT NULL,
     vcpu_seconds REAL NOT NULL DEFAULT 0,
     gib_seconds REAL NOT NULL DEFAULT 0,
     warned TEXT NOT NULL DEFAULT '',
     PRIMARY KEY (owner, month)
   );`,
  // 8: the sandbox's disk size in MiB; null before it.
  `ALTER TABLE sandboxes ADD COLUMN disk_mib INTEGER;`,
  // 9: the most processes its commands may run; null before it.
  `ALTER TABLE sandboxes ADD COLUMN max_processes INTEGER;`,
  // 10: tenants and their API keys; every row before it belongs to the `default` tenant.
  `CREATE TABLE tenants (
     id TEXT PRIMARY KEY,
     quota TEXT NOT NULL DEFAULT '{}',
     created_at TEXT NOT NULL
   );
   INSERT INTO tenants (id, created_at) VALUES ('default', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'));
   CREATE TABLE api_keys (
     id TEXT PRIMARY KEY,
     tenant TEXT NOT NULL REFERENCES tenants(id),
     name TEXT NOT NULL,
     digest TEXT NOT NULL UNIQUE,
     prefix TEXT NOT NULL,
     last4 TEXT NOT NULL,
     scopes TEXT NOT NULL,
     created_at TEXT NOT NULL,
     expires_at TEXT,
     revoked_at TEXT,
     last_used_at TEXT
   );
   ALTER TABLE sandboxes ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
   CREATE INDEX sandboxes_tenant ON sandboxes(tenant, state);
   ALTER TABLE commands ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
   ALTER TABLE events ADD COLUMN tenant TEXT;
   UPDATE events SET tenant = 'default';
   ALTER TABLE usage_sandbox ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
   CREATE TABLE idempotency_keys_by_tenant (
     tenant TEXT NOT NULL,
     key TEXT NOT NULL,
     fingerprint TEXT NOT NULL,
     sandbox_id TEXT NOT NULL REFERENCES sandboxes(id),
     created_at TEXT NOT NULL,
     PRIMARY KEY (tenant, key)
   );
   INSERT INTO idempotency_keys_by_tenant SELECT 'default', key, fingerprint, sandbox_id, created_at FROM idempotency_keys;
   DROP TABLE idempotency_keys;
   ALTER TABLE idempotency_keys_by_tenant RENAME TO idempotency_keys;`,
  // 11: the egress gateway. Host policies (a tenant's default; a sandbox's own as asked for, with
  // the secrets it names), the vault (values sealed with AES-256-GCM, never stored in clear), each
  // sandbox's placeholders, and approvals.
  `ALTER TABLE tenants ADD COLUMN policy TEXT;
   ALTER TABLE sandboxes ADD COLUMN policy TEXT;
   CREATE TABLE secrets (
     tenant TEXT NOT NULL REFERENCES tenants(id),
     name TEXT NOT NULL,
     sealed BLOB NOT NULL,
     hosts TEXT NOT NULL,
     inject TEXT,
     created_at TEXT NOT NULL,
     updated_at TEXT NOT NULL,
     PRIMARY KEY (tenant, name)
   );
   CREATE TABLE sandbox_secrets (
     sandbox_id TEXT NOT NULL REFERENCES sandboxes(id),
     name TEXT NOT NULL,
     env TEXT NOT NULL,
     placeholder TEXT NOT NULL UNIQUE,
     PRIMARY KEY (sandbox_id, name)
   );
   CREATE TABLE approvals (
     id TEXT PRIMARY KEY,
     tenant TEXT NOT NULL,
     sandbox_id TEXT NOT NULL,
     conversation_id TEXT,
     kind TEXT NOT NULL,
     method TEXT,
     host TEXT,
     path TEXT,
     tool TEXT,
     excerpt TEXT NOT NULL,
     rule TEXT NOT NULL,
     state TEXT NOT NULL,
     created_at TEXT NOT NULL,
     expires_at TEXT NOT NULL,
     decided_at TEXT,
     decided_by TEXT,
     grant_kind TEXT,
     grant_until TEXT,
     reason TEXT
   );
   CREATE INDEX approvals_tenant ON approvals(tenant, state, created_at);
   CREATE INDEX approvals_sandbox ON approvals(sandbox_id, state);`,
  // 12: a tenant's events as one range, so its replay pages through its own rows only.
  `CREATE INDEX events_tenant ON events(tenant, seq);`,
  // 13: what the E2B surface keeps per sandbox beyond bothy's own rows, so a restart keeps it: the
  // create's envVars (sealed with the vault's key) and which bothy command each guest pid is.
  `CREATE TABLE e2b_envs (
     sandbox_id TEXT PRIMARY KEY REFERENCES sandboxes(id),
     sealed BLOB NOT NULL
   );
   CREATE TABLE e2b_processes (
     sandbox_id TEXT NOT NULL REFERENCES sandboxes(id),
     pid INTEGER NOT NULL,
     command_id TEXT NOT NULL,
     config TEXT NOT NULL,
     pty INTEGER NOT NULL,
     tag TEXT,
     signalled TEXT,
     PRIMARY KEY (sandbox_id, pid)
   );`,
  // 14: the dashboard's sign-in sessions (auth/ui-sessions.ts): only a digest of each session id,
  // with the key it acts as; a revoked key's sessions are refused by the key's own row.
  `CREATE TABLE ui_sessions (
     digest TEXT PRIMARY KEY,
     key_id TEXT NOT NULL REFERENCES api_keys(id),
     created_at TEXT NOT NULL,
     expires_at TEXT NOT NULL
   );
   CREATE INDEX ui_sessions_key ON ui_sessions(key_id);`,
  // 15: volumes (an ext4 image each, under $BOTHY_HOME/volumes/<id>/) and which sandbox mounts which
  // where, so a restarted server mounts them again; a claim counts while its sandbox's row is live.
  `CREATE TABLE volumes (
     id TEXT PRIMARY KEY,
     tenant TEXT NOT NULL,
     name TEXT NOT NULL,
     size_mib INTEGER NOT NULL,
     created_at TEXT NOT NULL,
     UNIQUE (tenant, name)
   );
   CREATE TABLE sandbox_volumes (
     sandbox_id TEXT NOT NULL REFERENCES sandboxes(id),
     volume_id TEXT NOT NULL REFERENCES volumes(id),
     path TEXT NOT NULL,
     read_only INTEGER NOT NULL,
     PRIMARY KEY (sandbox_id, volume_id)
   );
   CREATE INDEX sandbox_volumes_volume ON sandbox_volumes(volume_id);`,
];

/** The tenant every row made before tenants existed belongs to, and the bootstrap key's. */
export const DEFAULT_TENANT = "default";

export interface SandboxRow {
  id: string;
  template: string;
  template_hash: string;
  driver: string;
  acceleration: string | null;
  vcpu: number;
  memory_mib: number;
  disk_mib: number | null;
  max_processes: number | null;
  state: SandboxState;
  created_at: string;
  updated_at: string;
  deleted_at: string | null;
  error: string | null;
  expires_at: string | null;
  delete_on_disconnect: number;
  disconnect_grace_s: number | null;
  network: string | null;
  /** JSON of what the create asked of the gateway (gateway/policies.ts SandboxPolicyRecord); null: nothing. */
  policy: string | null;
  /** JSON object of the caller's labels. */
  metadata: string | null;
  tenant: string;
}

/** What a new sandbox's row holds where its create says nothing. */
const SANDBOX_DEFAULTS = {
  expires_at: null,
  delete_on_disconnect: 0,
  disconnect_grace_s: null,
  network: null,
  metadata: null,
  disk_mib: null,
  max_processes: null,
  tenant: DEFAULT_TENANT,
  policy: null,
} satisfies Partial<SandboxRow>;

export interface CommandRow {
  id: string;
  sandbox_id: string;
  cmd: string;
  state: "running" | "exited" | "lost";
  exit_code: number | null;
  signal: string | null;
  started_at: string;
  ended_at: string | null;
  background: number;
  timed_out: number;
}

export interface EventRow {
  seq: number;
  type: string;
  sandbox_id: string | null;
  /** Null: a host-wide event, seen by admin keys only. */
  tenant: string | null;
  data: string;
  created_at: string;
}

const now = (): string => new Date().toISOString();

/**
 * The record of what exists. Every write about sandboxes is durable before it returns
 * (synchronous=FULL); command records and events are written relaxed (see `relaxed`).
 */
export class Ledger {
  private readonly db: Database.Database;
  /** Statements of the per-command paths, compiled once. */
  private readonly statements: StatementCache;
  /** Tenants and API keys. */
  readonly auth: AuthRows;
  /** The vault's sealed secrets and the sandboxes' placeholders. */
  readonly secrets: SecretRows;
  /** The E2B surface's envVars and pid map. */
  readonly e2b: E2bRows;
  /** Approvals of the egress gateway and the agent tools. */
  readonly approvals: ApprovalRows;
  /** Events as replays page them and the sweeper prunes them (appended by `insertEvent`). */
  readonly events: EventRows;
  /** The dashboard's sign-in sessions. */
  readonly sessions: SessionRows;
  /** Volumes and the sandboxes' claims on them. */
  readonly volumes: VolumeRows;

  constructor(path: string) {
    this.db = new Database(path);
    this.db.pragma("journal_mode = WAL");
    this.db.pragma("synchronous = FULL");
    this.db.pragma("foreign_keys = ON");
    this.db.pragma("busy_timeout = 5000");
    this.migrate();
    this.statements = new StatementCache(this.db);
    this.auth = new AuthRows(this.db);
    this.secrets = new SecretRows(this.db);
    this.e2b = new E2bRows(this.db);
    this.approvals = new ApprovalRows(this.db);
    this.events = new EventRows(this.db);
    this.sessions = new SessionRows(this.db);
    this.volumes = new VolumeRows(this.db);
  }

  private migrate(): void {
    const version = this.db.pragma("user_version", { simple: true }) as number;
    for (let i = version; i < MIGRATIONS.length; i++) {
      this.db.transaction(() => {
        this.db.exec(MIGRATIONS[i] ?? "");
        this.db.pragma(`user_version = ${i + 1}`);
      })();
    }
  }

  close(): void {
    this.db.close();
  }

  insertSandbox(
    row: Omit<SandboxRow, keyof typeof SANDBOX_DEFAULTS | "created_at" | "updated_at" | "deleted_at" | "error"> &
      Partial<Pick<SandboxRow, keyof typeof SANDBOX_DEFAULTS>>,
    idempotency?: { key: string; fingerprint: string },
  ): SandboxRow {
    if (!INITIAL_STATES.includes(row.state))
      throw new BothyError("internal", `A sandbox's row starts as creating or running, not ${row.state}.`);
    const t = now();
    const full: SandboxRow = {
      ...SANDBOX_DEFAULTS,
      ...row,
      created_at: t,
      updated_at: t,
      deleted_at: null,
      error: null,
    };
    this.db.transaction(() => {
      this.db
        .prepare(
          `INSERT INTO sandboxes (id, template, template_hash, driver, acceleration, vcpu, memory_mib, disk_mib, max_processes, state, created_at, updated_at, deleted_at, error, expires_at, delete_on_disconnect, disconnect_grace_s, network, metadata, tenant, policy)
           VALUES (@id, @template, @template_hash, @driver, @acceleration, @vcpu, @memory_mib, @disk_mib, @max_processes, @state, @created_at, @updated_at, @deleted_at, @error, @expires_at, @delete_on_disconnect, @disconnect_grace_s, @network, @metadata, @tenant, @policy)`,
        )
        .run(full);
      if (idempotency) {
        this.db
          .prepare(
            `INSERT INTO idempotency_keys (tenant, key, fingerprint, sandbox_id, created_at) VALUES (?, ?, ?, ?, ?)`,
          )
          .run(full.tenant, idempotency.key, idempotency.fingerprint, row.id, t);
      }
    })();
    return full;
  }

  /**
   * Moves a sandbox from `from` to `to` if, and only if, it is in `from` now (compare-and-set) and
   * the lifecycle table allows the move; otherwise throws a TransitionError and changes nothing.
   * `reason` (why it stopped or failed) is kept as the row's error.
   */
  transition(id: string, from: SandboxState, to: SandboxState, reason?: string): void {
    if (!canTransition(from, to)) throw new TransitionError("illegal", id, from, to, this.getSandbox(id)?.state);
    const t = now();
    const changed = this.db
      .prepare(
        `UPDATE sandboxes SET state = ?, updated_at = ?, error = COALESCE(?, error), deleted_at = CASE WHEN ? = 'deleted' THEN ? ELSE deleted_at END WHERE id = ? AND state = ?`,
      )
      .run(to, t, reason ?? null, to, t, id, from).changes;
    if (changed !== 1) throw new TransitionError("stale", id, from, to, this.getSandbox(id)?.state);
  }

  private cached(sql: string): Database.Statement {
    return this.statements.get(sql);
  }

  getSandbox(id: string): SandboxRow | undefined {
    return this.cached(`SELECT * FROM sandboxes WHERE id = ?`).get(id) as SandboxRow | undefined;
  }

  listSandboxes(options: { includeDeleted?: boolean } = {}): SandboxRow[] {
    const sql = options.includeDeleted
      ? `SELECT * FROM sandboxes ORDER BY created_at`
      : `SELECT * FROM sandboxes WHERE state NOT IN (${sqlStates("final")}) ORDER BY created_at`;
    return this.db.prepare(sql).all() as SandboxRow[];
  }

  liveSandboxes(): SandboxRow[] {
    return this.cached(`SELECT * FROM sandboxes WHERE state IN (${sqlStates("live")})`).all() as SandboxRow[];
  }

  setExpiresAt(id: string, expiresAt: string): void {
    this.db.prepare(`UPDATE sandboxes SET expires_at = ?, updated_at = ? WHERE id = ?`).run(expiresAt, now(), id);
  }

  /**
   * Sandboxes whose time ran out at `at` (an ISO time; ISO times of one format sort as text), asleep
   * or not: a `stopped` or `paused` one keeps its disk until it expires, as a running one keeps
   * its VM. Rows already `deleting` are the delete's own to finish.
   */
  expiredSandboxes(at: string): SandboxRow[] {
    return this.cached(`SELECT * FROM sandboxes WHERE expires_at <= ? AND state IN (${sqlStates("expirable")})`).all(
      at,
    ) as SandboxRow[];
  }

  countByStateAndDriver(): Array<{ state: string; driver: string; n: number }> {
    return this.db.prepare(`SELECT state, driver, COUNT(*) AS n FROM sandboxes GROUP BY state, driver`).all() as Array<{
      state: string;
      driver: string;
      n: number;
    }>;
  }

  countByState(): Record<string, number> {
    const rows = this.db.prepare(`SELECT state, COUNT(*) AS n FROM sandboxes GROUP BY state`).all() as Array<{
      state: string;
      n: number;
    }>;
    return Object.fromEntries(rows.map((r) => [r.state, r.n]));
  }

  findIdempotencyKey(tenant: string, key: string): { fingerprint: string; sandbox_id: string } | undefined {
    return this.db
      .prepare(`SELECT fingerprint, sandbox_id FROM idempotency_keys WHERE tenant = ? AND key = ?`)
      .get(tenant, key) as { fingerprint: string; sandbox_id: string } | undefined;
  }

  /** A failed create frees its key, so the client may retry with the same one. */
  forgetIdempotencyKey(tenant: string, key: string): void {
    this.db.prepare(`DELETE FROM idempotency_keys WHERE tenant = ? AND key = ?`).run(tenant, key);
  }

  /** The keys of a create the server did not live to finish: a retry with the same key makes a new sandbox. */
  forgetIdempotencyKeysOf(sandboxId: string): void {
    this.db.prepare(`DELETE FROM idempotency_keys WHERE sandbox_id = ?`).run(sandboxId);
  }

  /**
   * Runs writes that are committed without waiting for the disk (synchronous=NORMAL): a command's
   * record and an event are written several times per command, and an fsync each cost the API
   * milliseconds of its event loop per command. A crash of bothy itself loses none of them (the
   * WAL holds them); a crash of the host's kernel or a power cut may lose the last few, which the
   * next durable write would have carried to the disk with it.
   */
  private relaxed<T>(write: () => T): T {
    // Prepared once, like the writes they wrap (`db.pragma` compiles its statement at every call).
    this.cached("PRAGMA synchronous = NORMAL").run();
    try {
      return write();
    } finally {
      this.cached("PRAGMA synchronous = FULL").run();
    }
  }

  insertCommand(row: { id: string; sandbox_id: string; cmd: string; background?: boolean }): void {
    this.relaxed(() =>
      this.cached(
        `INSERT INTO commands (id, sandbox_id, cmd, state, started_at, background, tenant)
           VALUES (?, ?, ?, 'running', ?, ?, (SELECT tenant FROM sandboxes WHERE id = ?))`,
      ).run(row.id, row.sandbox_id, row.cmd, now(), row.background ? 1 : 0, row.sandbox_id),
    );
  }

  /** Records a command's end; returns its record, or undefined when it has none (it never started). */
  finishCommand(
    id: string,
    result: { state: "exited" | "lost"; exit_code: number | null; signal: string | null; timed_out?: boolean },
  ): CommandRow | undefined {
    return this.relaxed(
      () =>
        this.cached(
          `UPDATE commands SET state = ?, exit_code = ?, signal = ?, timed_out = ?, ended_at = ? WHERE id = ? RETURNING *`,
        ).get(result.state, result.exit_code, result.signal, result.timed_out ? 1 : 0, now(), id) as
          CommandRow | undefined,
    );
  }

  listCommands(sandboxId: string): CommandRow[] {
    return this.db
      .prepare(`SELECT * FROM commands WHERE sandbox_id = ? ORDER BY started_at, rowid`)
      .all(sandboxId) as CommandRow[];
  }

  /**
   * Appends an event and returns its sequence number (the SSE event id). Its tenant is its
   * sandbox's, or `tenant` for one about a tenant as a whole; else it is host-wide.
   */
  insertEvent(type: string, sandboxId: string | null, data: object, tenant?: string): EventRow {
    const created_at = now();
    const json = JSON.stringify(data);
    // The sandbox's tenant is looked up in the insert itself (no row read and copied for one field).
    const row = this.relaxed(
      () =>
        this.cached(
          `INSERT INTO events (type, sandbox_id, data, created_at, tenant)
             VALUES (?, ?, ?, ?, COALESCE(?, (SELECT tenant FROM sandboxes WHERE id = ?))) RETURNING seq, tenant`,
        ).get(type, sandboxId, json, created_at, tenant ?? null, sandboxId) as { seq: number; tenant: string | null },
    );
    return { seq: row.seq, type, sandbox_id: sandboxId, tenant: row.tenant, data: json, created_at };
  }

  eventsSince(seq: number, sandboxId?: string, limit = 1000): EventRow[] {
    return sandboxId === undefined
      ? (this.db.prepare(`SELECT * FROM events WHERE seq > ? ORDER BY seq LIMIT ?`).all(seq, limit) as EventRow[])
      : (this.db
          .prepare(`SELECT * FROM events WHERE seq > ? AND sandbox_id = ? ORDER BY seq LIMIT ?`)
          .all(seq, sandboxId, limit) as EventRow[]);
  }

  /** A sandbox's events of these types after `seq`, oldest first (its audit: GET /sandboxes/{id}/audit). */
  sandboxEvents(sandboxId: string, types: readonly string[], seq: number, limit: number): EventRow[] {
    return this.db
      .prepare(
        `SELECT * FROM events WHERE sandbox_id = ? AND seq > ? AND type IN (${types.map(() => "?").join(",")}) ORDER BY seq LIMIT ?`,
      )
      .all(sandboxId, seq, ...types, limit) as EventRow[];
  }

  /** Commands still marked running in a sandbox that has gone away did not finish. */
  loseCommands(sandboxId: string): void {
    this.db
      .prepare(`UPDATE commands SET state = 'lost', ended_at = ? WHERE sandbox_id = ? AND state = 'running'`)
      .run(now(), sandboxId);
  }

  getCommand(id: string): CommandRow | undefined {
    return this.cached(`SELECT * FROM commands WHERE id = ?`).get(id) as CommandRow | undefined;
  }

  /** Adds metered usage: per sandbox, and per owner and month, in one transaction. */
  addUsage(
    entries: ReadonlyArray<{
      sandboxId: string;
      owner: string;
      month: string;
      vcpuSeconds: number;
      gibSeconds: number;
    }>,
  ): void {
    const perSandbox = this.db.prepare(
      `INSERT INTO usage_sandbox (sandbox_id, owner, vcpu_seconds, gib_seconds) VALUES (@sandboxId, @owner, @vcpuSeconds, @gibSeconds)
       ON CONFLICT(sandbox_id) DO UPDATE SET vcpu_seconds = vcpu_seconds + excluded.vcpu_seconds, gib_seconds = gib_seconds + excluded.gib_seconds`,
    );
    const perOwner = this.db.prepare(
      `INSERT INTO usage_owner (owner, month, vcpu_seconds, gib_seconds) VALUES (@owner, @month, @vcpuSeconds, @gibSeconds)
       ON CONFLICT(owner, month) DO UPDATE SET vcpu_seconds = vcpu_seconds + excluded.vcpu_seconds, gib_seconds = gib_seconds + excluded.gib_seconds`,
    );
    this.db.transaction(() => {
      for (const e of entries) {
        perSandbox.run(e);
        perOwner.run(e);
      }
    })();
  }

  ownerUsage(
    month: string,
  ): Array<{ owner: string; month: string; vcpu_seconds: number; gib_seconds: number; warned: string }> {
    return this.db.prepare(`SELECT * FROM usage_owner WHERE month = ? ORDER BY owner`).all(month) as Array<{
      owner: string;
      month: string;
      vcpu_seconds: number;
      gib_seconds: number;
      warned: string;
    }>;
  }

  sandboxUsage(sandboxId: string): { vcpu_seconds: number; gib_seconds: number } | undefined {
    return this.db
      .prepare(`SELECT vcpu_seconds, gib_seconds FROM usage_sandbox WHERE sandbox_id = ?`)
      .get(sandboxId) as { vcpu_seconds: number; gib_seconds: number } | undefined;
  }

  /** Records that an owner was warned about `kind` this month; false when it already was. */
  markWarned(owner: string, month: string, kind: string): boolean {
    const row = this.db.prepare(`SELECT warned FROM usage_owner WHERE owner = ? AND month = ?`).get(owner, month) as
      { warned: string } | undefined;
    const warned = new Set((row?.warned ?? "").split(",").filter(Boolean));
    if (warned.has(kind)) return false;
    warned.add(kind);
    this.db
      .prepare(`UPDATE usage_owner SET warned = ? WHERE owner = ? AND month = ?`)
      .run([...warned].join(","), owner, month);
    return true;
  }
}

export function toSandboxInfo(row: SandboxRow): SandboxInfo {
  return {
    sandbox_id: row.id,
    metadata: row.metadata === null ? {} : (JSON.parse(row.metadata) as Record<string, string>),
    state: row.state,
    template: row.template,
    driver: row.driver,
    acceleration: row.acceleration,
    vcpu: row.vcpu,
    memory_mib: row.memory_mib,
    disk_mib: row.disk_mib,
    max_processes: row.max_processes,
    created_at: row.created_at,
    deleted_at: row.deleted_at,
    expires_at: row.expires_at,
    delete_on_disconnect: row.delete_on_disconnect === 1,
    network: row.network === null ? null : (JSON.parse(row.network) as NetworkPolicy),
    error: row.error,
  };
}
