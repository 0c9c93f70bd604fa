import type Database from "better-sqlite3";

/** A guest process started through envd, as the ledger keeps it (migration 12). */
export interface E2bProcessRow {
  sandbox_id: string;
  pid: number;
  command_id: string;
  /** JSON of envd's config without its `envs` (values the caller may consider secret stay in memory). */
  config: string;
  pty: number;
  tag: string | null;
  signalled: string | null;
}

/**
 * What the E2B surface keeps per sandbox (e2b/e2b-state.ts): the create's envVars, sealed, and the
 * guest pid → bothy command map. Written through at each change, so a restarted server still
 * gives commands the envVars and knows the pids of the processes that run on in the guests.
 */
export class E2bRows {
  private readonly statements: {
    putEnv: Database.Statement;
    env: Database.Statement;
    putProcess: Database.Statement;
    processes: Database.Statement;
    signalled: Database.Statement;
    dropProcess: Database.Statement;
    forgetEnv: Database.Statement;
    forgetProcesses: Database.Statement;
  };

  constructor(private readonly db: Database.Database) {
    this.statements = {
      putEnv: db.prepare(`INSERT OR REPLACE INTO e2b_envs (sandbox_id, sealed) VALUES (?, ?)`),
      env: db.prepare(`SELECT sealed FROM e2b_envs WHERE sandbox_id = ?`),
      putProcess: db.prepare(
        `INSERT OR REPLACE INTO e2b_processes (sandbox_id, pid, command_id, config, pty, tag, signalled)
         VALUES (@sandbox_id, @pid, @command_id, @config, @pty, @tag, @signalled)`,
      ),
      processes: db.prepare(`SELECT * FROM e2b_processes WHERE sandbox_id = ? ORDER BY pid`),
      signalled: db.prepare(`UPDATE e2b_processes SET signalled = ? WHERE sandbox_id = ? AND pid = ?`),
      dropProcess: db.prepare(`DELETE FROM e2b_processes WHERE sandbox_id = ? AND pid = ?`),
      forgetEnv: db.prepare(`DELETE FROM e2b_envs WHERE sandbox_id = ?`),
      forgetProcesses: db.prepare(`DELETE FROM e2b_processes WHERE sandbox_id = ?`),
    };
  }

  putEnv(sandboxId: string, sealed: Buffer): void {
    this.statements.putEnv.run(sandboxId, sealed);
  }

  env(sandboxId: string): Buffer | undefined {
    return (this.statements.env.get(sandboxId) as { sealed: Buffer } | undefined)?.sealed;
  }

  putProcess(row: E2bProcessRow): void {
    this.statements.putProcess.run(row);
  }

  processes(sandboxId: string): E2bProcessRow[] {
    return this.statements.processes.all(sandboxId) as E2bProcessRow[];
  }

  setSignalled(sandboxId: string, pid: number, signal: string): void {
    this.statements.signalled.run(signal, sandboxId, pid);
  }

  dropProcess(sandboxId: string, pid: number): void {
    this.statements.dropProcess.run(sandboxId, pid);
  }

  /** Everything of a sandbox that has ended for good. */
  forget(sandboxId: string): void {
    this.db.transaction(() => {
      this.statements.forgetEnv.run(sandboxId);
      this.statements.forgetProcesses.run(sandboxId);
    })();
  }
}
