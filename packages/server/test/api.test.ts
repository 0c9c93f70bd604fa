import { describe, expect, it } from "vitest";
import { api, createSandbox, runCommand, waitDeleted } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { useServerWithSandbox } from "./helpers/suite.ts";
import type { TestServer } from "./helpers/test-server.ts";

// The same contract on every driver: the server's default driver is the one under test.
for (const driver of testDrivers()) {
  describe.skipIf(driver.missing !== undefined)(driverTitle(driver, "API"), () => {
    let ts: TestServer;
    let sandboxId: string;

    useServerWithSandbox(driver.name, (server, sandbox) => {
      ts = server;
      sandboxId = sandbox;
    });

    describe("sandbox lifecycle", () => {
      it("creates with 201 and replays an Idempotency-Key with 200 and the same sandbox", async () => {
        const body = { template: "seed", vcpu: 1, memory_mib: 1024 };
        const key = `key-${Date.now()}`;
        const first = await api(ts.url, "POST", "/sandboxes", body, { "idempotency-key": key });
        expect(first.status).toBe(201);
        expect(first.json).toMatchObject({
          state: "running",
          template: "seed",
          driver: driver.name,
          acceleration: expect.any(String),
          vcpu: 1,
          memory_mib: 1024,
        });
        const before = (await api(ts.url, "GET", "/sandboxes")).json["sandboxes"] as unknown[];
        const again = await api(ts.url, "POST", "/sandboxes", body, { "idempotency-key": key });
        expect(again.status).toBe(200);
        expect(again.json["sandbox_id"]).toBe(first.json["sandbox_id"]);
        const after = (await api(ts.url, "GET", "/sandboxes")).json["sandboxes"] as unknown[];
        expect(after.length).toBe(before.length);

        const reused = await api(ts.url, "POST", "/sandboxes", { ...body, vcpu: 2 }, { "idempotency-key": key });
        expect(reused.status).toBe(422);
        expect(reused.json["code"]).toBe("idempotency_key_reused");
        await api(ts.url, "DELETE", `/sandboxes/${String(first.json["sandbox_id"])}`);
      });

      it("concurrent creates with one Idempotency-Key boot one sandbox", async () => {
        const key = `race-${Date.now()}`;
        const results = await Promise.all(
          [1, 2, 3].map(() => api(ts.url, "POST", "/sandboxes", { template: "seed" }, { "idempotency-key": key })),
        );
        const ids = new Set(results.map((r) => r.json["sandbox_id"]));
        expect(ids.size).toBe(1);
        expect(results.map((r) => r.status).sort()).toEqual([200, 200, 201]);
        await api(ts.url, "DELETE", `/sandboxes/${String([...ids][0])}`);
      });

      it("concurrent creates with one Idempotency-Key and different bodies: one boots, the other is refused", async () => {
        const key = `race-body-${Date.now()}`;
        const bodies = [
          { template: "seed", memory_mib: 512 },
          { template: "seed", memory_mib: 640 },
        ];
        const results = await Promise.all(
          bodies.map((body) => api(ts.url, "POST", "/sandboxes", body, { "idempotency-key": key })),
        );
        const made = results.filter((r) => r.status === 201);
        try {
          expect(results.map((r) => r.status).sort()).toEqual([201, 422]);
          const refused = results.find((r) => r.status === 422);
          expect(refused?.json["code"]).toBe("idempotency_key_reused");
          const winner = results.indexOf(made[0]!);
          expect(made[0]?.json["memory_mib"]).toBe(bodies[winner]?.memory_mib);
        } finally {
          for (const r of made) await api(ts.url, "DELETE", `/sandboxes/${String(r.json["sandbox_id"])}`);
        }
      });

      it("lists and shows sandboxes", async () => {
        const list = await api(ts.url, "GET", "/sandboxes");
        expect(list.status).toBe(200);
        const ids = (list.json["sandboxes"] as Array<{ sandbox_id: string }>).map((s) => s.sandbox_id);
        expect(ids).toContain(sandboxId);
        const one = await api(ts.url, "GET", `/sandboxes/${sandboxId}`);
        expect(one.json).toMatchObject({ sandbox_id: sandboxId, state: "running" });
      });

      it("deletes twice successfully, and a deleted sandbox takes no commands", async () => {
        const id = await createSandbox(ts.url);
        const first = await api(ts.url, "DELETE", `/sandboxes/${id}`);
        expect(first.status).toBe(200);
        // It answers once the sandbox is unreachable; the host finishes in the background.
        expect(["deleting", "deleted"]).toContain(first.json["state"]);
        await expect(runCommand(ts.wsUrl, id, { cmd: "true" })).rejects.toThrow(/409/);
        const second = await api(ts.url, "DELETE", `/sandboxes/${id}`);
        expect(second.status).toBe(200);
        expect(await waitDeleted(ts.url, id)).toBe("deleted");
        const waited = await api(ts.url, "DELETE", `/sandboxes/${id}?wait=true`);
        expect([waited.status, waited.json["state"]]).toEqual([200, "deleted"]);
        await expect(runCommand(ts.wsUrl, id, { cmd: "true" })).rejects.toThrow(/409/);
      });

      it("gives each sandbox its own disk and hostname", async () => {
        const other = await createSandbox(ts.url);
        try {
          await runCommand(ts.wsUrl, sandboxId, { cmd: "echo mine > /workspace/owner && hostname" }).then((r) =>
            expect(r.stdout.trim()).toBe(sandboxId),
          );
          const peek = await runCommand(ts.wsUrl, other, { cmd: "cat /workspace/owner 2>&1; hostname" });
          expect(peek.stdout).toContain("No such file");
          expect(peek.stdout).toContain(other);
          const again = await runCommand(ts.wsUrl, sandboxId, { cmd: "cat /workspace/owner" });
          expect(again.stdout).toBe("mine\n");
        } finally {
          await api(ts.url, "DELETE", `/sandboxes/${other}`);
        }
      });

      it("reports health with counts by state", async () => {
        const res = await api(ts.url, "GET", "/healthz");
        expect(res.status).toBe(200);
        expect(res.json["status"]).toBe("ok");
        expect((res.json["sandboxes"] as Record<string, number>)["running"]).toBeGreaterThanOrEqual(1);
        expect(typeof res.json["uptime_s"]).toBe("number");
      });
    });

    describe("commands", () => {
      it("streams output before the command ends, then process_exited last", async () => {
        const r = await runCommand(ts.wsUrl, sandboxId, { cmd: "echo a; sleep 2; echo b" });
        const types = r.events.map((e) => e.event.type);
        expect(types[0]).toBe("started");
        expect(types.at(-1)).toBe("process_exited");
        const a = r.events.find((e) => e.event.type === "stdout" && e.event.data.includes("a"));
        const exit = r.events.at(-1);
        expect(a && exit && exit.at - a.at).toBeGreaterThan(1000);
        expect(r.stdout).toBe("a\nb\n");
        expect(r.exit?.exit_code).toBe(0);
        expect(r.closeCode).toBe(1000);
        const ids = new Set(r.events.map((e) => (e.event as { command_id?: string }).command_id));
        expect(ids.size).toBe(1);
      });

      it("keeps stderr separate and reports exit codes", async () => {
        const r = await runCommand(ts.wsUrl, sandboxId, { cmd: "echo out; echo err >&2; exit 7" });
        expect(r.stdout).toBe("out\n");
        expect(r.stderr).toBe("err\n");
        expect(r.exit?.exit_code).toBe(7);
      });

      it("reports the signal of a killed command", async () => {
        const r = await runCommand(ts.wsUrl, sandboxId, { cmd: "kill -9 $$" });
        expect(r.exit).toMatchObject({ exit_code: null, signal: "SIGKILL" });
      });

      it("delivers 3 MB of output whole and in order", async () => {
        const r = await runCommand(ts.wsUrl, sandboxId, { cmd: "seq 1 450000" }, { keepEvents: false });
        const expected = Array.from({ length: 450000 }, (_, i) => `${i + 1}\n`).join("");
        expect(expected.length).toBeGreaterThan(3_000_000);
        expect(r.stdout.length).toBe(expected.length);
        expect(r.stdout === expected).toBe(true);
      });

      it("sends non-UTF-8 output as base64 and keeps split characters as text", async () => {
        const r = await runCommand(ts.wsUrl, sandboxId, {
          cmd: "printf '\\377\\376'; sleep 0.2; printf 'h\\303'; sleep 0.2; printf '\\251llo'",
        });
        const chunks = r.events
          .filter((e) => e.event.type === "stdout")
          .map((e) => e.event as { data: string; encoding?: string });
        expect(chunks[0]).toMatchObject({ data: Buffer.from([0xff, 0xfe]).toString("base64"), encoding: "base64" });
        expect(
          chunks
            .slice(1)
            .map((c) => c.data)
            .join(""),
        ).toBe("héllo");
        expect(chunks.slice(1).every((c) => c.encoding === undefined)).toBe(true);
      });

      it("passes cwd and env, and takes stdin with an explicit end", async () => {
        const r = await runCommand(ts.wsUrl, sandboxId, {
          cmd: "pwd; echo $GREETING",
          cwd: "/tmp",
          env: { GREETING: "hej" },
        });
        expect(r.stdout).toBe("/tmp\nhej\n");
        const cat = await runCommand(
          ts.wsUrl,
          sandboxId,
          { cmd: "wc -c; cat /dev/null", stdin: true },
          {
            onEvent: (ev, ws) => {
              if (ev.type !== "started") return;
              ws.send(JSON.stringify({ type: "stdin", data: "hello " }));
              ws.send(
                JSON.stringify({ type: "stdin", data: Buffer.from("world").toString("base64"), encoding: "base64" }),
              );
              ws.send(JSON.stringify({ type: "stdin_eof" }));
            },
          },
        );
        expect(cat.stdout.trim()).toBe("11");
      });

      it("forwards signals and enforces timeout_s", async () => {
        const sig = await runCommand(
          ts.wsUrl,
          sandboxId,
          { cmd: "sleep 30" },
          {
            onEvent: (ev, ws) => {
              if (ev.type === "started") ws.send(JSON.stringify({ type: "signal", signal: "SIGTERM" }));
            },
          },
        );
        expect(sig.exit).toMatchObject({ exit_code: null, signal: "SIGTERM" });
        const slow = await runCommand(ts.wsUrl, sandboxId, { cmd: "sleep 30", timeout_s: 1 });
        expect(slow.exit).toMatchObject({ signal: "SIGKILL", timed_out: true });
      });

      it("reaps orphaned processes: no zombies pile up", async () => {
        await runCommand(ts.wsUrl, sandboxId, { cmd: "for i in 1 2 3 4 5; do sleep 0.1 & done; echo spawned" });
        await new Promise((r) => setTimeout(r, 1500));
        const r = await runCommand(ts.wsUrl, sandboxId, {
          cmd: "cat /proc/[0-9]*/stat 2>/dev/null | awk '$3 == \"Z\"' | wc -l",
        });
        expect(r.stdout.trim()).toBe("0");
      });

      it("runs coreutils that stat files (ls -l, stat)", async () => {
        const r = await runCommand(ts.wsUrl, sandboxId, {
          cmd: "ls -la / >/dev/null && stat -c %F /etc && ls -l /etc/hostname | wc -l",
        });
        expect(r.stderr).toBe("");
        expect(r.stdout).toBe("directory\n1\n");
        expect(r.exit?.exit_code).toBe(0);
      });

      it("finishes a command whose background child keeps the pipes open", async () => {
        const r = await runCommand(ts.wsUrl, sandboxId, { cmd: "sleep 60 & echo started-bg" });
        expect(r.stdout).toBe("started-bg\n");
        expect(r.exit?.exit_code).toBe(0);
      });

      it("records commands in the ledger", async () => {
        const r = await runCommand(ts.wsUrl, sandboxId, { cmd: "exit 3" });
        const row = await ts.server.ledger.getCommand(r.exit?.command_id ?? "");
        expect(row).toMatchObject({ sandbox_id: sandboxId, state: "exited", exit_code: 3 });
      });
    });
  });
}
