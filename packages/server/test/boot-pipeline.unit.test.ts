import { describe, expect, it } from "vitest";
import type { Driver, SandboxHandle, SandboxSpec, UndoStack } from "../src/drivers/driver.ts";
import { NotSupportedError, toCreateFailure } from "../src/errors/internal-errors.ts";
import { BOOT_STEPS, bootMode, bootSandbox, resumeSandbox } from "../src/sandboxes/boot.ts";
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
  it("names its steps per mode; a take-over does not give identity, network, limits or the egress CA again", () => {
    const host = new FakeHost();
    const driver = new FakeDriver("qemu", host);
    expect(bootMode(spec("a"), driver)).toBe("new");
    expect(bootMode(spec("a", { reuseDisk: true }), driver)).toBe("kept disk");
    expect(bootMode(spec("a", { reuseDisk: true, attach: true }), driver)).toBe("take-over");
    host.machines.set("a", { driver: "qemu", disk: true, savedMemory: true, guest: undefined });
    expect(bootMode(spec("a", { reuseDisk: true }), driver)).toBe("wake");
    expect(bootMode(spec("a", { reuseDisk: true, fromMemory: false }), driver)).toBe("kept disk");
    expect(BOOT_STEPS["take-over"]).toEqual(["attach", "handshake"]);
    expect(BOOT_STEPS.new).toEqual(["start", "handshake", "identify", "network", "limits", "trust"]);
    expect(BOOT_STEPS.wake).toEqual(["restore", "handshake", "identify", "network", "limits", "trust"]);
    expect(BOOT_STEPS.resume).toEqual(["restore", "handshake", "identify"]);
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

  it("a wake whose restore fails boots cold on the same disk, after saying why", async () => {
    const host = new FakeHost();
    const driver = new FakeDriver("qemu", host);
    const booted = await bootSandbox(driver, spec("sbx_wake"), 60_000);
    await booted.handle.pause?.();
    await booted.handle.stop();
    expect(host.machines.get("sbx_wake")).toMatchObject({ disk: true, savedMemory: true, guest: undefined });
    host.failStarts = 1;
    const heard: unknown[] = [];
    const woken = await bootSandbox(driver, spec("sbx_wake", { reuseDisk: true }), 60_000, {
      onWakeFailed: (err) => heard.push(err),
    });
    expect(heard).toEqual([expect.objectContaining({ name: "BootError", step: "restore" })]);
    expect(host.machines.get("sbx_wake")).toMatchObject({ disk: true, savedMemory: false });
    expect(host.running("sbx_wake")).toBe(true);
    await woken.handle.destroy();
    expect(host.machines.size).toBe(0);
  });

  it("a failed resume unwinds what it made and leaves the sandbox paused; a later one succeeds", async () => {
    const host = new FakeHost();
    const driver = new FakeDriver("qemu", host);
    const booted = await bootSandbox(driver, spec("sbx_res"), 60_000);
    await booted.handle.pause?.();
    const before = booted.agent;
    host.failStarts = 1;
    await expect(resumeSandbox(driver, booted, 60_000)).rejects.toMatchObject({ name: "BootError", step: "restore" });
    expect(host.machines.get("sbx_res")).toMatchObject({ disk: true, savedMemory: true, guest: undefined });
    expect(booted.agent).toBe(before);
    await resumeSandbox(driver, booted, 60_000);
    expect(booted.agent).not.toBe(before);
    expect(host.running("sbx_res")).toBe(true);
    await booted.handle.destroy();
    expect(host.machines.size).toBe(0);
  });

  it("a host's refusal stands as it is, after the undos ran, and is 501 not_supported at the boundary", async () => {
    const fake = new FakeDriver("gvisor", new FakeHost());
    const fix = "This host cannot limit sandboxes; set BOTHY_HOST_LIMITS=off to run them without.";
    const undone: string[] = [];
    const refusing: Driver = Object.assign(Object.create(fake) as Driver, {
      create: (s: SandboxSpec): SandboxHandle =>
        Object.assign(Object.create(fake.create(s)) as SandboxHandle, {
          start: (undo: UndoStack) => {
            undo.push("made before the refusal", () => void undone.push("undone"));
            return Promise.reject(new NotSupportedError(fix));
          },
        }),
    });
    const err = await bootSandbox(refusing, spec("sbx_ref"), 60_000).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(NotSupportedError);
    expect(undone).toEqual(["undone"]);
    expect(toCreateFailure(err)).toMatchObject({ code: "not_supported", message: fix });
  });
});
