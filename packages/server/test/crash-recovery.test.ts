/**
 * Crash recovery: a real `bothy serve` process is killed with SIGKILL at random moments while it
 * creates, writes to, runs commands in and deletes sandboxes (and pauses them, on QEMU). After
 * every restart the ledger and the host must agree: nothing half-made, no delete left hanging,
 * no process, mount or directory without its sandbox, and every sandbox that was made keeps the
 * files written to it and starts again on the next call.
 */
import { mkdtemp, readdir, rm } from "node:fs/promises";
import { join } from "node:path";
import Database from "better-sqlite3";
import { afterAll, describe, expect, it } from "vitest";
import { api, runCommand } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { hostLeaks, noLeaks } from "./helpers/host-state.ts";
import { spawnTestServe, type ServeProcess } from "./helpers/serve-process.ts";

/** A small seeded generator, so a failing run can be replayed with BOTHY_CRASH_SEED. */
function random(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

/** `items` in a random order (Fisher-Yates). */
function shuffled<T>(items: readonly T[], rand: () => number): T[] {
  const out = [...items];
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [out[i], out[j]] = [out[j] as T, out[i] as T];
  }
  return out;
}

type Op = "create" | "write" | "read" | "command" | "delete" | "pause";

interface Plan {
  ops: number;
  /** Each operation is cut by a SIGKILL of the server with this probability... */
  killChance: number;
  /** ...at a moment up to about as long as the operation takes (waking a stopped sandbox included). */
  killWithinMs: Record<Op, number>;
  timeoutMs: number;
}

/**
 * Few operations, each kind drawn about equally often: the long random sequences (every call, a
 * driver death or a restart in the middle of each) are lifecycle-model.unit.test.ts's, against
 * fake drivers in milliseconds; this test is for what only real processes show (a kill -9 of the
 * real server, the host's processes, mounts and cgroups, the SQLite file on disk).
 */
const PLANS: Record<string, Plan> = {
  gvisor: {
    ops: 12,
    killChance: 0.7,
    killWithinMs: { create: 900, write: 700, read: 600, command: 1500, delete: 250, pause: 0 },
    timeoutMs: 600_000,
  },
  // Under emulation a boot takes seconds: kills spread wider.
  qemu: {
    ops: 12,
    killChance: 0.7,
    killWithinMs: { create: 4000, write: 1500, read: 1000, command: 2000, delete: 1500, pause: 2500 },
    timeoutMs: 900_000,
  },
};

for (const driver of testDrivers()) {
  const plan = PLANS[driver.name] ?? PLANS["gvisor"]!;
  describe.skipIf(driver.missing !== undefined)(driverTitle(driver, "crash recovery"), () => {
    let home = "";
    let serve: ServeProcess | undefined;

    afterAll(async () => {
      await serve?.stop();
      if (home) await rm(home, { recursive: true, force: true });
    });

    async function start(): Promise<string> {
      serve = spawnTestServe(home, { BOTHY_DRIVER: driver.name });
      return serve.url;
    }

    function rows(): Map<string, string> {
      const db = new Database(join(home, "ledger.sqlite"), { readonly: true, fileMustExist: true });
      try {
        return new Map(
          (db.prepare(`SELECT id, state FROM sandboxes`).all() as Array<{ id: string; state: string }>).map((r) => [
            r.id,
            r.state,
          ]),
        );
      } finally {
        db.close();
      }
    }

    /**
     * Right after a (re)start nothing is half-made or half-deleted; only sandboxes the new server
     * attached to (VMs that outlived the old one) run; every other one is paused, stopped, deleted
     * or failed, and the host holds nothing of them but their disks.
     */
    async function expectConsistentAfterStart(): Promise<void> {
      const states = rows();
      expect([...states].filter(([, s]) => s === "creating" || s === "deleting")).toEqual([]);
      const running = new Set([...states].filter(([, s]) => s === "running").map(([id]) => id));
      const notRunning = (lines: string[]): string[] => lines.filter((l) => ![...running].some((id) => l.includes(id)));
      const leaks = await hostLeaks(home);
      expect({
        runscProcesses: notRunning(leaks.runscProcesses),
        qemuProcesses: notRunning(leaks.qemuProcesses),
        runscContainers: notRunning(leaks.runscContainers),
        mounts: notRunning(leaks.mounts),
        sandboxDirs: notRunning(leaks.sandboxDirs),
        liveLedgerRows: notRunning(leaks.liveLedgerRows),
        cgroups: notRunning(leaks.cgroups),
      }).toEqual(noLeaks());
      // Every directory left belongs to a sandbox that runs or keeps its disk.
      for (const dir of await readdir(join(home, "sandboxes")).catch(() => [] as string[])) {
        expect(["running", "paused", "stopped"]).toContain(states.get(dir));
      }
    }

    /** A fresh home, a server on it and one sandbox. */
    async function serverWithSandbox(): Promise<{ base: string; id: string }> {
      home = await mkdtemp("/tmp/bothy-test-crash-");
      const base = await start();
      const res = await api(base, "POST", "/sandboxes", { template: "seed", vcpu: 1, memory_mib: 512 });
      expect(res.status).toBe(201);
      return { base, id: res.json["sandbox_id"] as string };
    }

    /** Deletes the sandbox, stops the server, and checks that nothing of either is left. */
    async function deleteAndCheck(base: string, id: string): Promise<void> {
      expect((await api(base, "DELETE", `/sandboxes/${id}`)).status).toBe(200);
      await serve?.stop();
      expect(await hostLeaks(home)).toEqual(noLeaks());
      await rm(home, { recursive: true, force: true });
      home = "";
    }

    {
      it(
        "attaches to a sandbox that outlived the server: it keeps running, processes and all",
        { timeout: 300_000 },
        async () => {
          const { id, base: firstBase } = await serverWithSandbox();
          let base = firstBase;
          const ws = (): string => base.replace(/^http/, "ws");
          const bg = await runCommand(ws(), id, {
            cmd: "sleep 600 > /dev/null 2>&1 & echo $! > /workspace/pid; echo started",
            background: false,
          });
          expect(bg.stdout).toBe("started\n");
          // A command still streaming when the server dies.
          const streaming = runCommand(ws(), id, { cmd: "while :; do echo tick; sleep 0.2; done" });
          await new Promise((r) => setTimeout(r, 1500));
          await serve?.kill();
          expect((await streaming).exit).toBeUndefined();

          base = await start();
          await expectConsistentAfterStart();
          expect(rows().get(id)).toBe("running");
          expect(serve?.logs.some((l) => l["event"] === "sandbox_reattached" && l["sandbox_id"] === id)).toBe(true);
          const alive = await runCommand(ws(), id, { cmd: "kill -0 $(cat /workspace/pid) && echo still-running" });
          expect(alive.stdout).toBe("still-running\n");
          // The detached loop's request id does not get in the way of new requests.
          for (let i = 0; i < 3; i++) expect((await runCommand(ws(), id, { cmd: `echo ${i}` })).stdout).toBe(`${i}\n`);

          await deleteAndCheck(base, id);
        },
      );

      it.skipIf(driver.name !== "qemu")(
        "wakes a paused sandbox whose restored guest fails its start by booting it cold on its disk",
        { timeout: 300_000 },
        async () => {
          const { id, base: firstBase } = await serverWithSandbox();
          let base = firstBase;
          const ws = (): string => base.replace(/^http/, "ws");
          expect((await runCommand(ws(), id, { cmd: "echo kept > /workspace/f && sync && echo ok" })).stdout).toBe(
            "ok\n",
          );
          // The guest unmounts its own cgroups: restored as it was, it cannot take the process limit
          // the host sends at every start (as an agent from an older bothy would refuse the frame).
          await runCommand(ws(), id, { cmd: "umount -l /sys/fs/cgroup" });
          expect((await api(base, "POST", `/sandboxes/${id}/pause`)).status).toBe(200);
          await serve?.kill();

          base = await start();
          expect(rows().get(id)).toBe("paused");
          // Pausing it again changes nothing, though no VM runs it now.
          const again = await api(base, "POST", `/sandboxes/${id}/pause`);
          expect([again.status, again.json["state"]]).toEqual([200, "paused"]);
          const r = await runCommand(ws(), id, { cmd: "cat /workspace/f; cat /sys/fs/cgroup/commands/pids.max" });
          expect(r.error).toBeUndefined();
          expect(r.stdout).toBe("kept\n1024\n");
          expect(rows().get(id)).toBe("running");
          expect(
            serve?.logs.some(
              (l) =>
                l["event"] === "sandbox_restore_failed" &&
                l["sandbox_id"] === id &&
                String(l["error"]).includes("limits"),
            ),
          ).toBe(true);

          await deleteAndCheck(base, id);
        },
      );
    }

    it(
      `keeps the ledger and the host consistent across SIGKILLs at random points during ${plan.ops} operations`,
      { timeout: plan.timeoutMs },
      async () => {
        const seed = Number(process.env["BOTHY_CRASH_SEED"] ?? Date.now() % 100_000);
        const rand = random(seed);
        console.info(`crash recovery [${driver.name}]: seed ${seed}`);
        home = await mkdtemp("/tmp/bothy-test-crash-");
        let base = await start();
        /**
         * What each sandbox's marker file may hold: the last value known to be there, or that of any
         * write since whose end a crash hid (one cut short may still finish later, in the guest).
         */
        const marker = new Map<string, { sure: string | undefined; maybe: string[] }>();
        const alive = (): string[] => [...marker.keys()];
        let kills = 0;
        const log: string[] = [];

        // Drawn from a shuffled deck of every kind, so a short run still cuts each kind.
        const kinds: Op[] = [
          "create",
          "write",
          "read",
          "command",
          "delete",
          ...(driver.name === "qemu" ? (["pause"] as Op[]) : []),
        ];
        let deck: Op[] = [];
        for (let n = 0; n < plan.ops; n++) {
          if (deck.length === 0) deck = shuffled(kinds, rand);
          const op: Op = alive().length === 0 ? "create" : (deck.pop() ?? "create");
          const target = alive()[Math.floor(rand() * alive().length)];
          const kill = rand() < plan.killChance;
          const killAfter = Math.floor(rand() * plan.killWithinMs[op]);
          const value = `v${n}`;
          const ws = base.replace(/^http/, "ws");

          const work = (async (): Promise<string | undefined> => {
            switch (op) {
              case "create": {
                const res = await api(base, "POST", "/sandboxes", { template: "seed", vcpu: 1, memory_mib: 512 });
                if (res.status !== 201) throw new Error(`create answered ${res.status}: ${JSON.stringify(res.json)}`);
                return res.json["sandbox_id"] as string;
              }
              case "write": {
                const m = marker.get(target ?? "");
                m?.maybe.push(value);
                const r = await runCommand(ws, target ?? "", {
                  cmd: `echo ${value} > /workspace/marker.tmp && sync && mv /workspace/marker.tmp /workspace/marker && sync`,
                });
                if (r.exit?.exit_code !== 0) throw new Error(`write: ${JSON.stringify(r.error ?? r.exit)}`);
                return undefined;
              }
              case "read": {
                const r = await runCommand(ws, target ?? "", { cmd: "cat /workspace/marker 2>/dev/null || echo none" });
                if (r.exit === undefined) throw new Error(`read: ${JSON.stringify(r.error)}`);
                return r.stdout.trim();
              }
              case "command": {
                // A command that is still running when the server dies.
                const r = await runCommand(ws, target ?? "", { cmd: "sleep 1; echo done" });
                if (r.stdout !== "done\n") throw new Error(`command: ${JSON.stringify(r.error ?? r.exit)}`);
                return undefined;
              }
              case "delete": {
                const res = await api(base, "DELETE", `/sandboxes/${target ?? ""}`);
                if (res.status !== 200) throw new Error(`delete answered ${res.status}`);
                return undefined;
              }
              case "pause": {
                const res = await api(base, "POST", `/sandboxes/${target ?? ""}/pause`);
                // A sandbox a crash left stopped (a wake cut short) has nothing to pause: 409, as documented.
                const stopped =
                  res.status === 409 &&
                  res.json["code"] === "sandbox_not_running" &&
                  rows().get(target ?? "") === "stopped";
                if (res.status !== 200 && !stopped)
                  throw new Error(`pause answered ${res.status}: ${JSON.stringify(res.json)}`);
                return undefined;
              }
            }
          })().then(
            (v) => ({ ok: true as const, value: v }),
            (err: unknown) => ({ ok: false as const, error: err instanceof Error ? err.message : String(err) }),
          );

          let killed = false;
          if (kill) {
            const timer = new Promise<"kill">((r) => setTimeout(() => r("kill"), killAfter));
            if ((await Promise.race([work, timer])) === "kill") {
              await serve?.kill();
              killed = true;
              kills++;
            }
          }
          const outcome = await work;
          log.push(
            `${n}: ${op} ${target ?? ""}${killed ? ` killed@${killAfter}ms` : ""} -> ${outcome.ok ? "ok" : outcome.error.slice(0, 120)}`,
          );

          // What the model learns from the outcome.
          if (op === "create" && outcome.ok && outcome.value) marker.set(outcome.value, { sure: undefined, maybe: [] });
          if (op === "write" && target && outcome.ok) marker.set(target, { sure: value, maybe: [] });
          if (op === "read" && target && outcome.ok) {
            const m = marker.get(target);
            const seen = outcome.value === "none" ? undefined : outcome.value;
            expect([m?.sure, ...(m?.maybe ?? [])], log.join("\n")).toContain(seen);
            if (m) marker.set(target, { sure: seen, maybe: [] });
          }
          // A delete cut short either never reached the server or completes at restart (seen below).
          if (op === "delete" && target && outcome.ok) marker.delete(target);
          if (!outcome.ok && !killed) throw new Error(`operation failed without a crash:\n${log.join("\n")}`);

          if (killed) {
            base = await start();
            await expectConsistentAfterStart();
            const states = rows();
            for (const id of alive()) {
              const s = states.get(id);
              if (s === "deleted") marker.delete(id);
              else expect(["running", "paused", "stopped"], `${id} after restart\n${log.join("\n")}`).toContain(s);
            }
          }
        }

        // Every sandbox still there starts again on the next call and has its files.
        for (const [id, m] of marker) {
          const r = await runCommand(base.replace(/^http/, "ws"), id, {
            cmd: "cat /workspace/marker 2>/dev/null || echo none",
          });
          const seen = r.stdout.trim() === "none" ? undefined : r.stdout.trim();
          expect([m.sure, ...m.maybe], `${id}: ${JSON.stringify(r.error ?? r.exit)}\n${log.join("\n")}`).toContain(
            seen,
          );
          expect((await api(base, "GET", `/sandboxes/${id}`)).json["state"]).toBe("running");
        }
        console.info(
          `crash recovery [${driver.name}]: ${plan.ops} operations, ${kills} kills, ${marker.size} sandboxes checked at the end\n${log.join("\n")}`,
        );

        // A create whose answer the crash swallowed may have made a sandbox the model never saw.
        for (const [id, s] of rows())
          if (s !== "deleted" && s !== "failed")
            expect((await api(base, "DELETE", `/sandboxes/${id}`)).status).toBe(200);
        await serve?.stop();
        expect(await hostLeaks(home)).toEqual(noLeaks());
        expect(await readdir(join(home, "sandboxes"))).toEqual([]);
      },
    );
  });
}
