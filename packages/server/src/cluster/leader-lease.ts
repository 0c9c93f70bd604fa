import { BothyError } from "@bothy/protocol";
import { EventEmitter } from "node:events";
import { ClusterLeaseQueries } from "../ledger/cluster-lease-rows.ts";
import type { Step } from "../ledger/sql-step.ts";
import type { LedgerStore } from "../ledger/store.ts";
import { messageOf, quiet, type ClusterLog } from "./cluster-log.ts";

const leases = new ClusterLeaseQueries();

/** What a job run gets: the epoch it runs in, and the way its writes are fenced by it. */
export interface JobContext {
  readonly epoch: number;
  /** Aborted once this process loses the lease: a long run should stop at its next step. */
  readonly signal: AbortSignal;
  /**
   * Runs `body` (the rows' steps) as one transaction that first checks this epoch still holds the
   * leader's lease; refused (`lease_lost`), writing nothing, once it lapsed or passed on.
   */
  fenced<T>(body: () => Step<T>): Promise<T>;
}

/** A periodic piece of the cluster's work that one node runs: the sweeper's, budgets, approval expiry, webhooks, usage roll-ups. */
export interface LeaderJob {
  name: string;
  intervalMs: number;
  run(ctx: JobContext): Promise<void>;
}

export interface LeaderLeaseOptions {
  store: LedgerStore;
  /** Who asks, for people reading `cluster_leases` (a node's id and its process). */
  holder: string;
  leaseMs: number;
  /** The lease's row; one per kind of work (default `leader`). */
  name?: string;
  log?: ClusterLog;
}

/**
 * One leader for the cluster, under a lease in PostgreSQL: a row of `cluster_leases` whose expiry is
 * the database's clock and whose epoch each new holder takes the next of (ledger/cluster-lease-rows.ts).
 * Every node runs one; the holder runs the registered jobs, the others try to take the lease three
 * times per lease, so one of them has it within one lease of the holder's death.
 *
 * Why a row and not a session advisory lock: an advisory lock lives as long as its connection, and
 * a leader cut off from the database by a network partition keeps its session (and the lock) until
 * TCP keepalives give up, by default two hours on Linux, so no one could take over within a lease;
 * nor does the cut-off leader learn that it lost the lock. A PostgreSQL restart drops every session
 * and lock at once, and the leader may not notice before it next uses its connection. A row survives
 * both: the restart keeps it (it is committed), the lease simply runs on the database's clock, and
 * a holder that was paused or cut off finds its epoch gone at its next renewal or fenced write,
 * checked in the same transaction as the write.
 */
export class LeaderLease extends EventEmitter<{ acquired: [epoch: number]; lost: [epoch: number] }> {
  private held: number | undefined;
  private aborts: AbortController | undefined;
  private readonly jobs = new Map<LeaderJob, { timer?: NodeJS.Timeout; running?: Promise<void> }>();
  private timer: NodeJS.Timeout | undefined;
  private tick: Promise<void> | undefined;
  private stopped = false;
  private readonly name: string;

  constructor(private readonly options: LeaderLeaseOptions) {
    super();
    this.name = options.name ?? "leader";
  }

  /** The epoch this process leads in; undefined while it does not lead. */
  get epoch(): number | undefined {
    return this.held;
  }

  private get log(): ClusterLog {
    return this.options.log ?? quiet;
  }

  private get tickMs(): number {
    return Math.max(50, Math.floor(this.options.leaseMs / 3));
  }

  /** Adds a job the leader runs every `intervalMs` (runs of one job never overlap); returns its removal. */
  register(job: LeaderJob): () => void {
    this.jobs.set(job, {});
    if (this.held !== undefined) this.scheduleJob(job);
    return () => {
      clearTimeout(this.jobs.get(job)?.timer);
      this.jobs.delete(job);
    };
  }

  /** Starts trying for the lease (at once, then three times per lease). */
  start(): void {
    this.tick = this.step().finally(() => this.schedule());
  }

  /** Stops the jobs (waiting for runs in progress) and hands the lease back at once. */
  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    await this.tick;
    const epoch = this.held;
    this.demote();
    await Promise.all([...this.jobs.values()].map((j) => j.running));
    if (epoch !== undefined) await this.options.store.clusterLeases.release(this.name, epoch).catch(() => false);
  }

  private schedule(): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => {
      this.tick = this.step().finally(() => this.schedule());
    }, this.tickMs);
    this.timer.unref();
  }

  private async step(): Promise<void> {
    const { store, holder, leaseMs } = this.options;
    try {
      if (this.held === undefined) {
        const got = await store.clusterLeases.acquire(this.name, holder, leaseMs);
        if (got === undefined || this.stopped) return;
        this.held = got.epoch;
        this.aborts = new AbortController();
        this.log("info", "leader_acquired", { lease: this.name, holder, epoch: got.epoch });
        this.emit("acquired", got.epoch);
        for (const job of this.jobs.keys()) this.scheduleJob(job);
        return;
      }
      const epoch = this.held;
      if ((await store.clusterLeases.renew(this.name, epoch, leaseMs)) === undefined && this.held === epoch) {
        this.demote();
        this.log("warn", "leader_lost", {
          lease: this.name,
          holder,
          epoch,
          why: "it lapsed (this process was paused or cut off from the database past the lease) or another node took it",
        });
        this.emit("lost", epoch);
      }
    } catch (err) {
      // The database did not answer: jobs keep their schedule, and each run's writes are fenced.
      this.log("warn", "leader_failed", { lease: this.name, holder, error: messageOf(err) });
    }
  }

  private demote(): void {
    this.held = undefined;
    this.aborts?.abort(new BothyError("lease_lost", "This node is no longer the cluster's leader."));
    this.aborts = undefined;
    for (const state of this.jobs.values()) clearTimeout(state.timer);
  }

  private scheduleJob(job: LeaderJob): void {
    const state = this.jobs.get(job);
    if (!state || this.stopped || this.held === undefined) return;
    clearTimeout(state.timer);
    state.timer = setTimeout(() => {
      state.running ??= this.runJob(job).finally(() => {
        state.running = undefined;
        this.scheduleJob(job);
      });
    }, job.intervalMs);
    state.timer.unref();
  }

  /** One run of `job`, if this process still leads by the database (a paused leader that woke does not). */
  private async runJob(job: LeaderJob): Promise<void> {
    const epoch = this.held;
    const signal = this.aborts?.signal;
    if (epoch === undefined || signal === undefined) return;
    const name = this.name;
    const refused = (): BothyError =>
      new BothyError(
        "lease_lost",
        `This node no longer holds the cluster's ${name} lease (epoch ${epoch}): the job's write was refused; the current leader runs it.`,
        { details: { lease: name, epoch } },
      );
    const ctx: JobContext = {
      epoch,
      signal,
      fenced: (body) =>
        this.options.store.transaction(function* () {
          if (!(yield* leases.holds(name, epoch))) throw refused();
          return yield* body();
        }),
    };
    try {
      if (!(await this.options.store.clusterLeases.holds(name, epoch))) throw refused();
      await job.run(ctx);
    } catch (err) {
      if (err instanceof BothyError && err.code === "lease_lost")
        this.log("warn", "leader_job_refused", { lease: name, job: job.name, epoch, error: err.message });
      else this.log("error", "leader_job_failed", { lease: name, job: job.name, epoch, error: messageOf(err) });
    }
  }
}
