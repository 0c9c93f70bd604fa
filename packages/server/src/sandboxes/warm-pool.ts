import { describeCauses } from "../errors/internal-errors.ts";
import { newSandboxId } from "../util/ids.ts";
import { bootSandbox, type BootedSandbox } from "./boot.ts";
import type { Driver, SandboxSpec } from "../drivers/driver.ts";
import type { Logger } from "../events/server-events.ts";
import type { AgentClient } from "../agent/agent-client.ts";

/** How long a pooled sandbox's warm-up command may take before the sandbox is given up. */
const WARM_UP_TIMEOUT_MS = 30_000;
/**
 * The longest a claim's refill waits for the claimed sandbox's first command to end: a boot's
 * host-side start (disk copy, mounts, `runsc run`) would compete with that command for the CPU.
 */
const REFILL_DEFER_MS = 1_000;

/**
 * Runs one command in a freshly booted sandbox before it joins the pool: the guest's first
 * command pays for cold caches (the shell, libc and the spawner's first fork, read through the
 * file system for the first time), and the claimer's first command should not.
 */
function warmUp(agent: AgentClient): Promise<void> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("the warm-up command did not end")), WARM_UP_TIMEOUT_MS);
    agent.exec(
      { cmd: "true" },
      {
        onStarted: () => undefined,
        onOutput: (_fd, _data, consumed) => consumed(),
        onExited: (code) => {
          clearTimeout(timer);
          if (code === 0) resolve();
          else reject(new Error(`the warm-up command exited with ${code}`));
        },
        onError: (err) => {
          clearTimeout(timer);
          reject(err);
        },
      },
    );
  });
}

export interface PoolShape {
  driver: Driver;
  templateName: string;
  templateRoot: string;
  templateHash: string;
  templateEnv: Record<string, string>;
  vcpu: number;
  memoryMib: number;
  diskMib: number;
  maxProcesses: number;
  /** The egress CA its guests trust, and the variables that point at it (SandboxSpec). */
  egressCa?: string;
  commandEnv?: Record<string, string>;
  /**
   * A snapshot's pool (`warmSnapshot`): `templateRoot` is then the snapshot's layer. Only a
   * create from this snapshot, which its tenant alone can name, claims from it.
   */
  snapshotId?: string;
}

/** How long a snapshot's pool keeps its unclaimed sandboxes after the last warm or claim. */
export const SNAPSHOT_POOL_IDLE_MS = 10 * 60_000;

/** A shape the pool keeps sandboxes of (config's pool shapes with the host's defaults filled in). */
export interface PoolShapeKey {
  driver: string;
  template: string;
  vcpu: number;
  memoryMib: number;
  diskMib: number;
  maxProcesses: number;
}

export interface WarmPoolOptions {
  /** Sandboxes kept booted per shape (0: no pool). */
  size: number;
  /** The only shapes the pool keeps; a claim of any other finds nothing and starts nothing. */
  shapes: readonly PoolShapeKey[];
  dirFor: (id: string) => string;
  bootTimeoutMs: number;
  log: Logger;
  /** Whether the host may run one more sandbox (pool sandboxes count toward BOTHY_MAX_SANDBOXES). */
  hasRoom: () => boolean;
}

/**
 * Sandboxes booted ahead of demand, for the configured shapes only (BOTHY_POOL_SHAPES: template,
 * vcpu, memory and driver; a shape's pool holds sandboxes of the template's current build). Each
 * has its own id, hostname and disk from the start, its network, identity and limits applied, and
 * has run one command (its caches warm); a claim only hands it over, with the host's default CPU
 * weight back (pool sandboxes boot at the lowest). The pool refills in the background, one boot
 * at a time, at that lowest weight, so it never starves live work of CPU; after a claim, once
 * the claimed sandbox's first command has ended (`settled`, at most REFILL_DEFER_MS later), so
 * the caller's first command does not share the CPU with a boot. A claim that finds the pool
 * empty (a burst) refills at once.
 *
 * Bounded: at most `size` per configured shape; pool sandboxes count toward the host's limit (a
 * refill boots only while `hasRoom`, and a create that finds the host full takes the room of one,
 * `evictOne`); a claim or warm that finds a template rebuilt drains the pools of its older builds.
 */
export class WarmPool {
  private readonly ready = new Map<string, BootedSandbox[]>();
  private readonly filling = new Map<string, Promise<void>>();
  private readonly booting = new Set<string>();
  /** Pool sandboxes being destroyed (evicted, drained, or found dead): still ours until gone. */
  private readonly removing = new Map<string, Promise<void>>();
  /** The build each template's pools hold; a claim or warm with another drains the older. */
  private readonly builds = new Map<string, string>();
  /** Claimed sandboxes whose shape's refill waits for their first command (`settled`). */
  private readonly deferred = new Map<string, { shape: PoolShape; timer: NodeJS.Timeout }>();
  /** Snapshots warmed on request (`warmSnapshot`): how many more boots each may have, and its idle timer. */
  private readonly snapshots = new Map<string, { left: number; timer: NodeJS.Timeout }>();
  private closed = false;
  private readonly size: number;

  constructor(private readonly opts: WarmPoolOptions) {
    this.size = opts.shapes.length === 0 ? 0 : opts.size;
  }

  /** Whether `shape` is one the pool keeps. */
  accepts(shape: PoolShape): boolean {
    if (shape.snapshotId !== undefined) return this.snapshots.has(shape.snapshotId);
    return this.opts.shapes.some(
      (k) =>
        k.driver === shape.driver.name &&
        k.template === shape.templateName &&
        k.vcpu === shape.vcpu &&
        k.memoryMib === shape.memoryMib &&
        k.diskMib === shape.diskMib &&
        k.maxProcesses === shape.maxProcesses,
    );
  }

  /** Whether a claim of `shape` now would hand a sandbox over. */
  hasReady(shape: PoolShape): boolean {
    if (this.closed || !this.accepts(shape)) return false;
    return (this.ready.get(shapeKey(shape)) ?? []).some((b) => !b.agent.isClosed);
  }

  /** Pool sandboxes booted or booting: what the pool takes of the host's limit. */
  count(): number {
    const { ready, booting } = this.stats();
    return ready + booting;
  }

  stats(): { ready: number; booting: number } {
    let ready = 0;
    for (const list of this.ready.values()) ready += list.length;
    return { ready, booting: this.booting.size };
  }

  /**
   * A booted sandbox of this shape, or undefined when none is ready or the shape is not one the
   * pool keeps. Starts a refill: at once when none was, else once the claimed sandbox has
   * `settled`. The caller gives it its CPU weight back (`prioritize`).
   */
  claim(shape: PoolShape): BootedSandbox | undefined {
    if (this.closed || !this.accepts(shape)) return undefined;
    if (shape.snapshotId !== undefined) return this.claimSnapshot(shape, shape.snapshotId);
    if (this.size === 0) return undefined;
    this.noteBuild(shape);
    const key = shapeKey(shape);
    const list = this.ready.get(key) ?? [];
    let found: BootedSandbox | undefined;
    while ((found = list.shift())) {
      if (!found.agent.isClosed) break;
      void this.remove(found);
    }
    if (found) this.deferRefill(found.spec.id, shape);
    else this.refill(shape);
    return found;
  }

  /**
   * Boots `count` sandboxes of a snapshot's shape ahead of the creates that will start from it
   * (a snapshot taken with `warm`), at the lowest CPU weight, one at a time while the host has
   * room. Unlike a template's pool it does not refill: the count is what the caller asked for. A
   * snapshot's pool is given up when the snapshot is deleted (`dropSnapshot`) or after
   * SNAPSHOT_POOL_IDLE_MS without a claim.
   */
  warmSnapshot(shape: PoolShape & { snapshotId: string }, count: number): void {
    if (this.closed || count <= 0) return;
    const id = shape.snapshotId;
    const known = this.snapshots.get(id);
    if (known) clearTimeout(known.timer);
    this.snapshots.set(id, { left: (known?.left ?? 0) + count, timer: this.idleTimer(id) });
    this.refill(shape);
  }

  /** Destroys a snapshot's pool sandboxes (booting ones when their boot ends); resolves once they are gone. */
  async dropSnapshot(snapshotId: string): Promise<void> {
    const known = this.snapshots.get(snapshotId);
    if (!known) return;
    clearTimeout(known.timer);
    this.snapshots.delete(snapshotId);
    const jobs: Promise<void>[] = [];
    for (const [key, list] of this.ready) {
      if (!key.endsWith(`#${snapshotId}`)) continue;
      this.ready.delete(key);
      for (const b of list) {
        this.opts.log("pool_evicted", { sandbox_id: b.spec.id, reason: "its snapshot was deleted or unused" });
        jobs.push(this.remove(b));
      }
    }
    for (const [key, job] of this.filling) if (key.endsWith(`#${snapshotId}`)) jobs.push(job);
    await Promise.allSettled(jobs);
  }

  /** Sandboxes of a snapshot's pool ready to be claimed. */
  snapshotReady(snapshotId: string): number {
    let n = 0;
    for (const [key, list] of this.ready) if (key.endsWith(`#${snapshotId}`)) n += list.length;
    return n;
  }

  /** A snapshot pool's sandbox for a create from it; no refill, the idle timer starts again. */
  private claimSnapshot(shape: PoolShape, snapshotId: string): BootedSandbox | undefined {
    const list = this.ready.get(shapeKey(shape)) ?? [];
    let found: BootedSandbox | undefined;
    while ((found = list.shift())) {
      if (!found.agent.isClosed) break;
      void this.remove(found);
    }
    const known = this.snapshots.get(snapshotId);
    if (known) {
      clearTimeout(known.timer);
      known.timer = this.idleTimer(snapshotId);
    }
    return found;
  }

  private idleTimer(snapshotId: string): NodeJS.Timeout {
    const timer = setTimeout(() => void this.dropSnapshot(snapshotId), SNAPSHOT_POOL_IDLE_MS);
    timer.unref();
    return timer;
  }

  /**
   * Gives up one ready pool sandbox (destroyed in the background) so a create or wake fits on a
   * full host; false when there is none.
   */
  evictOne(): boolean {
    for (const list of this.ready.values()) {
      const victim = list.shift();
      if (!victim) continue;
      this.opts.log("pool_evicted", { sandbox_id: victim.spec.id, reason: "the host is full" });
      void this.remove(victim);
      return true;
    }
    return false;
  }

  /** A claimed sandbox's first command has ended (or it is gone): its shape's refill starts now. */
  settled(id: string): void {
    const deferred = this.deferred.get(id);
    if (!deferred) return;
    clearTimeout(deferred.timer);
    this.deferred.delete(id);
    this.refill(deferred.shape);
  }

  private deferRefill(id: string, shape: PoolShape): void {
    const timer = setTimeout(() => this.settled(id), REFILL_DEFER_MS);
    timer.unref();
    this.deferred.set(id, { shape, timer });
  }

  /** Ids of sandboxes the pool owns (they have host objects but no ledger row). */
  ownedIds(): Set<string> {
    const ids = new Set([...this.booting, ...this.removing.keys()]);
    for (const list of this.ready.values()) for (const b of list) ids.add(b.spec.id);
    return ids;
  }

  /**
   * Fills the pool of `shape` (its template's build as just resolved), if it is one the pool keeps;
   * pools of the template's older builds are drained.
   */
  warm(shape: PoolShape): void {
    if (this.size === 0 || this.closed || !this.accepts(shape)) return;
    this.noteBuild(shape);
    this.refill(shape);
  }

  /**
   * Fills the pool of `shape` while the host has room: a template's up to `size` unless its build is no
   * longer the current one, a snapshot's with what its warm asked for while the snapshot is kept.
   */
  private refill(shape: PoolShape): void {
    const snapshotId = shape.snapshotId;
    if ((this.size === 0 && snapshotId === undefined) || this.closed || !this.accepts(shape)) return;
    const key = shapeKey(shape);
    if (this.filling.has(key)) return;
    const current = (): boolean =>
      !this.closed &&
      (snapshotId === undefined
        ? this.builds.get(shape.templateName) === shape.templateHash
        : this.snapshots.has(snapshotId));
    // A template's pool keeps `size` ready; a snapshot's boots what its warm asked for, once.
    const wanted = (): boolean =>
      snapshotId === undefined
        ? (this.ready.get(key)?.length ?? 0) < this.size
        : (this.snapshots.get(snapshotId)?.left ?? 0) > 0;
    const job = (async () => {
      while (current() && wanted() && this.opts.hasRoom()) {
        const budget = snapshotId === undefined ? undefined : this.snapshots.get(snapshotId);
        if (budget) budget.left -= 1;
        const id = newSandboxId();
        const spec: SandboxSpec = {
          id,
          templateRoot: shape.templateRoot,
          templateEnv: shape.templateEnv,
          vcpu: shape.vcpu,
          memoryMib: shape.memoryMib,
          diskMib: shape.diskMib,
          maxProcesses: shape.maxProcesses,
          dir: this.opts.dirFor(id),
          ...(shape.egressCa === undefined ? {} : { egressCa: shape.egressCa }),
          ...(shape.commandEnv === undefined ? {} : { commandEnv: shape.commandEnv }),
          // At the lowest CPU weight until claimed: a refill never slows the sandboxes in use.
          background: true,
        };
        this.booting.add(id);
        try {
          const booted = await bootSandbox(shape.driver, spec, this.opts.bootTimeoutMs);
          try {
            await warmUp(booted.agent);
          } catch (err) {
            await booted.handle.destroy();
            throw err;
          }
          // Closed, or the template was rebuilt while it booted: it would never be claimed.
          if (!current()) {
            await booted.handle.destroy();
            return;
          }
          const list = this.ready.get(key) ?? [];
          list.push(booted);
          this.ready.set(key, list);
        } catch (err) {
          this.opts.log("pool_boot_failed", { sandbox_id: id, error: describeCauses(err) });
          return; // a failing shape is not retried in a loop; the next claim tries again
        } finally {
          this.booting.delete(id);
        }
      }
    })().finally(() => this.filling.delete(key));
    this.filling.set(key, job);
  }

  /**
   * Records the build of `shape`'s template that pools hold from now on; on a new build, drains
   * the pools of the older ones (their sandboxes would never be claimed again).
   */
  private noteBuild(shape: PoolShape): void {
    const known = this.builds.get(shape.templateName);
    if (known === shape.templateHash) return;
    this.builds.set(shape.templateName, shape.templateHash);
    if (known === undefined) return;
    for (const [key, list] of this.ready) {
      // A snapshot's pool lies over the build its snapshot names, whatever the template's current one.
      if (key.includes("#")) continue;
      const [name, hash] = buildOf(key);
      if (name !== shape.templateName || hash === shape.templateHash) continue;
      this.ready.delete(key);
      for (const b of list) {
        this.opts.log("pool_evicted", { sandbox_id: b.spec.id, reason: "its template was rebuilt" });
        void this.remove(b);
      }
    }
  }

  /** Destroys a pool sandbox in the background; it stays the pool's (owned) until it is gone. */
  private remove(b: BootedSandbox): Promise<void> {
    const id = b.spec.id;
    const job = b.handle
      .destroy()
      .catch((err: unknown) => this.opts.log("pool_boot_failed", { sandbox_id: id, error: describeCauses(err) }))
      .finally(() => this.removing.delete(id));
    this.removing.set(id, job);
    return job;
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const { timer } of this.snapshots.values()) clearTimeout(timer);
    for (const { timer } of this.deferred.values()) clearTimeout(timer);
    this.deferred.clear();
    await Promise.allSettled([...this.filling.values()]);
    const all = [...this.ready.values()].flat();
    this.ready.clear();
    await Promise.allSettled([...all.map((b) => b.handle.destroy()), ...this.removing.values()]);
  }
}

function shapeKey(s: PoolShape): string {
  const key = `${s.driver.name}/${s.templateName}@${s.templateHash}/${s.vcpu}/${s.memoryMib}/${s.diskMib}/${s.maxProcesses}`;
  return s.snapshotId === undefined ? key : `${key}#${s.snapshotId}`;
}

/** The template name and build hash of a shape key. */
function buildOf(key: string): [string, string] {
  const [name = "", hash = ""] = (key.split("/")[1] ?? "").split("@");
  return [name, hash];
}
