import { readFileSync } from "node:fs";
import { z } from "zod";

/**
 * Which skipped tests a run may have: only those `test/allowed-skips.json` names, each with its
 * reason. A skip nobody listed (a `skipIf` whose condition is quietly true on this machine, a new
 * `it.skip`) fails the run, so a green run means the tests ran.
 */
const allowedSkip = z
  .object({
    /** The test file, relative to the repository (as vitest names it). */
    file: z.string().min(1),
    /** The test's full name (describe titles and its own, joined by " > "); absent: every test of the file. */
    test: z.string().min(1).optional(),
    /** Why it may be skipped: what it needs that a test machine may lack. */
    reason: z.string().min(1),
    /**
     * Allowed only while BOTHY_TEST_DRIVERS leaves this driver out: the test needs it, and a run that
     * names it (or names none: every driver) runs the test.
     */
    unlessDriver: z.enum(["gvisor", "qemu"]).optional(),
  })
  .strict();

export const allowedSkipsFile = z.object({ $comment: z.string().optional(), skips: z.array(allowedSkip) }).strict();
export type AllowedSkip = z.infer<typeof allowedSkip>;

export interface SkippedTest {
  file: string;
  name: string;
  /** The note of `ctx.skip(note)`, when the test gave one. */
  note: string | undefined;
}

export interface SkipVerdict {
  allowed: Array<SkippedTest & { reason: string }>;
  unlisted: SkippedTest[];
}

/** The drivers a run selects (BOTHY_TEST_DRIVERS, comma-separated; unset: all of them). */
export function selectedDrivers(env: NodeJS.ProcessEnv = process.env): (driver: string) => boolean {
  const named = env["BOTHY_TEST_DRIVERS"];
  if (named === undefined) return () => true;
  const set = new Set(
    named
      .split(",")
      .map((s) => s.trim())
      .filter(Boolean),
  );
  return (driver) => set.has(driver);
}

export function loadAllowedSkips(path: string): AllowedSkip[] {
  const parsed = allowedSkipsFile.safeParse(JSON.parse(readFileSync(path, "utf8")));
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new Error(`${path}: ${issue?.path.join(".") ?? ""}: ${issue?.message ?? "invalid"}`);
  }
  return parsed.data.skips;
}

/** Sorts a run's skipped tests into those the list allows (with its reason) and the rest. */
export function judgeSkips(
  skipped: readonly SkippedTest[],
  allowed: readonly AllowedSkip[],
  selected: (driver: string) => boolean,
): SkipVerdict {
  const verdict: SkipVerdict = { allowed: [], unlisted: [] };
  for (const t of skipped) {
    const entry = allowed.find(
      (a) =>
        a.file === t.file &&
        (a.test === undefined || a.test === t.name) &&
        (a.unlessDriver === undefined || !selected(a.unlessDriver)),
    );
    if (entry) verdict.allowed.push({ ...t, reason: entry.reason });
    else verdict.unlisted.push(t);
  }
  return verdict;
}
