import type {
  Driver,
  ExitInfo,
  GuestNetwork,
  GuestStream,
  HostObject,
  SandboxHandle,
  SandboxSpec,
} from "../drivers/driver.ts";
import type { CleanupStack } from "../util/cleanup-stack.ts";
import { DEFAULT_POLICY } from "./egress-policy.ts";
import type { HostNetwork, LinkKind, PlannedNetwork } from "./host-network.ts";
import { NetworkSetupError } from "../errors/internal-errors.ts";

/**
 * A driver whose sandboxes each get a network: the link and its rules are made before the inner
 * driver starts the sandbox and removed after it is destroyed. Reconcile reports the network
 * objects beside the driver's own, so the manager and sweeper remove orphans of both alike.
 */
export class NetworkedDriver implements Driver {
  /** Forwarded where the inner driver has them: one that cannot take snapshots stays without (501). */
  readonly captureFiles?: Driver["captureFiles"];
  readonly captureImage?: Driver["captureImage"];

  constructor(
    private readonly inner: Driver,
    private readonly net: HostNetwork,
    private readonly kind: LinkKind,
  ) {
    const capture = inner.captureFiles?.bind(inner);
    if (capture) this.captureFiles = capture;
    const captureImage = inner.captureImage?.bind(inner);
    // The inner driver freezes its own sandbox: it is given its own handle, not this wrapper.
    if (captureImage)
      this.captureImage = (sandbox, baseRoot, out, memory) => {
        const { handle, ...rest } = sandbox;
        const own = handle instanceof NetworkedHandle ? handle.innerHandle : handle;
        return captureImage({ ...rest, ...(own === undefined ? {} : { handle: own }) }, baseRoot, out, memory);
      };
  }

  get name(): string {
    return this.inner.name;
  }

  get acceleration(): string {
    return this.inner.acceleration;
  }

  /** A sandbox that outlived the server keeps its network too: `adopt` takes it over. */
  get attaches(): boolean {
    return this.inner.attaches;
  }

  preflight(): Promise<void> {
    return this.inner.preflight();
  }

  savedMemory(spec: SandboxSpec): boolean {
    return this.inner.savedMemory?.(spec) ?? false;
  }

  /** A new sandbox gets a network made for it; one taken over after a restart keeps the one it has. */
  create(spec: SandboxSpec): SandboxHandle {
    const policy = spec.egress ?? DEFAULT_POLICY;
    let planNetwork: () => Promise<PlannedNetwork>;
    if (spec.attach) {
      planNetwork = async () => {
        const plan = await this.net.adopt(spec.id, this.kind, policy);
        if (!plan)
          throw new NetworkSetupError(`Sandbox ${spec.id}'s network is not whole any more; it cannot be taken over.`);
        return plan;
      };
    } else {
      const plan = this.net.allocate(spec.id, this.kind, policy);
      planNetwork = () => Promise.resolve(plan);
    }
    return new NetworkedHandle(
      spec,
      planNetwork,
      !spec.attach,
      (plan) => this.inner.create({ ...spec, network: plan.guest }),
      this.net,
      this.kind === "tap",
    );
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

/**
 * A sandbox with its network: the network is made (or, for one that outlived a server restart,
 * taken over) first, then the inner driver's sandbox starts on it. Until `start` there is no
 * inner handle.
 */
class NetworkedHandle implements SandboxHandle {
  private inner: SandboxHandle | undefined;
  private plan: PlannedNetwork | undefined;
  private destroying: Promise<void> | undefined;
  private networkMs: number | undefined;

  constructor(
    private readonly spec: SandboxSpec,
    private readonly planNetwork: () => Promise<PlannedNetwork>,
    private readonly plumb: boolean,
    private readonly makeInner: (plan: PlannedNetwork) => SandboxHandle,
    private readonly net: HostNetwork,
    private readonly configureInGuest: boolean,
  ) {}

  get id(): string {
    return this.spec.id;
  }

  /** The inner driver's handle once started (a VM capture freezes it, not this wrapper). */
  get innerHandle(): SandboxHandle | undefined {
    return this.inner;
  }

  get needsIdentity(): boolean | undefined {
    return this.inner?.needsIdentity;
  }

  get pause(): (() => Promise<void>) | undefined {
    return this.inner?.pause?.bind(this.inner);
  }

  get resume(): ((undo: CleanupStack, signal?: AbortSignal) => Promise<GuestStream>) | undefined {
    return this.inner?.resume?.bind(this.inner);
  }

  /** VMs configure their address over the agent channel (gVisor's comes with its namespace). */
  get guestNetwork(): GuestNetwork | undefined {
    return this.configureInGuest ? this.plan?.guest : undefined;
  }

  /** The inner driver's diagnostics, which boot failures log. */
  get diagnostics(): string | undefined {
    return this.inner?.diagnostics;
  }

  get startSteps(): Readonly<Record<string, number>> {
    return { ...(this.networkMs === undefined ? {} : { network: this.networkMs }), ...this.inner?.startSteps };
  }

  /**
   * The network goes onto `undo` before anything of it is made (a plumb cut short leaves parts).
   * The plumb runs while the inner driver makes the rest (disk, mounts, bundle, cgroup), which
   * awaits it right before it spawns the runtime. The start settles only once the plumb has too,
   * so the boot's undos never run while either is still making something: a failed mount does not
   * leave a namespace plumbed after its teardown, and a failed plumb is undone with the mounts.
   */
  async start(undo: CleanupStack, signal?: AbortSignal): Promise<GuestStream> {
    const t0 = performance.now();
    const plan = await this.planNetwork();
    this.plan = plan;
    undo.push("network", () => this.net.teardown(plan.sandboxId));
    this.inner = this.makeInner(plan);
    if (!this.plumb) {
      this.networkMs = Math.round(performance.now() - t0);
      return this.inner.start(undo, signal);
    }
    const plumbed = this.net.plumb(plan).finally(() => {
      this.networkMs = Math.round(performance.now() - t0);
    });
    const settled = plumbed.then(
      () => undefined,
      () => undefined,
    );
    try {
      return await this.inner.start(undo, signal, plumbed);
    } finally {
      await settled;
    }
  }

  wait(): Promise<ExitInfo> {
    return this.inner?.wait() ?? Promise.resolve({ code: null, signal: null });
  }

  async shutdown(timeoutMs: number): Promise<void> {
    await this.inner?.shutdown(timeoutMs);
  }

  async kill(): Promise<void> {
    await this.inner?.kill();
  }

  async stop(): Promise<void> {
    try {
      await this.inner?.stop();
    } finally {
      await this.net.teardown(this.spec.id);
    }
  }

  destroy(): Promise<void> {
    this.destroying ??= (async () => {
      try {
        await this.inner?.destroy();
      } finally {
        await this.net.teardown(this.spec.id);
      }
    })().catch((err: unknown) => {
      this.destroying = undefined; // a failed destroy may be tried again
      throw err;
    });
    return this.destroying;
  }
}
