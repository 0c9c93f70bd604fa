import { ApprovalQueries } from "./approval-rows.ts";
import { AuthQueries } from "./auth-rows.ts";
import { ClusterLeaseQueries } from "./cluster-lease-rows.ts";
import { CommandQueries } from "./command-rows.ts";
import type { DialectName } from "./dialect.ts";
import { E2bQueries } from "./e2b-rows.ts";
import { EventQueries } from "./event-rows.ts";
import { LifecycleQueries } from "./lifecycle-rows.ts";
import { migrateSqlite, openSqlite } from "./ledger.ts";
import { NodeQueries } from "./node-rows.ts";
import { PgListener, type NotifyHandler } from "./pg-listener.ts";
import { PgRunner } from "./pg-runner.ts";
import { PlacementQueries } from "./placement-rows.ts";
import { SandboxQueries } from "./sandbox-rows.ts";
import { SecretQueries } from "./secret-rows.ts";
import { SessionQueries } from "./session-rows.ts";
import { SnapshotQueries } from "./snapshot-rows.ts";
import { bindSteps, transaction, type Asynced, type Step } from "./sql-step.ts";
import { SqliteRunner } from "./sqlite-runner.ts";
import { UsageQueries } from "./usage-rows.ts";
import { VolumeQueries } from "./volume-rows.ts";

/**
 * The ledger as an asynchronous interface, one for both stores: every method returns a Promise.
 * The same rows classes answer on either (sql-step.ts), so the stores share every query, the
 * migrations and the compare-and-set `transition`; what differs is written in dialect.ts.
 */
export type LedgerStore = Asynced<SandboxQueries> &
  Asynced<CommandQueries> &
  Asynced<UsageQueries> &
  Pick<Asynced<EventQueries>, "insertEvent" | "eventsSince" | "sandboxEvents"> & {
    readonly dialect: DialectName;
    readonly auth: Asynced<AuthQueries>;
    readonly secrets: Asynced<SecretQueries>;
    readonly e2b: Asynced<E2bQueries>;
    readonly approvals: Asynced<ApprovalQueries>;
    readonly events: Asynced<EventQueries>;
    readonly sessions: Asynced<SessionQueries>;
    readonly volumes: Asynced<VolumeQueries>;
    readonly snapshots: Asynced<SnapshotQueries>;
    readonly lifecycle: Asynced<LifecycleQueries>;
    /** Several machines (cluster/): the nodes, their leases, and sandboxes as readers see them. */
    readonly nodes: Asynced<NodeQueries>;
    readonly clusterLeases: Asynced<ClusterLeaseQueries>;
    /** Where a sandbox's requests go and where a create may go (cluster/request-router.ts). */
    readonly placement: Asynced<PlacementQueries>;
    /** Runs a piece of work made of the rows' steps as one transaction (all of it or none). */
    transaction<T>(body: () => Step<T>): Promise<T>;
    /**
     * Calls `handler` when another process on the database `notify`s `channel` (sql-step.ts), and
     * with `undefined` whenever notifications may have been missed; answers the function that stops
     * it. On SQLite, one process: never called (there is no other process to hear from).
     */
    listen(channel: string, handler: NotifyHandler): () => void;
    close(): Promise<void>;
  };

/** Where the ledger lives: PostgreSQL when `databaseUrl` is set (BOTHY_DATABASE_URL), else SQLite at `sqlitePath`. */
export interface StoreOptions {
  databaseUrl?: string;
  sqlitePath: string;
  /** The PostgreSQL pool's most connections. */
  poolSize?: number;
}

/** Opens the ledger's store and brings its schema up to date. */
export async function openStore(options: StoreOptions): Promise<LedgerStore> {
  if (options.databaseUrl !== undefined && options.databaseUrl !== "") {
    if (!/^postgres(ql)?:\/\//.test(options.databaseUrl))
      throw new Error("BOTHY_DATABASE_URL must be a postgres:// or postgresql:// URL (unset: the SQLite ledger).");
    const pool = PgRunner.pool(options.databaseUrl, options.poolSize);
    const runner = new PgRunner(pool);
    try {
      await runner.migrate();
    } catch (err) {
      await pool.end();
      throw new Error(
        `The ledger's PostgreSQL database (BOTHY_DATABASE_URL=${redacted(options.databaseUrl)}) could not be opened: ${(err as Error).message}. Check that the server runs and the URL's host, port, user and database are right, or unset BOTHY_DATABASE_URL for the SQLite ledger.`,
        { cause: err },
      );
    }
    const listener = new PgListener(options.databaseUrl);
    return build(
      "postgres",
      (step) => runner.run(step),
      async () => {
        await listener.close();
        await pool.end();
      },
      (channel, handler) => listener.listen(channel, handler),
    );
  }
  const db = openSqlite(options.sqlitePath);
  try {
    migrateSqlite(db);
  } catch (err) {
    db.close();
    throw err;
  }
  const runner = new SqliteRunner(db);
  // Each call runs to its end at once (SQLite is in-process and synchronous), so calls keep their
  // order and a transaction never interleaves with another.
  return build(
    "sqlite",
    (step) => new Promise((resolve) => resolve(runner.run(step))),
    async () => {
      db.close();
    },
    () => () => undefined,
  );
}

/** The URL with its password, if any, replaced: what an error may show of it. */
export function redacted(url: string): string {
  try {
    const parsed = new URL(url);
    if (parsed.password !== "") parsed.password = "***";
    return parsed.toString();
  } catch {
    return "(not a URL)";
  }
}

function build(
  dialect: DialectName,
  runner: (step: Step<unknown>) => Promise<unknown>,
  close: () => Promise<void>,
  listen: LedgerStore["listen"],
): LedgerStore {
  const bind = <T>(rows: object): Asynced<T> => bindSteps<Asynced<T>>(rows, runner);
  const events = bind<EventQueries>(new EventQueries());
  return {
    ...bind<SandboxQueries>(new SandboxQueries()),
    ...bind<CommandQueries>(new CommandQueries()),
    ...bind<UsageQueries>(new UsageQueries()),
    insertEvent: events.insertEvent,
    eventsSince: events.eventsSince,
    sandboxEvents: events.sandboxEvents,
    dialect,
    auth: bind<AuthQueries>(new AuthQueries()),
    secrets: bind<SecretQueries>(new SecretQueries()),
    e2b: bind<E2bQueries>(new E2bQueries()),
    approvals: bind<ApprovalQueries>(new ApprovalQueries()),
    events,
    sessions: bind<SessionQueries>(new SessionQueries()),
    volumes: bind<VolumeQueries>(new VolumeQueries()),
    snapshots: bind<SnapshotQueries>(new SnapshotQueries()),
    lifecycle: bind<LifecycleQueries>(new LifecycleQueries()),
    nodes: bind<NodeQueries>(new NodeQueries()),
    clusterLeases: bind<ClusterLeaseQueries>(new ClusterLeaseQueries()),
    placement: bind<PlacementQueries>(new PlacementQueries()),
    transaction: <T>(body: () => Step<T>) => runner(transaction(body)) as Promise<T>,
    listen,
    close,
  };
}
