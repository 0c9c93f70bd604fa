import { DORMANT_STATES, LIVE_STATES, SANDBOX_STATES, type SandboxState } from "@bothy/protocol";
import { afterEach, describe, expect, it } from "vitest";
import { Ledger } from "../src/ledger/ledger.ts";
import { canTransition, isIn, LIFECYCLE, sqlStates, statesIn, TransitionError } from "../src/sandboxes/lifecycle.ts";
import { insertTestSandbox } from "./helpers/ledger-rows.ts";

function insert(ledger: Ledger, id: string, state: SandboxState = "creating"): void {
  insertTestSandbox(ledger, { id, state });
}

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
  let ledger: Ledger | undefined;
  afterEach(() => ledger?.close());

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

  it("the ledger makes every allowed move and refuses every other with the row unchanged", () => {
    ledger = new Ledger(":memory:");
    let n = 0;
    for (const from of SANDBOX_STATES) {
      for (const to of SANDBOX_STATES) {
        const id = `sbx_${String(n++).padStart(20, "0")}`;
        insert(ledger, id);
        let at: SandboxState = "creating";
        for (const step of PATH_TO[from]) {
          ledger.transition(id, at, step);
          at = step;
        }
        expect(ledger.getSandbox(id)?.state).toBe(from);
        if (canTransition(from, to)) {
          ledger.transition(id, from, to, "why");
          expect(ledger.getSandbox(id)?.state).toBe(to);
        } else {
          const err = catchError(() => ledger?.transition(id, from, to));
          expect(err).toBeInstanceOf(TransitionError);
          expect(err).toMatchObject({ kind: "illegal", code: "internal", sandboxId: id, from, to, actual: from });
          expect(ledger.getSandbox(id)?.state).toBe(from);
        }
      }
    }
  });

  it("compare-and-set: a move from a state the row is no longer in is refused, and changes nothing", () => {
    ledger = new Ledger(":memory:");
    const id = "sbx_aaaaaaaaaaaaaaaaaaaa";
    insert(ledger, id);
    ledger.transition(id, "creating", "running");
    ledger.transition(id, "running", "stopped", "it died");
    // A decision taken when the row said running: pausing it now would resurrect a dead sandbox.
    const err = catchError(() => ledger?.transition(id, "running", "paused"));
    expect(err).toBeInstanceOf(TransitionError);
    expect(err).toMatchObject({ kind: "stale", code: "sandbox_not_running", from: "running", actual: "stopped" });
    expect(ledger.getSandbox(id)).toMatchObject({ state: "stopped", error: "it died" });

    const missing = catchError(() => ledger?.transition("sbx_bbbbbbbbbbbbbbbbbbbb", "running", "stopped"));
    expect(missing).toMatchObject({ kind: "stale", code: "sandbox_not_found", actual: undefined });
  });

  it("records deleted_at on delete and keeps the first reason given", () => {
    ledger = new Ledger(":memory:");
    const id = "sbx_cccccccccccccccccccc";
    insert(ledger, id, "running");
    ledger.transition(id, "running", "stopped", "asleep");
    ledger.transition(id, "stopped", "deleting");
    expect(ledger.getSandbox(id)).toMatchObject({ deleted_at: null, error: "asleep" });
    ledger.transition(id, "deleting", "deleted");
    expect(ledger.getSandbox(id)?.deleted_at).toEqual(expect.any(String));
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

  it("the ledger's queries select by the table's sets", () => {
    ledger = new Ledger(":memory:");
    const ids = new Map<SandboxState, string>();
    SANDBOX_STATES.forEach((s, n) => {
      const id = `sbx_${String(n).padStart(20, "e")}`;
      ids.set(s, id);
      insert(ledger!, id);
      let at: SandboxState = "creating";
      for (const step of PATH_TO[s]) {
        ledger!.transition(id, at, step);
        at = step;
      }
      ledger!.setExpiresAt(id, "2000-01-01T00:00:00.000Z");
    });
    const of = (rows: Array<{ id: string }>): string[] => rows.map((r) => r.id).sort();
    const idsIn = (set: Parameters<typeof statesIn>[0]): string[] =>
      statesIn(set)
        .map((s) => ids.get(s) ?? "")
        .sort();
    expect(of(ledger.liveSandboxes())).toEqual(idsIn("live"));
    expect(of(ledger.expiredSandboxes(new Date().toISOString()))).toEqual(idsIn("expirable"));
    expect(of(ledger.listSandboxes())).toEqual(idsIn("live"));
    expect(ledger.auth.liveUsage("default").sandboxes).toBe(statesIn("active").length);
  });

  it("a row starts as creating or running only", () => {
    ledger = new Ledger(":memory:");
    expect(() => ledger && insert(ledger, "sbx_dddddddddddddddddddd", "paused")).toThrow(
      /starts as creating or running/,
    );
  });
});

function catchError(fn: () => void): unknown {
  try {
    fn();
  } catch (err) {
    return err;
  }
  throw new Error("expected an error");
}
