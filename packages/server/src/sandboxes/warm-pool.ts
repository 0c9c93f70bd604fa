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
}

/**
 * Sandboxes booted ahead of demand, one set per shape (driver + template build + vcpu + memory). Each has
 * its own id, hostname and disk from the start, its network, identity and limits applied, and has
 * run one command (its caches warm); a claim only hands it over, with the host's default CPU
 * weight back (pool sandboxes boot at the lowest). The pool refills in the background, one boot
 * at a time, at that lowest weight, so it never starves live work of CPU; after a claim, once
 * the claimed sandbox's first command has ended (`settled`, at most REFILL_DEFER_MS later), so
 * the caller's first command does not share the CPU with a boot. A claim that finds the pool
 * empty (a burst) refills at once.
 */
export class WarmPool {
  private readonly ready = new Map<string, BootedSandbox[]>();
  private readonly filling = new Map<string, Promise<void>>();
  private readonly booting = new Set<string>();
  /** Claimed sandboxes whose shape's refill waits for their first command (`settled`). */
  private readonly deferred = new Map<string, { shape: PoolShape; timer: NodeJS.Timeout }>();
  private closed = false;

  constructor(
    private readonly size: number,
    private readonly dirFor: (id: string) => string,
    private readonly bootTimeoutMs: number,
    private readonly log: Logger,
  ) {}

  /**
   * A booted sandbox of this shape, or undefined when none is ready. Starts a refill: at once
   * when none was, else once the claimed sandbox has `settled`. The caller gives it its CPU
   * weight back (`prioritize`).
   */
  claim(shape: PoolShape): BootedSandbox | undefined {
    if (this.size === 0 || this.closed) return undefined;
    const key = shapeKey(shape);
    const list = this.ready.get(key) ?? [];
    let found: BootedSandbox | undefined;
    while ((found = list.shift())) {
      if (!found.agent.isClosed) break;
      void found.handle.destroy();
    }
    if (found) this.deferRefill(found.spec.id, shape);
    else this.refill(shape);
    return found;
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
    const ids = new Set(this.booting);
    for (const list of this.ready.values()) for (const b of list) ids.add(b.spec.id);
    return ids;
  }

  refill(shape: PoolShape): void {
    if (this.size === 0 || this.closed) return;
    const key = shapeKey(shape);
    if (this.filling.has(key)) return;
    const job = (async () => {
      while (!this.closed && (this.ready.get(key)?.length ?? 0) < this.size) {
        const id = newSandboxId();
        const spec: SandboxSpec = {
          id,
          templateRoot: shape.templateRoot,
          templateEnv: shape.templateEnv,
          vcpu: shape.vcpu,
          memoryMib: shape.memoryMib,
          diskMib: shape.diskMib,
          maxProcesses: shape.maxProcesses,
          dir: this.dirFor(id),
          ...(shape.egressCa === undefined ? {} : { egressCa: shape.egressCa }),
          ...(shape.commandEnv === undefined ? {} : { commandEnv: shape.commandEnv }),
          // At the lowest CPU weight until claimed: a refill never slows the sandboxes in use.
          background: true,
        };
        this.booting.add(id);
        try {
          const booted = await bootSandbox(shape.driver, spec, this.bootTimeoutMs);
          try {
            await warmUp(booted.agent);
          } catch (err) {
            await booted.handle.destroy();
            throw err;
          }
          if (this.closed) {
            await booted.handle.destroy();
            return;
          }
          const list = this.ready.get(key) ?? [];
          list.push(booted);
          this.ready.set(key, list);
        } catch (err) {
          this.log("pool_boot_failed", { sandbox_id: id, error: describeCauses(err) });
          return; // a failing shape is not retried in a loop; the next claim tries again
        } finally {
          this.booting.delete(id);
        }
      }
    })().finally(() => this.filling.delete(key));
    this.filling.set(key, job);
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const { timer } of this.deferred.values()) clearTimeout(timer);
    this.deferred.clear();
    await Promise.allSettled([...this.filling.values()]);
    const all = [...this.ready.values()].flat();
    this.ready.clear();
    await Promise.allSettled(all.map((b) => b.handle.destroy()));
  }
}

function shapeKey(s: PoolShape): string {
  return `${s.driver.name}/${s.templateHash}/${s.vcpu}/${s.memoryMib}/${s.diskMib}/${s.maxProcesses}`;
}
