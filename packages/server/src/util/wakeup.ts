/**
 * Wakes one consumer waiting for the next item of a queue: the producer calls `wake` after each
 * push (nothing happens while no one waits: the consumer looks at the queue before it waits).
 */
export class Wakeup {
  private waiter: (() => void) | undefined;

  wake(): void {
    this.waiter?.();
  }

  /** Resolves false once woken, or true when `idleMs` passed first (never, when undefined). */
  async wait(idleMs: number | undefined): Promise<boolean> {
    let timer: NodeJS.Timeout | undefined;
    const idle = await new Promise<boolean>((resolve) => {
      this.waiter = () => resolve(false);
      if (idleMs !== undefined) timer = setTimeout(() => resolve(true), idleMs);
    });
    clearTimeout(timer);
    this.waiter = undefined;
    return idle;
  }
}
