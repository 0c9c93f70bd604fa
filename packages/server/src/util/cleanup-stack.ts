/**
 * Undo steps collected while building something; on failure they run once, newest first, and
 * every step runs even when an earlier one fails. A boot owns one (`sandboxes/boot.ts`) and hands
 * it to the driver's `start`/`resume`, which only push onto it; the boot alone runs or releases it.
 */
export class CleanupStack {
  private readonly steps: Array<{ name: string; undo: () => Promise<void> | void }> = [];
  private ran = false;

  push(name: string, undo: () => Promise<void> | void): void {
    this.steps.push({ name, undo });
  }

  /** Forget the steps: the thing they built now belongs to someone else. */
  release(): void {
    this.steps.length = 0;
  }

  async run(onError: (name: string, err: unknown) => void): Promise<void> {
    if (this.ran) return;
    this.ran = true;
    while (this.steps.length > 0) {
      const step = this.steps.pop();
      if (!step) break;
      try {
        await step.undo();
      } catch (err) {
        onError(step.name, err);
      }
    }
  }
}
