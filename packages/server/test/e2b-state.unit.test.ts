import { mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { E2bState, vaultSealer } from "../src/e2b/e2b-state.ts";
import { Vault } from "../src/gateway/vault.ts";
import { openStore, type LedgerStore } from "../src/ledger/store.ts";
import { insertTestSandbox } from "./helpers/ledger-rows.ts";

/**
 * The E2B create's envVars and the pid → command map outlive the server's process (issue 26,
 * item 2): a new process on the same home reads them back; the envVars never sit in the ledger in
 * clear. The real-restart test is in e2b-restart.test.ts.
 */
describe("E2B state kept in the ledger", () => {
  let home: string;
  let ledger: LedgerStore;
  let state: E2bState | undefined;
  beforeEach(async () => {
    home = await mkdtemp(join(tmpdir(), "bothy-e2b-state-"));
  });
  afterEach(async () => {
    await ledger.close();
    await rm(home, { recursive: true, force: true });
  });

  /** One "server process": the ledger and the vault of `home`; the state is read for sandbox `id`. */
  async function open(): Promise<E2bState> {
    ledger = await openStore({ sqlitePath: join(home, "ledger.db") });
    state = new E2bState(ledger.e2b, vaultSealer(await Vault.open(home, ledger.secrets)));
    await state.ready(id);
    return state;
  }

  /** The process ends: its writes land first, as a server's stop waits for them. */
  async function end(): Promise<void> {
    await state?.flush();
    await ledger.close();
  }

  function insertSandbox(id: string): Promise<unknown> {
    return insertTestSandbox(ledger, { id, driver: "gvisor", acceleration: null, tenant: "default" });
  }

  const id = "sbx_aaaaaaaaaaaaaaaaaaaa";
  const secret = "sk-live-0123456789abcdef-not-in-the-ledger";

  it("a new process reads back the envVars and the pid map; a process's own envs stay in memory", async () => {
    state = await open();
    await insertSandbox(id);
    await state.setEnv(id, { API_KEY: secret, MODE: "test" });
    state.addProcess(id, 42, {
      commandId: "cmd_1",
      config: { cmd: "/bin/bash", args: ["-l", "-c", "sleep 600"], envs: { ONE_OFF: secret }, cwd: "/workspace" },
      pty: false,
      tag: "sleeper",
    });
    state.markSignalled(id, 42, "SIGTERM");
    await end();

    state = await open();
    expect(state.env(id)).toEqual({ API_KEY: secret, MODE: "test" });
    expect(state.process(id, 42)).toEqual({
      commandId: "cmd_1",
      config: { cmd: "/bin/bash", args: ["-l", "-c", "sleep 600"], envs: {}, cwd: "/workspace" },
      pty: false,
      tag: "sleeper",
      signalled: "SIGTERM",
    });
    state.dropProcess(id, 42);
    await end();
    state = await open();
    expect(state.listProcesses(id)).toEqual([]);
    expect(state.env(id)).toEqual({ API_KEY: secret, MODE: "test" });
  });

  it("keeps no envVar value in clear in the ledger's files", async () => {
    state = await open();
    await insertSandbox(id);
    await state.setEnv(id, { API_KEY: secret });
    state.addProcess(id, 7, { commandId: "c", config: { cmd: "env", args: [], envs: { X: secret } }, pty: false });
    await end();
    for (const f of (await readdir(home)).filter((n) => n.startsWith("ledger.db")))
      expect((await readFile(join(home, f))).includes(secret)).toBe(false);
    await open(); // for afterEach's close
  });

  it("forgets all of a sandbox that ended for good", async () => {
    state = await open();
    await insertSandbox(id);
    await state.setEnv(id, { A: "1" });
    state.addProcess(id, 9, { commandId: "c", config: { cmd: "true", args: [], envs: {} }, pty: false });
    state.forget(id);
    await end();
    state = await open();
    expect(state.env(id)).toEqual({});
    expect(state.listProcesses(id)).toEqual([]);
  });
});
