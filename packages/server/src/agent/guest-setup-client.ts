/**
 * What the host tells a guest on each boot over the agent channel: who it is (id, hostname, env,
 * clock, entropy) and its limits; each resolves once the guest has applied it.
 */
import type { GuestVolume } from "../drivers/driver.ts";
import type { AgentChannel } from "./agent-channel.ts";

export interface GuestIdentity {
  sandboxId: string;
  hostname: string;
  env: Record<string, string>;
  /** Fresh host randomness the guest credits to its kernel RNG (at least 32 bytes). */
  entropy: Buffer;
}

export class GuestSetupClient {
  constructor(private readonly channel: AgentChannel) {}

  /** Tells the guest who it is (see the `identity` frame); resolves once it has applied it. */
  identify(identity: GuestIdentity): Promise<void> {
    return this.channel.request(
      "identity",
      (id) => ({
        t: "identity",
        id,
        sandbox_id: identity.sandboxId,
        hostname: identity.hostname,
        env: identity.env,
        time_ms: Date.now(),
      }),
      "identity_done",
      () => undefined,
      identity.entropy,
    );
  }

  /** Gives the guest its limits (see the `limits` frame); resolves once it has applied them. */
  applyLimits(limits: { maxProcesses: number; rootBytes?: number }): Promise<void> {
    return this.channel.request(
      "limits",
      (id) => ({ t: "limits", id, max_processes: limits.maxProcesses, root_bytes: limits.rootBytes }),
      "done",
      () => undefined,
    );
  }

  /** Has a VM guest mount its volumes (see the `volumes` frame); resolves once they are mounted. */
  mountVolumes(volumes: readonly GuestVolume[]): Promise<void> {
    return this.channel.request(
      "volumes",
      (id) => ({
        t: "volumes",
        id,
        mounts: volumes.map((v) => ({ serial: v.serial, path: v.path, read_only: v.readOnly })),
      }),
      "done",
      () => undefined,
    );
  }
}
