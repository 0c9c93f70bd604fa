import { all, get, run, transaction, type Step, type Asynced } from "./sql-step.ts";

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
export class E2bQueries {
  *putEnv(sandboxId: string, sealed: Buffer): Step<void> {
    yield* run(
      `INSERT INTO e2b_envs (sandbox_id, sealed) VALUES (?, ?) ON CONFLICT(sandbox_id) DO UPDATE SET sealed = excluded.sealed`,
      [sandboxId, sealed],
    );
  }

  *env(sandboxId: string): Step<Buffer | undefined> {
    return (yield* get<{ sealed: Buffer }>(`SELECT sealed FROM e2b_envs WHERE sandbox_id = ?`, [sandboxId]))?.sealed;
  }

  *putProcess(row: E2bProcessRow): Step<void> {
    yield* run(
      `INSERT INTO e2b_processes (sandbox_id, pid, command_id, config, pty, tag, signalled) VALUES (?, ?, ?, ?, ?, ?, ?)
         ON CONFLICT(sandbox_id, pid) DO UPDATE SET command_id = excluded.command_id, config = excluded.config,
           pty = excluded.pty, tag = excluded.tag, signalled = excluded.signalled`,
      [row.sandbox_id, row.pid, row.command_id, row.config, row.pty, row.tag, row.signalled],
    );
  }

  *processes(sandboxId: string): Step<E2bProcessRow[]> {
    return yield* all<E2bProcessRow>(`SELECT * FROM e2b_processes WHERE sandbox_id = ? ORDER BY pid`, [sandboxId]);
  }

  *setSignalled(sandboxId: string, pid: number, signal: string): Step<void> {
    yield* run(`UPDATE e2b_processes SET signalled = ? WHERE sandbox_id = ? AND pid = ?`, [signal, sandboxId, pid]);
  }

  *dropProcess(sandboxId: string, pid: number): Step<void> {
    yield* run(`DELETE FROM e2b_processes WHERE sandbox_id = ? AND pid = ?`, [sandboxId, pid]);
  }

  /** Everything of a sandbox that has ended for good. */
  *forget(sandboxId: string): Step<void> {
    yield* transaction(function* () {
      yield* run(`DELETE FROM e2b_envs WHERE sandbox_id = ?`, [sandboxId]);
      yield* run(`DELETE FROM e2b_processes WHERE sandbox_id = ?`, [sandboxId]);
    });
  }
}

/** The E2B surface's rows as the server's synchronous callers see them. */
export type E2bRows = Asynced<E2bQueries>;
