import { all, get, relaxed, run, type Step } from "./sql-step.ts";

export interface CommandRow {
  id: string;
  sandbox_id: string;
  cmd: string;
  state: "running" | "exited" | "lost";
  exit_code: number | null;
  signal: string | null;
  started_at: string;
  ended_at: string | null;
  background: number;
  timed_out: number;
}

const now = (): string => new Date().toISOString();

/**
 * Commands' records. Written relaxed (`relaxed` in sql-step.ts): a command's record is written
 * several times per command, and an fsync each cost the API milliseconds of its event loop.
 */
export class CommandQueries {
  *insertCommand(row: { id: string; sandbox_id: string; cmd: string; background?: boolean }): Step<void> {
    yield* relaxed(() =>
      run(
        `INSERT INTO commands (id, sandbox_id, cmd, state, started_at, background, tenant)
           VALUES (?, ?, ?, 'running', ?, ?, (SELECT tenant FROM sandboxes WHERE id = ?))`,
        [row.id, row.sandbox_id, row.cmd, now(), row.background ? 1 : 0, row.sandbox_id],
      ),
    );
  }

  /** Records a command's end; returns its record, or undefined when it has none (it never started). */
  *finishCommand(
    id: string,
    result: { state: "exited" | "lost"; exit_code: number | null; signal: string | null; timed_out?: boolean },
  ): Step<CommandRow | undefined> {
    return yield* relaxed(() =>
      get<CommandRow>(
        `UPDATE commands SET state = ?, exit_code = ?, signal = ?, timed_out = ?, ended_at = ? WHERE id = ? RETURNING *`,
        [result.state, result.exit_code, result.signal, result.timed_out ? 1 : 0, now(), id],
      ),
    );
  }

  /** A sandbox's commands in the order they started (insertion order among those of one millisecond). */
  *listCommands(sandboxId: string): Step<CommandRow[]> {
    return yield* all<CommandRow>(`SELECT * FROM commands WHERE sandbox_id = ? ORDER BY started_at, rowid`, [
      sandboxId,
    ]);
  }

  /** Commands still marked running in a sandbox that has gone away did not finish. */
  *loseCommands(sandboxId: string): Step<void> {
    yield* run(`UPDATE commands SET state = 'lost', ended_at = ? WHERE sandbox_id = ? AND state = 'running'`, [
      now(),
      sandboxId,
    ]);
  }

  *getCommand(id: string): Step<CommandRow | undefined> {
    return yield* get<CommandRow>(`SELECT * FROM commands WHERE id = ?`, [id]);
  }
}
