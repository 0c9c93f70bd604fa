import type { Driver, ExitInfo, GuestNetwork, GuestStream, HostObject, SandboxHandle, SandboxSpec } from "../drivers/driver.ts";
import { DEFAULT_POLICY, type HostNetwork, type LinkKind, type PlannedNetwork } from "./host-network.ts";

/**
 * A driver whose sandboxes each get a network: the link and its rules are made before the inner
 * driver starts the sandbox and removed after it is destroyed. Reconcile reports the network
 * objects beside the driver's own, so the manager and sweeper remove orphans of both alike.
 */
export class NetworkedDriver implements Driver {
  constructor(
    private readonly inner: Driver,
    private readonly net: HostNetwork,
    private readonly kind: LinkKind,
  ) {}

  get name(): string {
    return this.inner.name;
  }

  get acceleration(): string {
    return this.inner.acceleration;
  }

  /** Not yet: the network a running sandbox had would have to be taken over too (open work). */
  get attaches(): boolean {
    return false;
  }

  preflight(): Promise<void> {
    return this.inner.preflight();
  }

  create(spec: SandboxSpec): SandboxHandle {
    const plan = this.net.allocate(spec.id, this.kind, spec.egress ?? DEFAULT_POLICY);
    return new NetworkedHandle(this.inner.create({ ...spec, network: plan.guest }), plan, this.net, this.kind === "tap");
  }

  async reconcile(): Promise<HostObject[]> {
    const [own, net] = await Promise.all([this.inner.reconcile(), this.net.reconcile()]);
    return [...own, ...net];
  }

  async removeOrphan(sandboxId: string): Promise<void> {
    try {
      await this.inner.removeOrphan(sandboxId);
    } finally {
      await this.net.teardown(sandboxId);
    }
  }

  /** A stopped sandbox has no network: it gets a new one when it starts again. */
  async release(sandboxId: string): Promise<void> {
    try {
      await this.inner.release(sandboxId);
    } finally {
      await this.net.teardown(sandboxId);
    }
  }
}

class NetworkedHandle implements SandboxHandle {
  readonly pause?: () => Promise<void>;
  readonly resume?: (signal?: AbortSignal) => Promise<GuestStream>;
  readonly guestNetwork?: GuestNetwork;
  private destroying: Promise<void> | undefined;

  constructor(
    private readonly inner: SandboxHandle,
    private readonly plan: PlannedNetwork,
    private readonly net: HostNetwork,
    configureInGuest: boolean,
  ) {
    if (inner.pause) this.pause = inner.pause.bind(inner);
    if (inner.resume) this.resume = inner.resume.bind(inner);
    if (configureInGuest) this.guestNetwork = plan.guest;
  }

  get id(): string {
    return this.inner.id;
  }

  get needsIdentity(): boolean | undefined {
    return this.inner.needsIdentity;
  }

  /** The inner driver's diagnostics, which boot failures quote. */
  get diagnostics(): string | undefined {
    return (this.inner as { diagnostics?: string }).diagnostics;
  }

  async start(signal?: AbortSignal): Promise<GuestStream> {
    await this.net.plumb(this.plan);
    try {
      return await this.inner.start(signal);
    } catch (err) {
      await this.net.teardown(this.plan.sandboxId);
      throw err;
    }
  }

  wait(): Promise<ExitInfo> {
    return this.inner.wait();
  }

  shutdown(timeoutMs: number): Promise<void> {
    return this.inner.shutdown(timeoutMs);
  }

  kill(): Promise<void> {
    return this.inner.kill();
  }

  async stop(): Promise<void> {
    try {
      await this.inner.stop();
    } finally {
      await this.net.teardown(this.plan.sandboxId);
    }
  }

  destroy(): Promise<void> {
    this.destroying ??= (async () => {
      try {
        await this.inner.destroy();
      } finally {
        await this.net.teardown(this.plan.sandboxId);
      }
    })().catch((err: unknown) => {
      this.destroying = undefined; // a failed destroy may be tried again
      throw err;
    });
    return this.destroying;
  }
}
