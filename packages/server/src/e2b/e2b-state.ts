/**
 * What E2B has per sandbox and bothy's ledger does not: the create's `envVars`, which every
 * process gets, and which bothy command each guest pid is (E2B names processes by pid). Held in
 * memory: after a server restart, commands no longer get the envVars.
 */
export class E2bState {
  private readonly envs = new Map<string, Record<string, string>>();
  private readonly processes = new Map<string, Map<number, string>>();

  setEnv(sandboxId: string, env: Record<string, string>): void {
    if (Object.keys(env).length > 0) this.envs.set(sandboxId, env);
  }

  env(sandboxId: string): Record<string, string> {
    return this.envs.get(sandboxId) ?? {};
  }

  addProcess(sandboxId: string, pid: number, commandId: string): void {
    const map = this.processes.get(sandboxId) ?? new Map<number, string>();
    map.set(pid, commandId);
    this.processes.set(sandboxId, map);
  }

  /** The bothy command id of a guest pid. */
  commandOf(sandboxId: string, pid: number): string | undefined {
    return this.processes.get(sandboxId)?.get(pid);
  }

  pids(sandboxId: string): [number, string][] {
    return [...(this.processes.get(sandboxId) ?? [])];
  }

  dropProcess(sandboxId: string, pid: number): void {
    this.processes.get(sandboxId)?.delete(pid);
  }

  forget(sandboxId: string): void {
    this.envs.delete(sandboxId);
    this.processes.delete(sandboxId);
  }
}
