import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { BothyError } from "@bothy/protocol";
import { afterEach, describe, expect, it } from "vitest";
import { CommandRegistry } from "../src/commands/command-registry.ts";
import { E2bState, vaultSealer } from "../src/e2b/e2b-state.ts";
import { Vault } from "../src/gateway/vault.ts";
import { onSandboxFinal } from "../src/sandboxes/sandbox-final.ts";
import { FakeWorld } from "./helpers/fake-world.ts";
import { insertTestSandbox } from "./helpers/ledger-rows.ts";

/**
 * One `sandbox_final` event (issue 26, item 1) drives every cleanup of what is kept per sandbox
 * beside its row: a sandbox that FAILS (boot failure, failed resume, a row the sweeper finds
 * nothing behind) leaves no command record, replay buffer or E2B row, exactly as a deleted one.
 * The side state's owners are the real ones (CommandRegistry, E2bState over the ledger), wired
 * with the same `onSandboxFinal` the server uses.
 */
let world: FakeWorld | undefined;
let home: string | undefined;
afterEach(async () => {
  await world?.manager.close();
  await world?.ledger.close();
  world = undefined;
  if (home) await rm(home, { recursive: true, force: true });
  home = undefined;
});

async function setUp(env: Record<string, string> = {}): Promise<{
  w: FakeWorld;
  registry: CommandRegistry;
  e2b: E2bState;
  finals: Array<{ id: string; state: string }>;
}> {
  const w = (world = await new FakeWorld(env).open());
  home = await mkdtemp(join(tmpdir(), "bothy-final-"));
  const registry = new CommandRegistry(w.ledger, {
    replayBytes: 4096,
    keepFinished: 50,
    log: () => undefined,
    onExited: () => undefined,
  });
  const e2b = new E2bState(w.ledger.e2b, vaultSealer(await Vault.open(home, w.ledger.secrets)));
  onSandboxFinal(w.bus, (id) => registry.forget(id));
  onSandboxFinal(w.bus, (id) => e2b.forget(id));
  const finals: Array<{ id: string; state: string }> = [];
  w.bus.subscribe((ev) => {
    if (ev.event === "sandbox_final") finals.push({ id: ev.sandbox_id, state: ev.state });
  });
  await w.boot();
  return { w, registry, e2b, finals };
}

/** Side state a sandbox's commands and its E2B create leave: a finished command (with its replay buffer), envVars, a pid. */
async function leaveSideState(w: FakeWorld, registry: CommandRegistry, e2b: E2bState, id: string): Promise<string> {
  const cmd = registry.start(id, await w.manager.agent(id), { cmd: "true" });
  await new Promise<void>((resolve) => cmd.attach((ev) => ev.type === "process_exited" && resolve(), true));
  await e2b.setEnv(id, { TOKEN: "side-state" });
  e2b.addProcess(id, 7, { commandId: cmd.id, config: { cmd: "true", args: [], envs: {}, cwd: "/" }, pty: false });
  expect(registry.get(id, cmd.id)).toBeDefined();
  return cmd.id;
}

async function expectNoSideState(
  w: FakeWorld,
  registry: CommandRegistry,
  e2b: E2bState,
  id: string,
  commandId?: string,
): Promise<void> {
  await e2b.flush();
  if (commandId !== undefined) expect(registry.get(id, commandId), "replay buffer kept").toBeUndefined();
  expect(registry.running(id)).toBe(0);
  expect(await w.ledger.e2b.env(id), "E2B envVars row kept").toBeUndefined();
  expect(await w.ledger.e2b.processes(id), "E2B pid rows kept").toEqual([]);
  expect((await w.ledger.listCommands(id)).filter((c) => c.state === "running")).toEqual([]);
  expect(w.manager.ownedIds().has(id), "the manager still answers for it").toBe(false);
  expect(w.host.machines.has(id), "host objects left").toBe(false);
}

describe("sandbox_final", () => {
  it("a create whose boot fails is final once, and nothing of it is left", async () => {
    const { w, registry, e2b, finals } = await setUp();
    w.host.failStarts = 1;
    const err = await w.create({ driver: "gvisor" }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(BothyError);
    const id = (await w.ledger.listSandboxes({ includeDeleted: true }))[0]?.id ?? "";
    expect(await w.state(id)).toBe("failed");
    expect(finals).toEqual([{ id, state: "failed" }]);
    await expectNoSideState(w, registry, e2b, id);
  });

  it("a sandbox whose resume fails leaves no command record, replay buffer or E2B row", async () => {
    const { w, registry, e2b, finals } = await setUp();
    const id = await w.create({ driver: "qemu" });
    const commandId = await leaveSideState(w, registry, e2b, id);
    await w.manager.pause(id);
    w.host.failStarts = 1;
    await expect(w.manager.resume(id)).rejects.toBeInstanceOf(BothyError);
    expect(await w.state(id)).toBe("failed");
    expect(finals).toEqual([{ id, state: "failed" }]);
    await w.sweep();
    await expectNoSideState(w, registry, e2b, id, commandId);
  });

  it("a row the sweeper finds nothing behind is failed, and its side state goes with it", async () => {
    const { w, registry, e2b, finals } = await setUp();
    const id = await w.create({ driver: "gvisor" });
    const commandId = await leaveSideState(w, registry, e2b, id);
    // Another sandbox's row that no process stands behind (as a server that lost track of it would leave).
    const orphan = "sbx_orphanorphanorphan00";
    await insertTestSandbox(w.ledger, { id: orphan, state: "running" });
    await e2b.setEnv(orphan, { TOKEN: "side-state" });
    await w.sweep();
    expect(await w.state(orphan)).toBe("failed");
    expect(await w.state(id)).toBe("running");
    expect(finals).toEqual([{ id: orphan, state: "failed" }]);
    await expectNoSideState(w, registry, e2b, orphan);
    expect(registry.get(id, commandId), "a live sandbox keeps its own").toBeDefined();
  });

  it("a deleted sandbox's side state goes on the same event", async () => {
    const { w, registry, e2b, finals } = await setUp();
    const id = await w.create({ driver: "gvisor" });
    const commandId = await leaveSideState(w, registry, e2b, id);
    await w.manager.delete(id, "requested", { wait: true });
    expect(await w.state(id)).toBe("deleted");
    expect(finals).toEqual([{ id, state: "deleted" }]);
    await expectNoSideState(w, registry, e2b, id, commandId);
  });
});
