/**
 * What E2B has per sandbox and bothy's ledger does not: the create's `envVars`, which every
 * process gets. Held in memory: after a server restart, commands no longer get them.
 */
export class E2bState {
  private readonly envs = new Map<string, Record<string, string>>();

  setEnv(sandboxId: string, env: Record<string, string>): void {
    if (Object.keys(env).length > 0) this.envs.set(sandboxId, env);
  }

  env(sandboxId: string): Record<string, string> {
    return this.envs.get(sandboxId) ?? {};
  }

  forget(sandboxId: string): void {
    this.envs.delete(sandboxId);
  }
}
