import type { E2bRows } from "../ledger/e2b-rows.ts";

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

/** Seals and opens the envVars the ledger keeps (the vault's key; gateway/vault.ts `sealFor`). */
export interface EnvSealer {
  seal(sandboxId: string, value: Buffer): Buffer;
  open(sandboxId: string, sealed: Buffer): Buffer;
}

const ENV_PURPOSE = "e2b-envs";

/** The vault's sealing for E2B envVars. */
export function vaultSealer(vault: {
  sealFor(purpose: string, id: string, v: Buffer): Buffer;
  unsealFor(purpose: string, id: string, s: Buffer): Buffer;
}): EnvSealer {
  return {
    seal: (id, value) => vault.sealFor(ENV_PURPOSE, id, value),
    open: (id, sealed) => vault.unsealFor(ENV_PURPOSE, id, sealed),
  };
}

/**
 * What E2B has per sandbox and bothy's own rows do not: the create's `envVars`, which every
 * process gets, and which bothy command each guest pid is (E2B names processes by pid). Kept in
 * the ledger (`E2bRows`, the envVars sealed), written through at every change, so a restarted
 * server still gives commands the envVars and still knows the pids of processes that run on in the
 * guest; a cache per sandbox in memory answers the reads. A process's own `envs` are not written
 * to the ledger: after a restart its config reads without them.
 */
export class E2bState {
  private readonly envs = new Map<string, Record<string, string>>();
  private readonly processes = new Map<string, Map<number, E2bProcess>>();

  constructor(
    private readonly rows: E2bRows,
    private readonly sealer: EnvSealer,
    private readonly onUnreadable: (sandboxId: string, err: Error) => void = () => undefined,
  ) {}

  setEnv(sandboxId: string, env: Record<string, string>): void {
    if (Object.keys(env).length === 0) return;
    this.rows.putEnv(sandboxId, this.sealer.seal(sandboxId, Buffer.from(JSON.stringify(env), "utf8")));
    this.envs.set(sandboxId, env);
  }

  env(sandboxId: string): Record<string, string> {
    const known = this.envs.get(sandboxId);
    if (known) return known;
    const sealed = this.rows.env(sandboxId);
    if (!sealed) return {};
    let env: Record<string, string>;
    try {
      env = JSON.parse(this.sealer.open(sandboxId, sealed).toString("utf8")) as Record<string, string>;
    } catch (err) {
      // The vault's key was replaced since: the envVars cannot be read back; commands run without them.
      this.onUnreadable(sandboxId, err as Error);
      env = {};
    }
    this.envs.set(sandboxId, env);
    return env;
  }

  addProcess(sandboxId: string, pid: number, process: E2bProcess): void {
    const { envs: _envs, ...config } = process.config;
    this.rows.putProcess({
      sandbox_id: sandboxId,
      pid,
      command_id: process.commandId,
      config: JSON.stringify(config),
      pty: process.pty ? 1 : 0,
      tag: process.tag ?? null,
      signalled: process.signalled ?? null,
    });
    this.of(sandboxId).set(pid, process);
  }

  /** The bothy command of a guest pid, and how E2B asked for it. */
  process(sandboxId: string, pid: number): E2bProcess | undefined {
    return this.of(sandboxId).get(pid);
  }

  listProcesses(sandboxId: string): [number, E2bProcess][] {
    return [...this.of(sandboxId)];
  }

  /** SendSignal sent it `signal`: its end is reported as that signal's death (a terminal's). */
  markSignalled(sandboxId: string, pid: number, signal: "SIGKILL" | "SIGTERM"): void {
    const process = this.process(sandboxId, pid);
    if (!process) return;
    process.signalled = signal;
    this.rows.setSignalled(sandboxId, pid, signal);
  }

  dropProcess(sandboxId: string, pid: number): void {
    this.of(sandboxId).delete(pid);
    this.rows.dropProcess(sandboxId, pid);
  }

  forget(sandboxId: string): void {
    this.envs.delete(sandboxId);
    this.processes.delete(sandboxId);
    this.rows.forget(sandboxId);
  }

  /** The sandbox's pid map, read from the ledger the first time this process asks. */
  private of(sandboxId: string): Map<number, E2bProcess> {
    let map = this.processes.get(sandboxId);
    if (map) return map;
    map = new Map();
    for (const row of this.rows.processes(sandboxId)) {
      const config = JSON.parse(row.config) as Omit<E2bProcess["config"], "envs">;
      map.set(row.pid, {
        commandId: row.command_id,
        config: { ...config, envs: {} },
        pty: row.pty === 1,
        ...(row.signalled === "SIGKILL" || row.signalled === "SIGTERM" ? { signalled: row.signalled } : {}),
        ...(row.tag === null ? {} : { tag: row.tag }),
      });
    }
    this.processes.set(sandboxId, map);
    return map;
  }
}
