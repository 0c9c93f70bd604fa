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
 * guest; a cache per sandbox in memory answers the reads, filled from the ledger once per sandbox
 * (`ready`, which every handler awaits before it reads). Writes go to the cache at once and to the
 * ledger in the order they were made (one chain per server), so the ledger never holds an older
 * state than one written after it. A process's own `envs` are not written
 * to the ledger: after a restart its config reads without them.
 */
export class E2bState {
  private readonly envs = new Map<string, Record<string, string>>();
  private readonly processes = new Map<string, Map<number, E2bProcess>>();
  /** Loads under way or done, per sandbox: `ready` reads the ledger once. */
  private readonly loading = new Map<string, Promise<void>>();
  /** The ledger writes, one after another in the order made. */
  private writes: Promise<void> = Promise.resolve();

  constructor(
    private readonly rows: E2bRows,
    private readonly sealer: EnvSealer,
    private readonly onUnreadable: (sandboxId: string, err: Error) => void = () => undefined,
  ) {}

  /** Fills the sandbox's cache from the ledger (once): the reads below answer from it. */
  ready(sandboxId: string): Promise<void> {
    let loading = this.loading.get(sandboxId);
    if (!loading) {
      loading = this.load(sandboxId);
      this.loading.set(sandboxId, loading);
      loading.catch(() => this.loading.delete(sandboxId));
    }
    return loading;
  }

  private async load(sandboxId: string): Promise<void> {
    // Writes made before the load land first, so it reads them back.
    await this.writes;
    const [sealed, rows] = await Promise.all([this.rows.env(sandboxId), this.rows.processes(sandboxId)]);
    if (!this.envs.has(sandboxId)) {
      let env: Record<string, string> = {};
      if (sealed)
        try {
          env = JSON.parse(this.sealer.open(sandboxId, sealed).toString("utf8")) as Record<string, string>;
        } catch (err) {
          // The vault's key was replaced since: the envVars cannot be read back; commands run without them.
          this.onUnreadable(sandboxId, err as Error);
        }
      this.envs.set(sandboxId, env);
    }
    const map = this.of(sandboxId);
    for (const row of rows) {
      if (map.has(row.pid)) continue;
      const config = JSON.parse(row.config) as Omit<E2bProcess["config"], "envs">;
      map.set(row.pid, {
        commandId: row.command_id,
        config: { ...config, envs: {} },
        pty: row.pty === 1,
        ...(row.signalled === "SIGKILL" || row.signalled === "SIGTERM" ? { signalled: row.signalled } : {}),
        ...(row.tag === null ? {} : { tag: row.tag }),
      });
    }
  }

  /** Queues a ledger write after the ones before it; resolves once it landed (a failure is reported, not thrown). */
  private write(sandboxId: string, f: () => Promise<unknown>): Promise<void> {
    const next = this.writes.then(f).then(
      () => undefined,
      (err: unknown) => this.onUnreadable(sandboxId, err as Error),
    );
    this.writes = next;
    return next;
  }

  /** Resolves once the writes made so far have landed (or failed, and were reported). */
  flush(): Promise<void> {
    return this.writes;
  }

  setEnv(sandboxId: string, env: Record<string, string>): Promise<void> {
    if (Object.keys(env).length === 0) return Promise.resolve();
    const sealed = this.sealer.seal(sandboxId, Buffer.from(JSON.stringify(env), "utf8"));
    this.envs.set(sandboxId, env);
    return this.write(sandboxId, () => this.rows.putEnv(sandboxId, sealed));
  }

  /** The create's envVars (after `ready`). */
  env(sandboxId: string): Record<string, string> {
    return this.envs.get(sandboxId) ?? {};
  }

  addProcess(sandboxId: string, pid: number, process: E2bProcess): void {
    const { envs: _envs, ...config } = process.config;
    this.of(sandboxId).set(pid, process);
    void this.write(sandboxId, () =>
      this.rows.putProcess({
        sandbox_id: sandboxId,
        pid,
        command_id: process.commandId,
        config: JSON.stringify(config),
        pty: process.pty ? 1 : 0,
        tag: process.tag ?? null,
        signalled: process.signalled ?? null,
      }),
    );
  }

  /** The bothy command of a guest pid, and how E2B asked for it (after `ready`). */
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
    void this.write(sandboxId, () => this.rows.setSignalled(sandboxId, pid, signal));
  }

  dropProcess(sandboxId: string, pid: number): void {
    this.of(sandboxId).delete(pid);
    void this.write(sandboxId, () => this.rows.dropProcess(sandboxId, pid));
  }

  forget(sandboxId: string): void {
    this.envs.delete(sandboxId);
    this.processes.delete(sandboxId);
    this.loading.delete(sandboxId);
    void this.write(sandboxId, () => this.rows.forget(sandboxId));
  }

  /** The sandbox's pid map in memory. */
  private of(sandboxId: string): Map<number, E2bProcess> {
    let map = this.processes.get(sandboxId);
    if (!map) {
      map = new Map();
      this.processes.set(sandboxId, map);
    }
    return map;
  }
}
