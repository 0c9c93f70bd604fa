import { BothyError, SANDBOX_STATES, type CommandEvent, type SandboxState } from "@bothy/protocol";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { CommandRegistry } from "../src/commands/command-registry.ts";
import { loadConfig, type Config } from "../src/config.ts";
import { DriverRegistry } from "../src/drivers/driver-registry.ts";
import { Ledger } from "../src/ledger/ledger.ts";
import { ServerEvents } from "../src/events/server-events.ts";
import { canTransition, isIn, TransitionError } from "../src/sandboxes/lifecycle.ts";
import { onSandboxFinal } from "../src/sandboxes/sandbox-final.ts";
import { SandboxManager, type TemplateSource } from "../src/sandboxes/sandbox-manager.ts";
import { Sweeper } from "../src/sandboxes/sweeper.ts";
import { FakeDriver, FakeHost } from "./helpers/fake-driver.ts";

/**
 * Model-based test of the sandbox lifecycle and its actor (sandbox-actor.ts): random sequences
 * of API calls, driver deaths and server crashes and restarts, a death or a restart also landing
 * in the middle of an operation (create, exec, pause, resume, sleep, wake, delete), against a
 * SandboxManager with fake drivers and a real (in-memory) SQLite ledger. After every step the
 * ledger, the manager and the fake host must agree; every state a sandbox showed must follow from
 * the one before along the lifecycle table; a sandbox in a final state was announced
 * (`sandbox_final`) exactly once and has no side state left (no command in the registry). The
 * actor itself refuses to start an operation while another is in flight on the same sandbox
 * (an `internal` error, which fails the run).
 */

type Driver = "qemu" | "gvisor";
type Call = "create" | "exec" | "pause" | "resume" | "sleep" | "delete";
type Op =
  | { t: "create"; driver: Driver }
  /** `a` on sandbox `i` (a create: a new one), with its death or a clean restart `ticks` turns of the event loop into it. */
  | { t: "midKill" | "midRestart"; a: Call; i: number; ticks: number }
  | { t: "exec" | "pause" | "resume" | "sleep" | "delete" | "kill"; i: number }
  | { t: "failNextStart" }
  | { t: "crash" }
  | { t: "restart" }
  | { t: "sweep" }
  | { t: "together"; a: Op; b: Op };

const single: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 3,
    arbitrary: fc.record({ t: fc.constant("create" as const), driver: fc.constantFrom<Driver>("qemu", "gvisor") }),
  },
  {
    weight: 10,
    arbitrary: fc.record({
      t: fc.constantFrom(
        "exec" as const,
        "pause" as const,
        "resume" as const,
        "sleep" as const,
        "delete" as const,
        "kill" as const,
      ),
      i: fc.nat(7),
    }),
  },
  { weight: 1, arbitrary: fc.constant({ t: "failNextStart" as const }) },
  { weight: 1, arbitrary: fc.constant({ t: "crash" as const }) },
  { weight: 1, arbitrary: fc.constant({ t: "restart" as const }) },
  { weight: 1, arbitrary: fc.constant({ t: "sweep" as const }) },
  {
    weight: 3,
    arbitrary: fc.record({
      t: fc.constantFrom("midKill" as const, "midRestart" as const),
      a: fc.constantFrom<Call>("create", "exec", "pause", "resume", "sleep", "delete"),
      i: fc.nat(7),
      ticks: fc.nat(12),
    }),
  },
);
/** A crash is not run alongside a call: the model has no process to kill mid-call (crash-recovery.test.ts does that). */
const concurrent = single.filter((o) => o.t !== "crash" && o.t !== "midKill" && o.t !== "midRestart");
const op: fc.Arbitrary<Op> = fc.oneof(
  { weight: 4, arbitrary: single },
  { weight: 1, arbitrary: fc.record({ t: fc.constant("together" as const), a: concurrent, b: concurrent }) },
);

const template = { name: "seed", hash: "h1", rootfs: "/nonexistent/rootfs", env: {} };
const templates: TemplateSource = {
  resolve: async (name) => (name === "seed" ? template : undefined),
  resolveBuild: async (name, hash) => (name === "seed" && hash === template.hash ? template : undefined),
};

/** Lets every chain of the fakes run to its end: their steps are setImmediate ticks, never timers. */
async function settle(): Promise<void> {
  for (let i = 0; i < 30; i++) await new Promise((r) => setImmediate(r));
}

/** States reachable from `from` along the table in zero or more moves. */
const reachable = (from: SandboxState): Set<SandboxState> => REACHABLE[from];
function reachableFrom(from: SandboxState): Set<SandboxState> {
  const seen = new Set<SandboxState>([from]);
  const queue = [from];
  for (let s = queue.shift(); s !== undefined; s = queue.shift()) {
    for (const to of SANDBOX_STATES) {
      if (seen.has(to) || !canTransition(s, to)) continue;
      seen.add(to);
      queue.push(to);
    }
  }
  return seen;
}

const REACHABLE = Object.fromEntries(SANDBOX_STATES.map((s) => [s, reachableFrom(s)])) as Record<
  SandboxState,
  Set<SandboxState>
>;

/** Codes a call may answer with in these sequences; anything else (e.g. `internal`) is a bug. */
const EXPECTED_CODES = new Set([
  "sandbox_not_running",
  "not_supported",
  "capacity_exhausted",
  "create_failed",
  "agent_unavailable",
  "shutting_down",
]);

class World {
  readonly host = new FakeHost();
  readonly ledger = new Ledger(":memory:");
  readonly config: Config;
  readonly log: string[] = [];
  manager!: SandboxManager;
  drivers!: DriverRegistry;
  /** This server process's command registry (its replay buffers), and the commands it ran per sandbox. */
  registry!: CommandRegistry;
  private commands = new Map<string, Set<string>>();
  /** `sandbox_final` announcements per sandbox, over every process of the run. */
  private readonly finals = new Map<string, number>();
  private lastSeen = new Map<string, SandboxState>();
  steps = 0;

  /** `pool`: one warm sandbox per shape is booted ahead (it has no row until a create claims it). */
  constructor(pool: boolean) {
    this.config = loadConfig({
      BOTHY_HOME: "/nonexistent/bothy-model",
      BOTHY_NETWORK: "off",
      BOTHY_MAX_SANDBOXES: "4",
      BOTHY_POOL_SIZE: pool ? "1" : "0",
      // The shapes the model creates, so its creates claim from the pool.
      BOTHY_POOL_SHAPES: "seed:1:256:gvisor,seed:1:256:qemu",
    });
  }

  async boot(): Promise<void> {
    const drivers = (this.drivers = new DriverRegistry(
      new Map([
        ["qemu", new FakeDriver("qemu", this.host)],
        ["gvisor", new FakeDriver("gvisor", this.host)],
      ]),
      new Map(),
      "gvisor",
      "fake",
    ));
    // One process's memory: a new bus and registry, wired as server.ts wires them.
    const bus = new ServerEvents();
    const registry = (this.registry = new CommandRegistry(this.ledger, {
      replayBytes: 1024,
      keepFinished: 50,
      log: () => undefined,
      onExited: (info) => this.manager.commandEnded(info.sandbox_id),
    }));
    this.commands = new Map();
    onSandboxFinal(bus, (id) => registry.forget(id));
    bus.subscribe((ev) => {
      if (ev.event === "sandbox_final") this.finals.set(ev.sandbox_id, (this.finals.get(ev.sandbox_id) ?? 0) + 1);
    });
    this.manager = new SandboxManager(this.config, this.ledger, drivers, templates, (event, fields) => {
      this.log.push(`${event} ${JSON.stringify(fields)}`);
      bus.emit(event, fields);
    });
    await this.manager.reconcile();
  }

  /** Any sandbox ever made, deleted and failed ones too: calls on them must answer sensibly. */
  pick(i: number): string | undefined {
    const ids = this.ledger.listSandboxes({ includeDeleted: true }).map((r) => r.id);
    return ids.length === 0 ? undefined : ids[i % ids.length];
  }

  state(id: string): SandboxState | undefined {
    return this.ledger.getSandbox(id)?.state;
  }

  async run(o: Op): Promise<void> {
    this.log.push(`> ${JSON.stringify(o)}`);
    switch (o.t) {
      case "together": {
        // A restart's stop runs alongside the other call, and its replacement starts once both are done:
        // two server processes never share the ledger.
        const restart = o.a.t === "restart" || o.b.t === "restart";
        const run = (x: Op): Promise<void> => (x.t === "restart" ? this.manager.close() : this.run(x));
        const results = await Promise.allSettled([run(o.a), run(o.b)]);
        for (const r of results) if (r.status === "rejected") throw r.reason;
        if (restart) await this.boot();
        return;
      }
      case "create": {
        try {
          const { sandbox } = await this.manager.create(
            { template: "seed", driver: o.driver, vcpu: 1, memory_mib: 256 },
            undefined,
          );
          expect(this.state(sandbox.sandbox_id)).toBe("running");
        } catch (err) {
          expected(err);
        }
        return;
      }
      case "failNextStart":
        this.host.failStarts++;
        return;
      case "crash": {
        await settle();
        this.host.crashServer(new Set(["qemu"]));
        await this.boot();
        return;
      }
      case "restart":
        await this.manager.close();
        await this.boot();
        return;
      case "sweep": {
        const sweeper = new Sweeper(this.manager, this.ledger, this.drivers, 1_000_000, () => undefined);
        await sweeper.sweep();
        await sweeper.sweep();
        return;
      }
      case "midKill":
      case "midRestart": {
        const call: Op =
          o.a === "create" ? { t: "create", driver: o.i % 2 === 0 ? "qemu" : "gvisor" } : { t: o.a, i: o.i };
        const running = this.run(call);
        for (let k = 0; k < o.ticks; k++) await new Promise((r) => setImmediate(r));
        if (o.t === "midKill") {
          // The sandbox the call is about; a create's is the newest row.
          const rows = this.ledger.listSandboxes({ includeDeleted: true });
          const id = o.a === "create" ? rows[rows.length - 1]?.id : this.pick(o.i);
          if (id !== undefined) this.host.kill(id);
          await running;
          return;
        }
        // A clean restart's stop runs alongside the call; its replacement starts once both are done.
        const results = await Promise.allSettled([running, this.manager.close()]);
        for (const r of results) if (r.status === "rejected") throw r.reason;
        await this.boot();
        return;
      }
    }
    const id = this.pick(o.i);
    if (id === undefined) return;
    if (o.t === "kill") {
      this.host.kill(id);
      return;
    }
    const before = this.state(id);
    try {
      switch (o.t) {
        case "exec": {
          await this.manager.ensureRunning(id);
          const registry = this.registry;
          const cmd = registry.start(id, this.manager.agent(id), { cmd: "true" });
          this.commands.set(id, (this.commands.get(id) ?? new Set()).add(cmd.id));
          const end = await new Promise<CommandEvent>((resolve) =>
            cmd.attach((ev) => (ev.type === "process_exited" || ev.type === "error") && resolve(ev), true),
          );
          if (end.type === "error" && !EXPECTED_CODES.has(end.code))
            throw new Error(`exec: ${end.code} ${end.message}`);
          break;
        }
        case "pause":
          await this.manager.pause(id);
          break;
        case "resume":
          await this.manager.resume(id);
          break;
        case "sleep":
          await this.manager.sleep(id);
          break;
        case "delete":
          await this.manager.delete(id);
          // The answer comes once it is marked; the teardown may still run (check() holds it to that).
          if (before !== "failed" && before !== "deleted") expect(["deleting", "deleted"]).toContain(this.state(id));
          break;
      }
    } catch (err) {
      expected(err);
    }
  }

  /** The ledger, the manager and the fake host agree, and every state change followed the table. */
  check(): void {
    const live = this.manager.liveIds();
    const rows = this.ledger.listSandboxes({ includeDeleted: true });
    const rowIds = new Set(rows.map((r) => r.id));
    const owned = this.manager.ownedIds();
    for (const id of this.host.ids()) assert(rowIds.has(id) || owned.has(id), `orphan ${id} on the host`);
    for (const row of rows) {
      const m = this.host.machines.get(row.id);
      const where = `${row.id} (${row.driver}) is ${row.state}`;
      const previous = this.lastSeen.get(row.id) ?? "creating";
      assert(reachable(previous).has(row.state), `${row.id} went from ${previous} to ${row.state}`);
      this.lastSeen.set(row.id, row.state);
      const finals = this.finals.get(row.id) ?? 0;
      assert(finals === (isIn("final", row.state) ? 1 : 0), `${where}: announced final ${finals} times`);
      if (isIn("final", row.state))
        for (const cmd of this.commands.get(row.id) ?? [])
          assert(this.registry.get(row.id, cmd) === undefined, `${where}: command ${cmd} still in the registry`);
      switch (row.state) {
        case "creating":
          throw new Error(`${where} with nothing in flight`);
        case "deleting":
          // Its teardown runs in the background: the manager must still answer for it.
          assert(owned.has(row.id), `${where} with nothing in flight`);
          assert(!live.has(row.id), `${where}: the manager still holds it`);
          break;
        case "running":
          assert(m?.guest !== undefined, `${where}: no guest runs`);
          assert(live.has(row.id), `${where}: the manager holds no handle`);
          this.manager.agent(row.id);
          break;
        case "paused":
          assert(m?.guest === undefined, `${where}: a guest runs`);
          assert(m?.disk === true && m.savedMemory, `${where}: disk or memory lost`);
          break;
        case "stopped":
          assert(m?.guest === undefined, `${where}: a guest runs`);
          assert(m?.disk === true, `${where}: disk lost`);
          assert(!live.has(row.id), `${where}: the manager still holds it`);
          break;
        case "deleted":
        case "failed":
          assert(m === undefined, `${where}: host objects left`);
          assert(!live.has(row.id), `${where}: the manager still holds it`);
          break;
      }
    }
  }
}

/** A step that never ends is a bug (a promise nobody settles); it fails with the log instead of stalling the run. */
async function hangGuard(step: Promise<void>, log: () => string[]): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const hung = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`step hung:\n${log().slice(-30).join("\n")}`)), 10_000);
  });
  try {
    await Promise.race([step, hung]);
  } finally {
    clearTimeout(timer);
  }
}

function assert(ok: boolean, message: string): void {
  if (!ok) throw new Error(message);
}

function expected(err: unknown): void {
  if (err instanceof TransitionError || !(err instanceof BothyError) || !EXPECTED_CODES.has(err.code)) throw err;
}

/**
 * The property: a random sequence of operations keeps the ledger, the manager and the host in
 * agreement after every step; `onStep` counts them.
 */
function modelProperty(onStep: () => void) {
  const ops = fc.array(op, { minLength: 1, maxLength: 60, size: "max" });
  return fc.asyncProperty(fc.boolean(), ops, async (pool, ops) => {
    const world = new World(pool);
    try {
      await world.boot();
      for (const o of ops) {
        await hangGuard(world.run(o), () => world.log);
        await settle();
        world.check();
        onStep();
      }
      await hangGuard(world.manager.close(), () => world.log);
      await settle();
      world.check();
    } catch (err) {
      throw new Error(`${(err as Error).message}\n--- log (last 40) ---\n${world.log.slice(-40).join("\n")}`, {
        cause: err,
      });
    } finally {
      world.ledger.close();
    }
  });
}

/** Seeds whose batch once found a bug, replayed on every run. */
const FOUND_BUGS = [
  // A paused VM whose restore failed and whose cold boot died too stayed `paused` with its memory gone.
  353346964,
];

/** MODEL_SEED=s replays the batch of a failure's printed seed. */
describe("lifecycle model", () => {
  it("random sequences of calls, deaths and crashes keep the ledger, the manager and the host in agreement", async () => {
    let steps = 0;
    const property = modelProperty(() => steps++);
    const seed = process.env["MODEL_SEED"];
    if (seed !== undefined) {
      await fc.assert(property, { seed: Number(seed), numRuns: 50, endOnFailure: true });
      return;
    }
    // Batches of sequences until at least 10,000 steps ran; each batch shrinks its own failure.
    while (steps < 10_000) await fc.assert(property, { numRuns: 50 });
  }, 120_000);

  it.each(FOUND_BUGS)(
    "replays seed %i, which once found a bug",
    async (seed) => {
      await fc.assert(
        modelProperty(() => undefined),
        { seed, numRuns: 50, endOnFailure: true },
      );
      // 50 sequences take ~1 s on an idle box; over 5 s (the default) when the box is loaded.
    },
    60_000,
  );
});
