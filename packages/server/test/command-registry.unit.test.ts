import { describe, expect, it } from "vitest";
import { BothyError, type CommandEvent } from "@bothy/protocol";
import type { AgentClient, ExecEvents } from "../src/agent/agent-client.ts";
import { CommandRegistry } from "../src/commands/command-registry.ts";
import type { CommandRow, Ledger } from "../src/ledger/ledger.ts";

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
    insertCommand: () => void happened.push("row inserted"),
    finishCommand: (id: string): CommandRow => {
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
  } as unknown as Ledger;
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

describe("CommandRegistry", () => {
  it("records a start before the client hears of it, and an end's record with its answer", () => {
    const { happened, run } = setup();
    run();
    // Synchronously: the rows and the answer; the end's log line and event wait for this turn's end.
    expect(happened).toEqual([
      "row inserted",
      "client got started",
      "log command_started",
      "client got process_exited",
      "row finished",
    ]);
  });

  it("writes the end's log line and event at the end of the same turn of the event loop", async () => {
    const { happened, run } = setup();
    run();
    await new Promise((resolve) => setImmediate(resolve));
    expect(happened.slice(-2)).toEqual(["log command_exited", "onExited"]);
  });

  it("tells of a lost command at once, so its event comes before its sandbox's", () => {
    const { happened, run } = setup();
    run("lost");
    expect(happened.slice(-4)).toEqual(["client got error", "row finished", "log command_lost", "onExited"]);
  });

  it("runs what is deferred when closed, and later ends at once", () => {
    const { happened, registry, run } = setup();
    run();
    registry.close();
    expect(happened.slice(-2)).toEqual(["log command_exited", "onExited"]);
    run();
    expect(happened.slice(-3)).toEqual(["row finished", "log command_exited", "onExited"]);
  });
});
