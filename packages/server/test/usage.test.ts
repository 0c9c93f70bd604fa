import { readFile } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { BothyEvent } from "@bothy/protocol";
import { noLeaks } from "./helpers/host-state.ts";
import { api, createSandbox } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { startTestServer, type TestServer } from "./helpers/test-server.ts";

/** A tiny budget (0.5 vCPU-seconds) that one running sandbox crosses within a second or two. */
const BUDGET_VCPU_HOURS = 0.5 / 3600;

for (const driver of testDrivers())
  describe.skipIf(driver.missing !== undefined)(driverTitle(driver, "usage metering and the budget tripwire"), () => {
    let ts: TestServer;
    let hook: Server;
    const received: BothyEvent[] = [];

    beforeAll(async () => {
      hook = createServer((req, res) => {
        let body = "";
        req.on("data", (c) => (body += c));
        req.on("end", () => {
          received.push(JSON.parse(body) as BothyEvent);
          res.writeHead(204).end();
        });
      });
      await new Promise<void>((r) => hook.listen(0, "127.0.0.1", r));
      ts = await startTestServer({
        BOTHY_DRIVER: driver.name,
        BOTHY_BUDGET_VCPU_HOURS: String(BUDGET_VCPU_HOURS),
        BOTHY_METER_INTERVAL_S: "0.5",
        BOTHY_WEBHOOK_URL: `http://127.0.0.1:${(hook.address() as AddressInfo).port}/hook`,
      });
    });

    afterAll(async () => {
      expect(await ts?.stop()).toEqual(noLeaks());
      await new Promise((r) => hook.close(r));
    });

    it(
      "meters a running sandbox, warns once when the budget is crossed, and reports /usage",
      { timeout: 180_000 },
      async () => {
        const id = await createSandbox(ts.url, { template: "seed", vcpu: 2, memoryMib: 512 });
        try {
          let warning: BothyEvent | undefined;
          for (let i = 0; i < 100 && !warning; i++) {
            await new Promise((r) => setTimeout(r, 100));
            warning = received.find((e) => e.type === "budget.exceeded");
          }
          expect(warning?.data).toMatchObject({
            owner: "default",
            kind: "vcpu_hours",
            budget: { vcpu_hours: BUDGET_VCPU_HOURS },
          });

          const usage = await api(ts.url, "GET", `/usage?sandbox_id=${id}`);
          expect(usage.status).toBe(200);
          const owner = (
            usage.json["owners"] as Array<{
              owner: string;
              vcpu_hours: number;
              gib_hours: number;
              over_budget: string[];
            }>
          )[0];
          expect(owner?.owner).toBe("default");
          expect(owner?.vcpu_hours).toBeGreaterThanOrEqual(BUDGET_VCPU_HOURS);
          expect(owner?.gib_hours).toBeGreaterThan(0);
          expect(owner?.over_budget).toEqual(["vcpu_hours"]);
          const sandbox = usage.json["sandbox"] as { vcpu_hours: number; gib_hours: number };
          // 2 vCPUs and half a GiB: four times as many vCPU-hours as GiB-hours.
          expect(sandbox.vcpu_hours / sandbox.gib_hours).toBeCloseTo(4, 5);

          // Once a month per budget: more ticks do not warn again.
          await new Promise((r) => setTimeout(r, 1500));
          expect(received.filter((e) => e.type === "budget.exceeded")).toHaveLength(1);
          expect((await ts.server.events.since(0)).filter((e) => e.type === "budget.exceeded")).toHaveLength(1);
          const log = (await readFile(ts.logPath, "utf8"))
            .split("\n")
            .filter((l) => l.includes('"event":"budget_exceeded"'));
          expect(log).toHaveLength(1);
          expect(JSON.parse(log[0] ?? "{}")).toMatchObject({ level: 40, kind: "vcpu_hours" });
        } finally {
          await api(ts.url, "DELETE", `/sandboxes/${id}`);
        }
        expect((await api(ts.url, "GET", "/usage?sandbox_id=sbx_aaaaaaaaaaaaaaaaaaaa")).status).toBe(404);
      },
    );
  });
