import { DORMANT_STATES, LIVE_STATES, SANDBOX_STATES, type SandboxState } from "@bothy/protocol";
import { describe, expect, it } from "vitest";
import type { LedgerStore } from "../src/ledger/store.ts";
import { canTransition, isIn, LIFECYCLE, sqlStates, statesIn, TransitionError } from "../src/sandboxes/lifecycle.ts";
import { insertStoreSandbox, STORES, useStores } from "./helpers/stores.ts";

async function insert(ledger: LedgerStore, id: string, state: SandboxState = "creating"): Promise<void> {
  await insertStoreSandbox(ledger, { id, state });
}

const stores = useStores();

/** Drives a new row along allowed moves to `state`. */
const PATH_TO: Record<SandboxState, SandboxState[]> = {
  creating: [],
  running: ["running"],
  paused: ["running", "paused"],
  stopped: ["running", "stopped"],
  deleting: ["running", "deleting"],
  deleted: ["running", "deleting", "deleted"],
  failed: ["failed"],
};

describe("lifecycle table", () => {
  it("has a row for every state, only known targets, and final states with no way out", () => {
    expect(Object.keys(LIFECYCLE).sort()).toEqual([...SANDBOX_STATES].sort());
    for (const from of SANDBOX_STATES)
      for (const to of Object.keys(LIFECYCLE[from].to)) expect(SANDBOX_STATES).toContain(to);
    expect(Object.keys(LIFECYCLE.deleted.to)).toEqual([]);
    expect(Object.keys(LIFECYCLE.failed.to)).toEqual([]);
    for (const from of SANDBOX_STATES) expect(canTransition(from, from)).toBe(false);
  });

  it("every state is reachable from creating", () => {
    const seen = new Set<SandboxState>(["creating"]);
    const queue: SandboxState[] = ["creating"];
    for (let s = queue.shift(); s !== undefined; s = queue.shift())
      for (const to of Object.keys(LIFECYCLE[s].to) as SandboxState[]) {
        if (seen.has(to)) continue;
        seen.add(to);
        queue.push(to);
      }
    expect([...seen].sort()).toEqual([...SANDBOX_STATES].sort());
  });

  it("the state sets are columns of the table, consistent with its moves and with the protocol's lists", () => {
    // Final states have no way out, and only they; a dormant or expirable sandbox is active and live.
    for (const s of SANDBOX_STATES) {
      expect(isIn("final", s)).toBe(Object.keys(LIFECYCLE[s].to).length === 0);
      expect(isIn("live", s)).toBe(!isIn("final", s));
      if (isIn("dormant", s) || isIn("expirable", s)) expect(isIn("active", s)).toBe(true);
      if (isIn("servable", s)) expect(isIn("live", s)).toBe(true);
    }
    expect(statesIn("live")).toEqual(LIVE_STATES);
    expect(statesIn("dormant")).toEqual(DORMANT_STATES);
    expect(sqlStates("final")).toBe("'deleted', 'failed'");
    expect(sqlStates("expirable")).toBe("'running', 'paused', 'stopped'");
  });
});

describe.each(STORES)("lifecycle table in the %s ledger", (kind) => {
  it("the ledger makes every allowed move and refuses every other with the row unchanged", async () => {
    const ledger = await stores.open(kind);
    let n = 0;
    for (const from of SANDBOX_STATES) {
      for (const to of SANDBOX_STATES) {
        const id = `sbx_${String(n++).padStart(20, "0")}`;
        await insert(ledger, id);
        let at: SandboxState = "creating";
        for (const step of PATH_TO[from]) {
          await ledger.transition(id, at, step);
          at = step;
        }
        expect((await ledger.getSandbox(id))?.state).toBe(from);
        if (canTransition(from, to)) {
          await ledger.transition(id, from, to, "why");
          expect((await ledger.getSandbox(id))?.state).toBe(to);
        } else {
          const err = await catchError(() => ledger.transition(id, from, to));
          expect(err).toBeInstanceOf(TransitionError);
          expect(err).toMatchObject({ kind: "illegal", code: "internal", sandboxId: id, from, to, actual: from });
          expect((await ledger.getSandbox(id))?.state).toBe(from);
        }
      }
    }
  });

  it("compare-and-set: a move from a state the row is no longer in is refused, and changes nothing", async () => {
    const ledger = await stores.open(kind);
    const id = "sbx_aaaaaaaaaaaaaaaaaaaa";
    await insert(ledger, id);
    await ledger.transition(id, "creating", "running");
    await ledger.transition(id, "running", "stopped", "it died");
    // A decision taken when the row said running: pausing it now would resurrect a dead sandbox.
    const err = await catchError(() => ledger.transition(id, "running", "paused"));
    expect(err).toBeInstanceOf(TransitionError);
    expect(err).toMatchObject({ kind: "stale", code: "sandbox_not_running", from: "running", actual: "stopped" });
    expect(await ledger.getSandbox(id)).toMatchObject({ state: "stopped", error: "it died" });

    const missing = await catchError(() => ledger.transition("sbx_bbbbbbbbbbbbbbbbbbbb", "running", "stopped"));
    expect(missing).toMatchObject({ kind: "stale", code: "sandbox_not_found", actual: undefined });
  });

  it("compare-and-set under contention: of moves from one state sent at once, exactly one lands", async () => {
    const ledger = await stores.open(kind);
    const id = "sbx_ffffffffffffffffffff";
    await insert(ledger, id, "running");
    const targets: SandboxState[] = [
      "paused",
      "stopped",
      "deleting",
      "failed",
      "paused",
      "stopped",
      "deleting",
      "failed",
    ];
    const results = await Promise.allSettled(targets.map((to) => ledger.transition(id, "running", to, to)));
    const won = results.flatMap((r, i) => (r.status === "fulfilled" ? [targets[i]] : []));
    expect(won).toHaveLength(1);
    for (const r of results)
      if (r.status === "rejected") expect(r.reason).toMatchObject({ kind: "stale", from: "running", actual: won[0] });
    expect(await ledger.getSandbox(id)).toMatchObject({ state: won[0], error: won[0] });
  });

  it("records deleted_at on delete and keeps the first reason given", async () => {
    const ledger = await stores.open(kind);
    const id = "sbx_cccccccccccccccccccc";
    await insert(ledger, id, "running");
    await ledger.transition(id, "running", "stopped", "asleep");
    await ledger.transition(id, "stopped", "deleting");
    expect(await ledger.getSandbox(id)).toMatchObject({ deleted_at: null, error: "asleep" });
    await ledger.transition(id, "deleting", "deleted");
    expect((await ledger.getSandbox(id))?.deleted_at).toEqual(expect.any(String));
  });

  it("the ledger's queries select by the table's sets", async () => {
    const ledger = await stores.open(kind);
    const ids = new Map<SandboxState, string>();
    for (const [n, s] of SANDBOX_STATES.entries()) {
      const id = `sbx_${String(n).padStart(20, "e")}`;
      ids.set(s, id);
      await insert(ledger, id);
      let at: SandboxState = "creating";
      for (const step of PATH_TO[s]) {
        await ledger.transition(id, at, step);
        at = step;
      }
      await ledger.setExpiresAt(id, "2000-01-01T00:00:00.000Z");
    }
    const of = (rows: Array<{ id: string }>): string[] => rows.map((r) => r.id).sort();
    const idsIn = (set: Parameters<typeof statesIn>[0]): string[] =>
      statesIn(set)
        .map((s) => ids.get(s) ?? "")
        .sort();
    expect(of(await ledger.liveSandboxes())).toEqual(idsIn("live"));
    expect(of(await ledger.expiredSandboxes(new Date().toISOString()))).toEqual(idsIn("expirable"));
    expect(of(await ledger.listSandboxes())).toEqual(idsIn("live"));
    expect((await ledger.auth.liveUsage("default")).sandboxes).toBe(statesIn("active").length);
  });

  it("a row starts as creating or running only", async () => {
    const ledger = await stores.open(kind);
    await expect(insert(ledger, "sbx_dddddddddddddddddddd", "paused")).rejects.toThrow(/starts as creating or running/);
  });
});

async function catchError(fn: () => Promise<unknown>): Promise<unknown> {
  try {
    await fn();
  } catch (err) {
    return err;
  }
  throw new Error("expected an error");
}
