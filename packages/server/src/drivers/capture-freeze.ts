/**
 * A capture's freeze as a sandbox's directory records it, for both drivers: a marker written
 * before a capture freezes the sandbox (gVisor `runsc pause`, QEMU `stop` or a memory save) and
 * removed after the thaw. A server that dies in between leaves the sandbox frozen and the marker
 * there; the next server's take-over resumes a sandbox it finds frozen only when the marker says a
 * capture did it (a pause of the sandbox's own stays as it is).
 */
import { existsSync } from "node:fs";
import { rm, writeFile } from "node:fs/promises";
import { join } from "node:path";

/** In the sandbox's directory while a capture may have it frozen. */
const FROZEN_MARKER = "capture-frozen";
/**
 * Test-only (crash tests): a path; a capture that has frozen its sandbox and taken its copy (not
 * yet published) writes `<path>.frozen` and holds the sandbox frozen until `<path>` exists, so a
 * test can kill the server at exactly that point without a timing window. Unset in production.
 */
const HOLD_ENV = "BOTHY_TEST_CAPTURE_HOLD";

/** Before the freeze. */
export async function markFrozen(dir: string): Promise<void> {
  await writeFile(join(dir, FROZEN_MARKER), "", { mode: 0o600 });
}

/** After the thaw (by the capture, or by a take-over). */
export async function clearFrozen(dir: string): Promise<void> {
  await rm(join(dir, FROZEN_MARKER), { force: true });
}

/** Whether a capture may have left the sandbox in `dir` frozen. */
export function frozenByCapture(dir: string): boolean {
  return existsSync(join(dir, FROZEN_MARKER));
}

/** The crash tests' hold (HOLD_ENV), called with the sandbox frozen and its copy taken: nothing unless set. */
export async function holdForTest(): Promise<void> {
  const hold = process.env[HOLD_ENV];
  if (!hold) return;
  await writeFile(`${hold}.frozen`, "");
  while (!existsSync(hold)) await new Promise((r) => setTimeout(r, 50)); // the poll's pace
}
