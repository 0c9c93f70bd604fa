import { describe, expect, it } from "vitest";
import { BothyError, type CommandEvent } from "@bothy/protocol";
import type { AgentClient, ExecEvents } from "../src/agent/agent-client.ts";
import { CommandRegistry } from "../src/commands/command-registry.ts";
import type { CommandRow } from "../src/ledger/ledger.ts";
import type { LedgerStore } from "../src/ledger/store.ts";

/** A registry over a fake agent and ledger that write down, in order, what happened. */
function setup() {
  const happened: string[] = [];
  let events: ExecEvents | undefined;
  const agent = {
    exec: (_options: unknown, e: ExecEvents) => {
      events = e;
      return { signal: () => undefined, stdin: () => undefined, resize: () => undefined };
    },
  } as unknown as AgentClient;
  const ledger = {
    insertCommand: async () => void happened.push("row inserted"),
    finishCommand: async (id: string): Promise<CommandRow> => {
      happened.push("row finished");
      return {
        id,
        sandbox_id: "sbx_a",
        cmd: "true",
        state: "exited",
        background: 0,
        exit_code: 0,
        signal: null,
        timed_out: 0,
        started_at: "",
        ended_at: "",
      } as unknown as CommandRow;
    },
  } as unknown as LedgerStore;
  const registry = new CommandRegistry(ledger, {
    replayBytes: 1024,
    keepFinished: 5,
    log: (event) => void happened.push(`log ${event}`),
    onExited: () => void happened.push("onExited"),
  });
  const run = (end: "exit" | "lost" = "exit"): void => {
    const command = registry.start("sbx_a", agent, { cmd: "true" });
    command.attach((ev: CommandEvent) => void happened.push(`client got ${ev.type}`), false);
    events?.onStarted(7);
    if (end === "exit") events?.onExited(0, null);
    else events?.onError(new BothyError("agent_unavailable", "The channel closed."));
  };
  return { happened, registry, run };
}

/** Lets the fake ledger's writes (promises resolved at once) land: every microtask queued so far runs first. */
const landed = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

describe("CommandRegistry", () => {
  it("writes a start's record before the client hears of it, and an end's record after its answer", async () => {
    const { happened, run } = setup();
    run();
    // Synchronously: the start's row and the answer; the end's row once the start's has landed.
    expect(happened).toEqual([
      "row inserted",
      "client got started",
      "log command_started",
      "client got process_exited",
    ]);
    await landed();
    expect(happened.slice(-1)).toEqual(["row finished"]);
  });

  it("writes the end's log line and event at the end of the turn its record landed in", async () => {
    const { happened, run } = setup();
    run();
    await landed();
    expect(happened.slice(-1)).toEqual(["row finished"]);
    await landed();
    expect(happened.slice(-2)).toEqual(["log command_exited", "onExited"]);
  });

  it("tells of a lost command once its record is written, in this turn of the event loop", async () => {
    const { happened, run } = setup();
    run("lost");
    await landed();
    await landed();
    expect(happened.slice(-4)).toEqual(["client got error", "row finished", "log command_lost", "onExited"]);
  });

  it("waits for the records and runs what is deferred when closed, and later ends without waiting for the turn", async () => {
    const { happened, registry, run } = setup();
    run();
    await registry.close();
    expect(happened.slice(-3)).toEqual(["row finished", "log command_exited", "onExited"]);
    run();
    await landed();
    await landed();
    expect(happened.slice(-3)).toEqual(["row finished", "log command_exited", "onExited"]);
  });
});
