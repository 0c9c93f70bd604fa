import type { CommandRegistry } from "../commands/command-registry.ts";
import type { DisconnectWatch } from "./disconnect-watch.ts";
import type { Logger, SandboxManager } from "./sandbox-manager.ts";

/**
 * Puts idle sandboxes to sleep: no command running, no WebSocket attached (a kept command socket
 * waiting between commands does not count), and no call for `idleMs`. Sleep is the driver's pause
 * where it has one (QEMU saves the VM's memory to disk and ends the process), else a stop that
 * keeps the disk (gVisor: files stay, processes end). The next command (also one on a kept socket),
 * file call or attach wakes it. A sandbox running a command is never put to sleep,
 * however long the command runs.
 */
export class IdleSleep {
  constructor(
    private readonly manager: SandboxManager,
    private readonly registry: CommandRegistry,
    private readonly watch: DisconnectWatch,
    private readonly idleMs: number,
    private readonly log: Logger,
  ) {}

  async pass(): Promise<void> {
    const live = this.manager.liveIds();
    this.manager.pruneActivity(live);
    if (this.idleMs === 0) return;
    for (const id of live) {
      if (!this.idle(id, false)) continue;
      this.log("sandbox_idle", { sandbox_id: id, idle_ms: this.manager.idleFor(id) });
      try {
        // Asked again once the sleep's turn has come and the disk is flushed: a command that
        // started in between keeps the sandbox awake instead of being ended by the sleep.
        await this.manager.sleep(id, () => this.idle(id, true));
      } catch (err) {
        this.log("sandbox_sleep_failed", { sandbox_id: id, error: (err as Error).message });
      }
    }
  }

  /** No command running, no client using it, no call for `idleMs` (`inSleepsTurn`: see canSleep). */
  private idle(id: string, inSleepsTurn: boolean): boolean {
    return (
      this.manager.canSleep(id, inSleepsTurn) &&
      this.registry.running(id) === 0 &&
      this.watch.inUse(id) === 0 &&
      this.manager.idleFor(id) >= this.idleMs
    );
  }
}
