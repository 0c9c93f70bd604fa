import { describe, expect, it } from "vitest";
import type { SandboxSpec } from "../src/drivers/driver.ts";
import { BOOT_STEPS, bootMode, bootSandbox } from "../src/sandboxes/boot.ts";
import { FakeDriver, FakeHost } from "./helpers/fake-driver.ts";

const spec = (id: string, more: Partial<SandboxSpec> = {}): SandboxSpec => ({
  id,
  templateRoot: "/nonexistent/rootfs",
  templateEnv: {},
  vcpu: 1,
  memoryMib: 256,
  maxProcesses: 64,
  dir: `/nonexistent/${id}`,
  ...more,
});

describe("boot pipeline", () => {
  it("names its steps per mode; a take-over does not give identity, network or limits again", () => {
    expect(bootMode(spec("a"))).toBe("new");
    expect(bootMode(spec("a", { reuseDisk: true }))).toBe("kept disk");
    expect(bootMode(spec("a", { reuseDisk: true, attach: true }))).toBe("take-over");
    expect(BOOT_STEPS["take-over"]).toEqual(["start", "handshake"]);
    expect(BOOT_STEPS.new).toEqual(["start", "handshake", "identify", "network", "limits"]);
  });

  it("a failed new boot leaves nothing on the host; a failed boot on a kept disk keeps the disk", async () => {
    const host = new FakeHost();
    const driver = new FakeDriver("gvisor", host);
    host.failStarts = 1;
    await expect(bootSandbox(driver, spec("sbx_new"), 60_000)).rejects.toMatchObject({
      name: "BootError",
      step: "start",
    });
    expect(host.machines.has("sbx_new")).toBe(false);

    const booted = await bootSandbox(driver, spec("sbx_kept"), 60_000);
    await booted.handle.stop();
    expect(host.machines.get("sbx_kept")).toMatchObject({ disk: true, guest: undefined });
    host.failStarts = 1;
    await expect(bootSandbox(driver, spec("sbx_kept", { reuseDisk: true }), 60_000)).rejects.toMatchObject({
      name: "BootError",
      step: "start",
    });
    expect(host.machines.get("sbx_kept")).toMatchObject({ disk: true, guest: undefined });

    const again = await bootSandbox(driver, spec("sbx_kept", { reuseDisk: true }), 60_000);
    expect(host.running("sbx_kept")).toBe(true);
    await again.handle.destroy();
    expect(host.machines.size).toBe(0);
  });
});
