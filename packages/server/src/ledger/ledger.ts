import Database from "better-sqlite3";
import type { NetworkPolicy, SandboxInfo } from "@bothy/protocol";
import { ApprovalQueries, type ApprovalRows } from "./approval-rows.ts";
import { AuthQueries, type AuthRows } from "./auth-rows.ts";
import { CommandQueries } from "./command-rows.ts";
import { translateMigration } from "./dialect.ts";
import { E2bQueries, type E2bRows } from "./e2b-rows.ts";
import { EventQueries, type EventRows } from "./event-rows.ts";
import { LifecycleQueries, type LifecycleRows } from "./lifecycle-rows.ts";
import { MIGRATIONS } from "./migrations.ts";
import { SandboxQueries, type SandboxRow } from "./sandbox-rows.ts";
import { SecretQueries, type SecretRows } from "./secret-rows.ts";
import { SessionQueries, type SessionRows } from "./session-rows.ts";
import { bindSteps, type Step, type Synced } from "./sql-step.ts";
import { SqliteRunner } from "./sqlite-runner.ts";
import { UsageQueries } from "./usage-rows.ts";
import { VolumeQueries, type VolumeRows } from "./volume-rows.ts";
import { SnapshotQueries, type SnapshotRows } from "./snapshot-rows.ts";

export { MIGRATIONS } from "./migrations.ts";
export { DEFAULT_TENANT, type SandboxRow } from "./sandbox-rows.ts";
export type { CommandRow } from "./command-rows.ts";
export type { EventRow } from "./event-rows.ts";

/** The ledger's top level: sandboxes, commands, usage, and the event log's append and reads. */
export type LedgerTop = Synced<SandboxQueries> &
  Synced<CommandQueries> &
  Synced<UsageQueries> &
  Pick<Synced<EventQueries>, "insertEvent" | "eventsSince" | "sandboxEvents">;

/**
 * Gives `Ledger` the top level's methods as members: they are made from the rows classes at
 * construction (`bindSteps`), so the class names them only through its base's type.
 */
const TopLevel = class {} as new () => LedgerTop;

/**
 * The record of what exists, on SQLite, as the server's synchronous callers use it. Every write
 * about sandboxes is durable before it returns (synchronous=FULL); command records, events and a
 * key's last use are written relaxed (synchronous=NORMAL: a crash of bothy itself loses none of
 * them, the WAL holds them; a crash of the host's kernel or a power cut may lose the last few,
 * which the next durable write would have carried to the disk with it).
 */
export class Ledger extends TopLevel {
  private readonly db: Database.Database;
  /** The only path from the rows to the database: compiles each statement once. */
  private readonly runner: SqliteRunner;
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
  /** Snapshots and the sandboxes started from them. */
  readonly snapshots: SnapshotRows;
  /** Lifecycles beyond the defaults: sleep at the timeout, wake only on resume. */
  readonly lifecycle: LifecycleRows;

  constructor(path: string) {
    super();
    this.db = openSqlite(path);
    migrateSqlite(this.db);
    this.runner = new SqliteRunner(this.db);
    const sync = <T>(rows: object): Synced<T> =>
      bindSteps<Synced<T>>(rows, (step: Step<unknown>) => this.runner.run(step));
    const events = sync<EventQueries>(new EventQueries());
    Object.assign(
      this,
      sync<SandboxQueries>(new SandboxQueries()),
      sync<CommandQueries>(new CommandQueries()),
      sync<UsageQueries>(new UsageQueries()),
      { insertEvent: events.insertEvent, eventsSince: events.eventsSince, sandboxEvents: events.sandboxEvents },
    );
    this.events = events;
    this.auth = sync<AuthQueries>(new AuthQueries());
    this.secrets = sync<SecretQueries>(new SecretQueries());
    this.e2b = sync<E2bQueries>(new E2bQueries());
    this.approvals = sync<ApprovalQueries>(new ApprovalQueries());
    this.sessions = sync<SessionQueries>(new SessionQueries());
    this.volumes = sync<VolumeQueries>(new VolumeQueries());
    this.snapshots = sync<SnapshotQueries>(new SnapshotQueries());
    this.lifecycle = sync<LifecycleQueries>(new LifecycleQueries());
  }

  close(): void {
    this.db.close();
  }
}

/** A SQLite ledger file as both SQLite stores use it: WAL, durable writes, foreign keys enforced. */
export function openSqlite(path: string): Database.Database {
  const db = new Database(path);
  db.pragma("journal_mode = WAL");
  db.pragma("synchronous = FULL");
  db.pragma("foreign_keys = ON");
  db.pragma("busy_timeout = 5000");
  return db;
}

/** Runs the migrations a SQLite ledger lacks, each in its own transaction; `PRAGMA user_version` counts them. */
export function migrateSqlite(db: Database.Database): void {
  const version = db.pragma("user_version", { simple: true }) as number;
  for (let i = version; i < MIGRATIONS.length; i++) {
    db.transaction(() => {
      db.exec(translateMigration(MIGRATIONS[i] ?? "", "sqlite"));
      db.pragma(`user_version = ${i + 1}`);
    })();
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
