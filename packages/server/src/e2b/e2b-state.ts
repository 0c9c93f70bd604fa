/**
 * What E2B has per sandbox and bothy's ledger does not: the create's `envVars`, which every
 * process gets, and which bothy command each guest pid is (E2B names processes by pid). Held in
 * memory: after a server restart, commands no longer get the envVars.
 */
/** A command started through envd: the bothy command behind the pid, and envd's config of it. */
export interface E2bProcess {
  commandId: string;
  config: { cmd: string; args: string[]; envs: Record<string, string>; cwd?: string };
  /** Started on a terminal: its output is envd's `pty` stream and it can be resized. */
  pty: boolean;
  /** The last signal SendSignal sent it. */
  signalled?: "SIGKILL" | "SIGTERM";
  tag?: string;
}

export class E2bState {
  private readonly envs = new Map<string, Record<string, string>>();
  private readonly processes = new Map<string, Map<number, E2bProcess>>();

  setEnv(sandboxId: string, env: Record<string, string>): void {
    if (Object.keys(env).length > 0) this.envs.set(sandboxId, env);
  }

  env(sandboxId: string): Record<string, string> {
    return this.envs.get(sandboxId) ?? {};
  }

  addProcess(sandboxId: string, pid: number, process: E2bProcess): void {
    const map = this.processes.get(sandboxId) ?? new Map<number, E2bProcess>();
    map.set(pid, process);
    this.processes.set(sandboxId, map);
  }

  /** The bothy command of a guest pid, and how E2B asked for it. */
  process(sandboxId: string, pid: number): E2bProcess | undefined {
    return this.processes.get(sandboxId)?.get(pid);
  }

  listProcesses(sandboxId: string): [number, E2bProcess][] {
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
