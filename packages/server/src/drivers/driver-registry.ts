import { join } from "node:path";
import { BothyError, DRIVER_NAMES, type DriverName } from "@bothy/protocol";
import type { Config } from "../config.ts";
import { describeCauses, HostSetupError } from "../errors/internal-errors.ts";
import type { Driver } from "./driver.ts";
import { GvisorDriver } from "./gvisor-driver.ts";
import { describeLayout, hostCgroupLayout, limitsProblem, removeHomeCgroups } from "./host-cgroups.ts";
import { hardwareVirtualization, QemuDriver } from "./qemu-driver.ts";
import { HostNetwork } from "../network/host-network.ts";
import { NetworkedDriver } from "../network/networked-driver.ts";
import type { GatewayPorts } from "../network/nft-ruleset.ts";
import type { Logger } from "../events/server-events.ts";
import { hostTag } from "../util/host-names.ts";

/**
 * The drivers this host can run, and the default one. A driver whose preflight failed is kept
 * as the reason it failed, so a request for it gets an answer that says what to install.
 */
export class DriverRegistry {
  constructor(
    private readonly ready: ReadonlyMap<DriverName, Driver>,
    private readonly unavailable: ReadonlyMap<DriverName, string>,
    readonly defaultName: DriverName,
    /** The home's tag (util/host-names.ts): its parent cgroups go at close. */
    private readonly tag: string,
    /** The host's sandbox networking, when it is on (the egress gateway looks sandboxes up by address there). */
    readonly network?: HostNetwork,
  ) {}

  get default(): Driver {
    return this.get(this.defaultName);
  }

  /** The driver of that name (the default when omitted), or a `not_supported` error saying why not. */
  get(name?: string): Driver {
    const wanted = (name ?? this.defaultName) as DriverName;
    const driver = this.ready.get(wanted);
    if (driver) return driver;
    const why = this.unavailable.get(wanted);
    throw new BothyError(
      "not_supported",
      why
        ? `The ${wanted} driver is not available on this host: ${why}`
        : `Unknown driver "${String(name)}"; drivers are ${DRIVER_NAMES.join(", ")}.`,
    );
  }

  all(): Driver[] {
    return [...this.ready.values()];
  }

  /** Removes a sandbox's host objects whichever driver made them; each driver finds its own. */
  async removeOrphan(sandboxId: string): Promise<void> {
    for (const d of this.all()) await d.removeOrphan(sandboxId);
  }

  /** Removes a sandbox's host objects but its disk, whichever driver made them. */
  async release(sandboxId: string): Promise<void> {
    for (const d of this.all()) await d.release(sandboxId);
  }

  /** After every sandbox has stopped: what the drivers share on the host goes too. */
  async close(): Promise<void> {
    await this.network?.close();
    await removeHomeCgroups(await hostCgroupLayout(), this.tag);
  }
}

/**
 * Preflights every driver. The configured default must work; the others are offered when they
 * do. `auto` means QEMU where hardware virtualization really works (KVM), gVisor elsewhere:
 * QEMU under software emulation works but boots several times slower.
 */
export async function createDrivers(config: Config, log: Logger, gatewayPorts?: GatewayPorts): Promise<DriverRegistry> {
  const sandboxesDir = join(config.home, "sandboxes");
  const tag = hostTag(config.home);
  const candidates: Record<DriverName, Driver> = {
    gvisor: new GvisorDriver({
      runscRoot: join(config.home, "runsc"),
      sandboxesDir,
      agentPath: config.agentPath,
      hostTag: tag,
      hostLimits: config.hostLimits,
      runscPath: config.gvisor.runsc,
      platform: config.gvisor.platform,
      ...(config.gvisor.agentNode === undefined ? {} : { agentNode: config.gvisor.agentNode }),
      agentStart: config.gvisor.agentStart,
      log,
    }),
    qemu: new QemuDriver({
      home: config.home,
      hostTag: tag,
      kernelDir: config.qemu.kernelDir,
      sandboxesDir,
      agentPath: config.agentPath,
      tbSizeMib: config.qemu.tbSizeMib,
      warmStart: config.qemu.warmStart,
      bootTimeoutMs: config.bootTimeoutMs,
      network: config.network.enabled,
      hostLimits: config.hostLimits,
      log,
    }),
  };
  // Networking is checked first: with it on, a host that cannot give sandboxes their posture
  // does not start (the error says what to run, or to set BOTHY_NETWORK=off).
  const network = config.network.enabled
    ? new HostNetwork({ ...config.network, tag, sandboxesDir, log, ...(gatewayPorts ? { gatewayPorts } : {}) })
    : undefined;
  await network?.preflight().catch((err: unknown) => {
    throw err instanceof HostSetupError ? new BothyError("create_failed", err.message, { cause: err }) : err;
  });
  const ready = new Map<DriverName, Driver>();
  const unavailable = new Map<DriverName, string>();
  const failures = new Map<DriverName, unknown>();
  for (const name of DRIVER_NAMES) {
    try {
      await candidates[name].preflight();
      ready.set(
        name,
        network ? new NetworkedDriver(candidates[name], network, name === "gvisor" ? "veth" : "tap") : candidates[name],
      );
    } catch (err) {
      unavailable.set(name, err instanceof Error ? err.message : String(err));
      failures.set(name, err);
    }
  }
  const defaultName: DriverName =
    config.driver !== "auto"
      ? config.driver
      : ready.has("qemu") && (await hardwareVirtualization())
        ? "qemu"
        : "gvisor";
  const cgroups = await hostCgroupLayout();
  // The log has each refusal's whole cause chain (a failed apt-get's output, say); clients see its message.
  log("drivers", {
    default: defaultName,
    host_tag: tag,
    ready: [...ready.keys()],
    unavailable: Object.fromEntries([...failures].map(([name, err]) => [name, describeCauses(err)])),
    acceleration: ready.get("qemu")?.acceleration ?? null,
    cgroups: describeLayout(cgroups),
    host_limits: limitsProblem(cgroups) === undefined ? "enforced" : config.hostLimits === "off" ? "off" : "refused",
  });
  const why = unavailable.get(defaultName);
  if (why !== undefined)
    throw new BothyError("create_failed", `The default driver ${defaultName} cannot run here: ${why}`, {
      cause: failures.get(defaultName),
    });
  return new DriverRegistry(ready, unavailable, defaultName, tag, network);
}
