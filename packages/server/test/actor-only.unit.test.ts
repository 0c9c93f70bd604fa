import { readdir, readFile } from "node:fs/promises";
import { join, relative } from "node:path";
import { describe, expect, it } from "vitest";

const SRC = join(import.meta.dirname, "../src");

async function sources(dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) out.push(...(await sources(path)));
    else if (entry.name.endsWith(".ts")) out.push(path);
  }
  return out;
}

/**
 * Every change of a sandbox's state goes through its actor (sandboxes/sandbox-actor.ts): no other
 * file of the server calls `Ledger.transition` or sets a record's phase, so where a state changes
 * is found by reading that one file and the operations it runs.
 */
describe("the sandbox actor is the only writer of states", () => {
  it("no server source but sandbox-actor.ts calls transition( or sets a phase", async () => {
    const offenders: string[] = [];
    for (const path of await sources(SRC)) {
      const file = relative(SRC, path);
      if (file === join("sandboxes", "sandbox-actor.ts")) continue;
      const text = await readFile(path, "utf8");
      if (/\.transition\(/.test(text)) offenders.push(`${file}: calls .transition(`);
      if (/\.phase\s*=[^=]/.test(text)) offenders.push(`${file}: sets .phase`);
    }
    expect(offenders).toEqual([]);
  });
});
