import { describe, expect, it } from "vitest";
import type { Driver, SandboxHandle, SandboxSpec } from "../src/drivers/driver.ts";
import type { CleanupStack } from "../src/util/cleanup-stack.ts";
import { NotSupportedError, toCreateFailure } from "../src/errors/internal-errors.ts";
import { BOOT_STEPS, bootMode, bootSandbox, resumeSandbox } from "../src/sandboxes/boot.ts";
import { FakeDriver, FakeHost } from "./helpers/fake-driver.ts";
import type { HostNetwork, LinkKind, PlannedNetwork } from "../src/network/host-network.ts";
import { NetworkedDriver } from "../src/network/networked-driver.ts";
import { NetworkSetupError } from "../src/errors/internal-errors.ts";

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
    expect(BOOT_STEPS.new).toEqual(["start", "handshake", "identify", "network", "limits", "volumes", "trust"]);
    expect(BOOT_STEPS.wake).toEqual(["restore", "handshake", "identify", "network", "limits", "volumes", "trust"]);
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
          start: (undo: CleanupStack) => {
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

  describe("a networked start: the plumb runs beside the driver's start", () => {
    /**
     * A host network whose plumb makes its namespace at once and finishes (or fails) only when the
     * test says so, so a test can hold it open while the driver's start fails, or fail it after
     * the driver made its disk.
     */
    class FakeNetwork {
      /** Sandboxes with anything of their network on the host. */
      readonly made = new Set<string>();
      readonly teardowns: string[] = [];
      readonly log: string[] = [];
      private finish: ((ok: boolean) => void) | undefined;
      readonly plumbStarted: Promise<void>;
      private started!: () => void;
      constructor() {
        this.plumbStarted = new Promise((r) => (this.started = r));
      }
      allocate(sandboxId: string, kind: LinkKind): PlannedNetwork {
        return {
          sandboxId,
          kind,
          iface: `b-${sandboxId}`,
          policy: { internet: true, allowOut: [], denyOut: [] },
          guest: { guest: "10.0.0.2", gateway: "10.0.0.1", prefix: 30, dns: [] },
        };
      }
      async plumb(plan: PlannedNetwork): Promise<void> {
        this.made.add(plan.sandboxId);
        this.log.push("plumb started");
        this.started();
        const ok = await new Promise<boolean>((r) => (this.finish = r));
        this.log.push(ok ? "plumbed" : "plumb failed");
        if (!ok) throw new NetworkSetupError(`The fake host could not plumb ${plan.sandboxId}.`);
      }
      settle(ok: boolean): void {
        this.finish?.(ok);
      }
      async teardown(sandboxId: string): Promise<void> {
        this.teardowns.push(sandboxId);
        this.log.push("teardown");
        this.made.delete(sandboxId);
      }
    }

    const networked = (host: FakeHost, net: FakeNetwork): NetworkedDriver =>
      new NetworkedDriver(new FakeDriver("gvisor", host), net as unknown as HostNetwork, "veth");

    it("a plumb that fails while the driver's start made its disk leaves neither", async () => {
      const host = new FakeHost();
      const net = new FakeNetwork();
      const boot = bootSandbox(networked(host, net), spec("sbx_np"), 60_000).catch((e: unknown) => e);
      await net.plumbStarted;
      // The driver's start runs on while the plumb is open: its disk is made before the plumb ends.
      while (!host.machines.get("sbx_np")?.disk) await new Promise((r) => setImmediate(r));
      net.settle(false);
      expect(await boot).toMatchObject({ name: "BootError", step: "start" });
      expect(host.machines.has("sbx_np")).toBe(false);
      expect(net.made.size).toBe(0);
      expect(net.teardowns).toEqual(["sbx_np"]);
    });

    it("a driver start that fails while the plumb is open is undone only after the plumb ends", async () => {
      const host = new FakeHost();
      const net = new FakeNetwork();
      host.failStarts = 1;
      const boot = bootSandbox(networked(host, net), spec("sbx_nm"), 60_000).catch((e: unknown) => e);
      await net.plumbStarted;
      // Let the driver's start fail while the plumb is still making things.
      for (let i = 0; i < 20; i++) await new Promise((r) => setImmediate(r));
      expect(net.teardowns).toEqual([]);
      net.settle(true);
      expect(await boot).toMatchObject({ name: "BootError", step: "start" });
      expect(net.log).toEqual(["plumb started", "plumbed", "teardown"]);
      expect(host.machines.has("sbx_nm")).toBe(false);
      expect(net.made.size).toBe(0);
    });

    it("both failing leave nothing, each undo run once; both succeeding boot on the network", async () => {
      const host = new FakeHost();
      const net = new FakeNetwork();
      host.failStarts = 1;
      const failed = bootSandbox(networked(host, net), spec("sbx_nb"), 60_000).catch((e: unknown) => e);
      await net.plumbStarted;
      net.settle(false);
      expect(await failed).toMatchObject({ name: "BootError", step: "start" });
      expect(host.machines.size).toBe(0);
      expect(net.made.size).toBe(0);
      expect(net.teardowns).toEqual(["sbx_nb"]);

      const ok = new FakeNetwork();
      const booting = bootSandbox(networked(host, ok), spec("sbx_ok"), 60_000);
      await ok.plumbStarted;
      ok.settle(true);
      const booted = await booting;
      expect(host.running("sbx_ok")).toBe(true);
      expect(booted.stepsMs?.["start.network"]).toBeGreaterThanOrEqual(0);
      await booted.handle.destroy();
      expect(host.machines.size).toBe(0);
      expect(ok.made.size).toBe(0);
    });
  });
});
