/** Tenant quotas against a real ledger: each limit refuses with its name and value, and only past it. */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { BothyError } from "@bothy/protocol";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { Quotas } from "../src/auth/quotas.ts";
import { loadConfig } from "../src/config.ts";
import { openStore, type LedgerStore } from "../src/ledger/store.ts";
import { newSandboxId } from "../src/util/ids.ts";
import { insertTestSandbox } from "./helpers/ledger-rows.ts";

let dir: string;
let ledger: LedgerStore;

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "bothy-quota-"));
  ledger = await openStore({ sqlitePath: join(dir, "ledger.sqlite") });
});

afterEach(async () => {
  await ledger.close();
  await rm(dir, { recursive: true, force: true });
});

function sandbox(tenant: string, vcpu = 1, memory = 512): Promise<unknown> {
  return insertTestSandbox(ledger, {
    id: newSandboxId(),
    tenant,
    driver: "gvisor",
    acceleration: null,
    vcpu,
    memory_mib: memory,
  });
}

async function refusal(fn: () => Promise<unknown>): Promise<unknown> {
  try {
    await fn();
  } catch (err) {
    if (err instanceof BothyError) return { code: err.code, ...err.details };
    throw err;
  }
  return "admitted";
}

describe("tenant quotas", () => {
  it("refuses past each limit, naming it", async () => {
    const quotas = new Quotas(ledger, loadConfig({}));
    await ledger.auth.insertTenant("t", JSON.stringify({ max_sandboxes: 2, max_vcpu: 3, creates_per_minute: 10 }));
    const size = { vcpu: 1, memoryMib: 512 };
    expect(await refusal(() => quotas.admit("t", size))).toBe("admitted");
    await sandbox("t", 2);
    expect(await refusal(() => quotas.admit("t", { vcpu: 2, memoryMib: 512 }))).toEqual({
      code: "quota_exceeded",
      quota: "max_vcpu",
      limit: 3,
    });
    await sandbox("t", 1);
    expect(await refusal(() => quotas.admit("t", size))).toEqual({
      code: "quota_exceeded",
      quota: "max_sandboxes",
      limit: 2,
    });
    // Another tenant's sandboxes count for it alone.
    expect(await refusal(() => quotas.admit("default", size))).toBe("admitted");
    await ledger.auth.setQuota("t", JSON.stringify({ creates_per_minute: 2 }));
    expect(await refusal(() => quotas.admit("t", size))).toEqual({
      code: "quota_exceeded",
      quota: "creates_per_minute",
      limit: 2,
    });
    // A minute later the creates of before no longer count.
    expect(await refusal(() => quotas.admit("t", size, Date.now() + 61_000))).toBe("admitted");
  });

  it("admits a fork's children all together or none: count multiplies the sandbox, its vCPU and memory", async () => {
    const quotas = new Quotas(ledger, loadConfig({}));
    await ledger.auth.insertTenant("t", JSON.stringify({ max_sandboxes: 4, max_memory_mib: 4096 }));
    await sandbox("t");
    expect(await refusal(() => quotas.admit("t", { vcpu: 1, memoryMib: 512, count: 3 }))).toBe("admitted");
    expect(await refusal(() => quotas.admit("t", { vcpu: 1, memoryMib: 512, count: 4 }))).toEqual({
      code: "quota_exceeded",
      quota: "max_sandboxes",
      limit: 4,
    });
    expect(await refusal(() => quotas.admit("t", { vcpu: 1, memoryMib: 1536, count: 3 }))).toEqual({
      code: "quota_exceeded",
      quota: "max_memory_mib",
      limit: 4096,
    });
  });

  it("blocks creates over the monthly budget only with BOTHY_BUDGET_ACTION=block", async () => {
    const month = new Date().toISOString().slice(0, 7);
    await ledger.auth.insertTenant("t", JSON.stringify({ monthly_vcpu_hours: 1 }));
    await ledger.addUsage([
      { sandboxId: "sbx_x", owner: "t", month, day: `${month}-01`, vcpuSeconds: 3600, gibSeconds: 0 },
    ]);
    const size = { vcpu: 1, memoryMib: 512 };
    expect(await refusal(() => new Quotas(ledger, loadConfig({})).admit("t", size))).toBe("admitted");
    const blocking = new Quotas(ledger, loadConfig({ BOTHY_BUDGET_ACTION: "block" }));
    expect(await refusal(() => blocking.admit("t", size))).toEqual({
      code: "quota_exceeded",
      quota: "monthly_vcpu_hours",
      limit: 1,
    });
    // The host-wide budget applies to a tenant without its own.
    expect(await refusal(() => blocking.admit("default", size))).toBe("admitted");
    expect(await new Quotas(ledger, loadConfig({ BOTHY_BUDGET_GIB_HOURS: "2" })).budgetOf("default")).toEqual({
      vcpuHours: undefined,
      gibHours: 2,
    });
  });
});
