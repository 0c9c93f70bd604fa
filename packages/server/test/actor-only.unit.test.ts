import { readdir, readFile } from "node:fs/promises";
import { join, relative } from "node:path";
import ts from "typescript";
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
      // The actor's ledger on a cluster node: the store's `transition`, fenced, which only the actor calls.
      if (file === join("sandboxes", "sandbox-actor.ts") || file === join("cluster", "node-ledger.ts")) continue;
      const text = await readFile(path, "utf8");
      if (/\.transition\(/.test(text)) offenders.push(`${file}: calls .transition(`);
      if (/\.phase\s*=[^=]/.test(text)) offenders.push(`${file}: sets .phase`);
    }
    expect(offenders).toEqual([]);
  });
});

/**
 * The fields of `SandboxRecord`, but its phase, that are a promise (anything with a `then`) or an
 * object holding one, read with the TypeScript checker so that an alias or an imported type is
 * seen through. Only the server's own sources are loaded (`types: []`): a record's types are ours.
 */
function promiseSlotsOfRecord(): string[] {
  const file = join(SRC, "sandboxes", "sandbox-records.ts");
  const program = ts.createProgram([file], {
    strict: true,
    noEmit: true,
    skipLibCheck: true,
    types: [],
    allowImportingTsExtensions: true,
    module: ts.ModuleKind.NodeNext,
    moduleResolution: ts.ModuleResolutionKind.NodeNext,
    target: ts.ScriptTarget.ES2022,
    customConditions: ["@bothy/source"],
  });
  const checker = program.getTypeChecker();
  const record = program
    .getSourceFile(file)
    ?.statements.find(
      (s): s is ts.InterfaceDeclaration => ts.isInterfaceDeclaration(s) && s.name.text === "SandboxRecord",
    );
  if (!record) throw new Error("sandbox-records.ts has no SandboxRecord interface");
  const parts = (type: ts.Type): ts.Type[] => (type.isUnion() ? type.types : [type]);
  const isPromise = (type: ts.Type): boolean =>
    parts(type).some(
      (t) => t.getSymbol()?.getName() === "Promise" || checker.getPropertyOfType(t, "then") !== undefined,
    );
  const holdsPromise = (type: ts.Type): boolean =>
    isPromise(type) ||
    parts(type).some((t) =>
      checker.getPropertiesOfType(t).some((p) => isPromise(checker.getTypeOfSymbolAtLocation(p, record))),
    );
  return checker
    .getPropertiesOfType(checker.getTypeAtLocation(record.name))
    .filter((field) => field.getName() !== "phase" && holdsPromise(checker.getTypeOfSymbolAtLocation(field, record)))
    .map((field) => field.getName());
}

/**
 * What is under way on a sandbox (the operation in flight, the queue, a delete, a stop's teardown)
 * lives in the record's one typed phase, which only the actor sets: a promise slot beside it would
 * be a second, unserialized place where a sandbox's fate is decided.
 */
describe("a sandbox record holds no promise of its own", () => {
  it("no field of SandboxRecord is a promise: what is under way is in its phase", () => {
    expect(promiseSlotsOfRecord()).toEqual([]);
  }, 60_000);
});
