import { readFileSync } from "node:fs";
import { startupSnapshot } from "node:v8";

/**
 * What the agent takes from its environment, read once when it starts and never while its modules
 * load: in gVisor the agent's heap is a V8 startup snapshot built on the host (snapshot-main.ts),
 * so a value a module read at load would be the host's, from the day the snapshot was built.
 */
export interface AgentEnv {
  /** The virtio-serial port of the host channel (BOTHY_CHANNEL, VMs); unset: stdio (gVisor). */
  readonly channel: string | undefined;
  /** In a VM (QEMU) rather than in gVisor. */
  readonly inVm: boolean;
  /**
   * Installed beside the agent (QEMU initramfs, gVisor bind mount): RNG reseed, clock, disk
   * growth and the command spawner. BOTHY_HELPER names another (the agent's tests run it on the host).
   */
  readonly helper: string;
  /**
   * The cgroup every command runs under (BOTHY_COMMANDS_CGROUP), made by the sandbox's PID 1
   * (bothy-init in gVisor, pid1.sh in VMs): its pids.max is the sandbox's process limit. The
   * agent itself stays outside it.
   */
  readonly commandsCgroup: string | undefined;
  /**
   * The command spawner bothy-init started beside the agent (BOTHY_SPAWNER, "CONTROL STREAMS"):
   * the socket the agent connects to for its requests, and the one its commands' streams connect
   * to. Unset (QEMU guests, an agent outside a sandbox): the agent starts the helper itself.
   */
  readonly spawner: { control: string; streams: string } | undefined;
  /**
   * Behind bothy-init's native front (BOTHY_FRONT=1, gVisor): bothy-init answers the host's hello
   * and `limits` and started this agent for a frame that needs it, so the agent's hello (answered
   * by bothy-init, never seen by the host) waits for the spawner: the frames waiting for it
   * include a command, which must find the helper up.
   */
  readonly front: boolean;
  /**
   * After a read that emptied a command's pipe, how long the agent waits before reading it again:
   * a program writing in small pieces (4 KiB is common) then fills the pipe meanwhile, and the
   * next read and frame carry up to 64 KiB instead of one piece each. Only where each read and
   * frame is costly: in an emulated VM (the host says so on the kernel command line,
   * `bothy.output_rest_ms`) one costs milliseconds of the guest's only CPU, the same CPU the
   * command runs on. Elsewhere 0: a rest would cap a fast command's output at 64 KiB per rest.
   */
  readonly outputRestMs: number;
}

const OWN_VARIABLES = [
  "BOTHY_CHANNEL",
  "BOTHY_HELPER",
  "BOTHY_COMMANDS_CGROUP",
  "BOTHY_SPAWNER",
  "BOTHY_FRONT",
] as const;

let env: AgentEnv | undefined;

/** The agent's environment; the first call reads it and removes the agent's own variables, which commands never see. */
export function agentEnv(): AgentEnv {
  if (env) return env;
  if (startupSnapshot.isBuildingSnapshot())
    throw new Error("the agent's environment was read while its startup snapshot was being built");
  const channel = process.env["BOTHY_CHANNEL"];
  const inVm = channel !== undefined;
  env = {
    channel,
    inVm,
    helper: process.env["BOTHY_HELPER"] ?? "/opt/bothy/bothy-helper",
    commandsCgroup: process.env["BOTHY_COMMANDS_CGROUP"],
    spawner: spawnerSockets(process.env["BOTHY_SPAWNER"]),
    front: process.env["BOTHY_FRONT"] === "1",
    outputRestMs: inVm ? outputRestMs() : 0,
  };
  for (const name of OWN_VARIABLES) delete process.env[name];
  return env;
}

/** The host's `bothy.output_rest_ms` on the VM's kernel command line; 0 when absent. */
function outputRestMs(): number {
  try {
    return Number(/\bbothy\.output_rest_ms=(\d{1,4})\b/.exec(readFileSync("/proc/cmdline", "utf8"))?.[1] ?? 0);
  } catch {
    return 0;
  }
}

function spawnerSockets(value: string | undefined): AgentEnv["spawner"] {
  const [control, streams, ...rest] = value?.split(" ") ?? [];
  return control && streams && rest.length === 0 ? { control, streams } : undefined;
}
