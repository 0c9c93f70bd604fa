import type { BootedSandbox } from "./boot.ts";
import { IDLE, type Phase } from "./sandbox-actor.ts";

/**
 * What this process knows of one sandbox beyond its ledger row: the sandbox it holds, and the
 * operations under way on it. "Who owns sandbox X" is one lookup.
 */
export interface SandboxRecord {
  readonly id: string;
  /** The sandbox as this process holds it (running, or paused with its handle); undefined when dormant or gone. */
  booted: BootedSandbox | undefined;
  /**
   * Changes whenever `booted` does (unique across records): a decision taken on an earlier read
   * checks it before acting, so it never lands on a sandbox that was let go or replaced since.
   */
  generation: number;
  /**
   * Everything under way on it (sandbox-actor.ts, the only writer): the queued operation in
   * flight (create, pause, resume, sleep, wake, delete, stop, takeover), the queue behind it, its
   * delete, and a stop's teardown.
   */
  phase: Phase;
  /** When it was last used, for idle sleep. */
  lastActive: number | undefined;
  /** API calls using it right now (file transfers): it does not sleep under them. */
  holds: number;
}

/** The records of every sandbox this process holds or works on; a record goes when nothing is left in it. */
export class SandboxRecords {
  private readonly byId = new Map<string, SandboxRecord>();
  private generations = 0;

  get(id: string): SandboxRecord | undefined {
    return this.byId.get(id);
  }

  /** The record of `id`, made if there is none. */
  of(id: string): SandboxRecord {
    let rec = this.byId.get(id);
    if (!rec) {
      rec = {
        id,
        booted: undefined,
        generation: ++this.generations,
        phase: IDLE,
        lastActive: undefined,
        holds: 0,
      };
      this.byId.set(id, rec);
    }
    return rec;
  }

  all(): SandboxRecord[] {
    return [...this.byId.values()];
  }

  /** Records of the sandboxes held right now (running or paused). */
  held(): SandboxRecord[] {
    return this.all().filter((r) => r.booted !== undefined);
  }

  /** Takes `booted` as the record's sandbox; returns the new generation. */
  hold(rec: SandboxRecord, booted: BootedSandbox): number {
    rec.booted = booted;
    return (rec.generation = ++this.generations);
  }

  /** The record no longer holds a sandbox; returns what it held. */
  letGo(rec: SandboxRecord): BootedSandbox | undefined {
    const booted = rec.booted;
    rec.booted = undefined;
    rec.generation = ++this.generations;
    return booted;
  }

  /** Whether the process answers for the sandbox's host objects: it holds it or an operation is under way. */
  owns(rec: SandboxRecord): boolean {
    const { op, queue, deleting, reaping } = rec.phase;
    return (
      rec.booted !== undefined ||
      op !== "idle" ||
      queue !== undefined ||
      deleting !== undefined ||
      reaping !== undefined
    );
  }

  ownedIds(): string[] {
    return this.all()
      .filter((r) => this.owns(r))
      .map((r) => r.id);
  }

  /** Forgets a record with nothing left in it. */
  tidy(rec: SandboxRecord): void {
    if (this.owns(rec) || rec.holds > 0 || rec.lastActive !== undefined) return;
    if (this.byId.get(rec.id) === rec) this.byId.delete(rec.id);
  }
}
