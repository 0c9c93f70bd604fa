import { BothyError } from "@bothy/protocol";
import { randomBytes } from "node:crypto";
import { AgentClient, type GuestIdentity } from "../agent/agent-client.ts";
import {
  bootTimeoutMs,
  type Driver,
  type GuestStream,
  type SandboxHandle,
  type SandboxSpec,
} from "../drivers/driver.ts";
import { configureGuestNetwork } from "../network/guest-config.ts";
import { installGuestTrust } from "../gateway/guest-trust.ts";
import { BootError, NotSupportedError, type BootStep } from "../errors/internal-errors.ts";
import { CleanupStack } from "../util/cleanup-stack.ts";

/** A sandbox whose guest agent has answered the handshake. */
export interface BootedSandbox {
  spec: SandboxSpec;
  handle: SandboxHandle;
  agent: AgentClient;
  /** How long each boot step took (ms), and the driver's own start phases as `start.<phase>`. */
  stepsMs?: Readonly<Record<string, number>>;
}

/**
 * How a boot starts:
 * - `new`: a sandbox made now, from its template;
 * - `kept disk`: a stopped sandbox (slept gVisor, or one a crash or restart stopped) booted cold on
 *   the disk it kept;
 * - `wake`: a sandbox a pause left on disk with its memory (a server restart came between the
 *   pause and now) restored from that memory on a new handle; if that fails it boots as `kept disk`;
 * - `take-over`: one still running from before a server restart, connected to again;
 * - `resume`: a paused sandbox whose handle the server holds (paused on request or by idle
 *   sleep), restored from the memory its pause saved.
 */
export type BootMode = "new" | "kept disk" | "wake" | "take-over" | "resume";

type StepName = Extract<
  BootStep,
  "start" | "attach" | "restore" | "handshake" | "identify" | "network" | "limits" | "volumes" | "trust"
>;

/** The named steps of each mode, in order. */
export const BOOT_STEPS: Record<BootMode, readonly StepName[]> = {
  new: ["start", "handshake", "identify", "network", "limits", "volumes", "trust"],
  "kept disk": ["start", "handshake", "identify", "network", "limits", "volumes", "trust"],
  // The restored guest gets its identity (clock, entropy), network and limits again: it runs on a
  // new link and cgroup. The egress CA is installed again too: a template's snapshot lacks it. Its
  // volumes are still mounted (the guest leaves them so).
  wake: ["restore", "handshake", "identify", "network", "limits", "volumes", "trust"],
  // It already has its identity, network and limits.
  "take-over": ["attach", "handshake"],
  // The same VM on the same link: only its clock and entropy are new.
  resume: ["restore", "handshake", "identify"],
};

/** The mode of a boot on a new handle (a `resume` reuses the handle it has: `resumeSandbox`). */
export function bootMode(spec: SandboxSpec, driver: Pick<Driver, "savedMemory">): Exclude<BootMode, "resume"> {
  if (spec.attach) return "take-over";
  if (!spec.reuseDisk) return "new";
  return spec.fromMemory !== false && driver.savedMemory?.(spec) === true ? "wake" : "kept disk";
}

/** What the steps of one boot share. */
interface Boot {
  readonly mode: BootMode;
  readonly driver: Driver;
  readonly spec: SandboxSpec;
  readonly handle: SandboxHandle;
  readonly timeoutMs: number;
  readonly signal: AbortSignal | undefined;
  /** Every undo of this boot, the driver's included: the one place a failure unwinds. */
  readonly cleanup: CleanupStack;
  /** The step running now: a sandbox that exits during boot failed in it. */
  step: StepName;
  stream?: GuestStream;
  agent?: AgentClient;
  /** Rejects when the sandbox exits before the boot is over; every later step races it. */
  exited?: Promise<never>;
}

/**
 * The first step of every mode: the driver makes the sandbox run (starts it, attaches to it, or
 * restores it), pushing the undo of each host object it makes; then a new agent client on its channel.
 */
async function launch(b: Boot): Promise<void> {
  if (b.mode === "resume") {
    const resume = b.handle.resume?.bind(b.handle);
    if (!resume) throw new NotSupportedError("This driver cannot resume sandboxes.");
    b.stream = await resume(b.cleanup, b.signal);
  } else {
    b.stream = await b.handle.start(b.cleanup, b.signal);
  }
  const agent = (b.agent = new AgentClient(b.stream.input, b.stream.output));
  agent.commandEnv = b.spec.commandEnv ?? {};
  b.cleanup.push("agent", () => agent.close(new BothyError("agent_unavailable", "Boot failed.")));
  b.exited = b.handle.wait().then((exit) => {
    throw new BootError(
      b.step,
      `Sandbox ${b.spec.id} exited during boot (code ${exit.code ?? "none"}, signal ${exit.signal ?? "none"}).`,
      diagnosticsOf(b.handle),
    );
  });
  b.exited.catch(() => undefined);
}

const STEPS: Record<StepName, (b: Boot) => Promise<void>> = {
  start: launch,
  attach: launch,
  restore: launch,
  async handshake(b) {
    await race(
      b,
      agentOf(b).handshake(bootTimeoutMs(b.driver.acceleration, b.timeoutMs), b.signal, b.stream?.resync === true),
    );
  },
  async identify(b) {
    if (b.handle.needsIdentity) await race(b, agentOf(b).identify(guestIdentity(b.spec)));
  },
  async network(b) {
    if (b.handle.guestNetwork) await race(b, configureGuestNetwork(agentOf(b), b.handle.guestNetwork));
  },
  async limits(b) {
    await race(b, applyLimits(agentOf(b), b.spec, b.handle));
  },
  async volumes(b) {
    const volumes = b.handle.guestVolumes;
    if (!volumes?.length) return;
    try {
      await race(b, agentOf(b).mountVolumes(volumes));
    } catch (err) {
      throw new BootError("volumes", "The guest could not mount its volumes.", { cause: err });
    }
  },
  async trust(b) {
    const ca = b.spec.egressCa;
    if (ca === undefined) return;
    try {
      await race(b, installGuestTrust(agentOf(b), ca));
    } catch (err) {
      throw new BootError("trust", "The guest could not install the egress gateway's CA.", { cause: err });
    }
  },
};

/**
 * Boots one sandbox on a new handle up to a ready agent, step by step (BOOT_STEPS). The driver
 * and each step push the undo of what they make; on any failure the undos run once, newest first,
 * before the error is thrown, so a failed boot leaves nothing on the host but a kept disk (and a
 * paused sandbox's saved memory, unless its restore got as far as running it). A `wake` that fails
 * boots again as `kept disk`, after `onWakeFailed` heard why.
 */
export async function bootSandbox(
  driver: Driver,
  spec: SandboxSpec,
  timeoutMs: number,
  options: { signal?: AbortSignal; onWakeFailed?: (err: unknown) => void } = {},
): Promise<BootedSandbox> {
  const mode = bootMode(spec, driver);
  const handle = driver.create(mode === "wake" ? { ...spec, fromMemory: true } : { ...spec, fromMemory: false });
  try {
    return await runSteps(mode, driver, spec, handle, timeoutMs, options.signal);
  } catch (err) {
    // A driver's refusal stands; anything else of a restore is worth a cold boot on the same disk.
    if (mode !== "wake" || err instanceof NotSupportedError) throw err;
    options.onWakeFailed?.(err);
    return bootSandbox(driver, { ...spec, fromMemory: false }, timeoutMs, { ...options, onWakeFailed: undefined });
  }
}

/**
 * Brings a paused sandbox back on the handle the server holds (mode `resume`): the driver restores
 * it, a new agent client asks the running agent for a fresh hello, and the guest gets its identity
 * again (the clock moved; new entropy does no harm). The old client was closed at pause. A failed
 * resume unwinds what it made and leaves the sandbox paused; what becomes of it is the caller's call.
 */
export async function resumeSandbox(
  driver: Driver,
  booted: BootedSandbox,
  timeoutMs: number,
  signal?: AbortSignal,
): Promise<void> {
  const done = await runSteps("resume", driver, booted.spec, booted.handle, timeoutMs, signal);
  booted.agent = done.agent;
}

async function runSteps(
  mode: BootMode,
  driver: Driver,
  spec: SandboxSpec,
  handle: SandboxHandle,
  timeoutMs: number,
  signal: AbortSignal | undefined,
): Promise<BootedSandbox> {
  const steps = BOOT_STEPS[mode];
  const b: Boot = {
    mode,
    driver,
    spec,
    handle,
    timeoutMs,
    signal,
    cleanup: new CleanupStack(),
    step: steps[0] ?? "start",
  };
  const stepsMs: Record<string, number> = {};
  try {
    for (const step of steps) {
      b.step = step;
      const t0 = performance.now();
      await STEPS[step](b);
      stepsMs[step] = Math.round(performance.now() - t0);
    }
    b.cleanup.release();
    for (const [phase, ms] of Object.entries(handle.startSteps ?? {})) stepsMs[`start.${phase}`] = ms;
    return { spec, handle, agent: agentOf(b), stepsMs };
  } catch (err) {
    const diagnostics = diagnosticsOf(handle);
    const undone: unknown[] = [];
    await b.cleanup.run((_name, e) => undone.push(e));
    // A failed undo is for the log (the cause chain), never the client's message.
    const cause = undone.length === 0 ? err : new AggregateError([err, ...undone], "boot failed, and undoing it too");
    // A driver's own account of the step stands, with what the driver printed added for the log.
    if (err instanceof BootError && undone.length === 0)
      throw err.diagnostics || !diagnostics.diagnostics
        ? err
        : new BootError(err.step, err.message, { cause: err, ...diagnostics });
    // A driver's refusal (this host cannot give what was asked, and how to fix it) is the answer as it is.
    if (err instanceof NotSupportedError)
      throw undone.length === 0 ? err : new NotSupportedError(err.message, { cause });
    throw new BootError(b.step, `Could not ${VERB[mode]} sandbox ${spec.id} (${mode}): ${STEP_FAILED[b.step]}.`, {
      cause,
      ...diagnostics,
    });
  }
}

const VERB: Record<BootMode, string> = {
  new: "boot",
  "kept disk": "boot",
  wake: "wake",
  "take-over": "take over",
  resume: "resume",
};

/** What each step's failure means, in words a client may see. */
const STEP_FAILED: Record<StepName, string> = {
  start: "the driver could not start it",
  attach: "the driver could not attach to it",
  restore: "the driver could not restore it from its saved memory",
  handshake: "its guest agent did not answer",
  identify: "its guest agent did not take its identity",
  network: "its guest network could not be configured",
  limits: "the guest could not apply the sandbox's limits",
  volumes: "the guest could not mount its volumes",
  trust: "the guest could not install the egress gateway's CA certificate",
};

/** The process limit, and a VM's root file system grown to the disk the driver made. */
async function applyLimits(agent: AgentClient, spec: SandboxSpec, handle: SandboxHandle): Promise<void> {
  try {
    await agent.applyLimits({
      maxProcesses: spec.maxProcesses,
      ...(handle.guestRootBytes === undefined ? {} : { rootBytes: handle.guestRootBytes }),
    });
  } catch (err) {
    throw new BootError("limits", "The guest could not apply the sandbox's limits.", { cause: err });
  }
}

/** What a restored or freshly booted VM guest is told about itself; the entropy is new each time. */
export function guestIdentity(spec: SandboxSpec): GuestIdentity {
  return { sandboxId: spec.id, hostname: spec.id, env: spec.templateEnv, entropy: randomBytes(64) };
}

/** The end of what the driver said (console, runsc log), kept on the error for the log only. */
function diagnosticsOf(handle: SandboxHandle): { diagnostics?: string } {
  const diagnostics = handle.diagnostics?.slice(-500);
  return diagnostics ? { diagnostics } : {};
}

function agentOf(b: Boot): AgentClient {
  if (!b.agent) throw new BothyError("internal", `Boot of ${b.spec.id} has no agent before its start step.`);
  return b.agent;
}

/** A step's wait ends early, with the reason, when the sandbox exits during boot. */
function race<T>(b: Boot, work: Promise<T>): Promise<T> {
  return b.exited ? Promise.race([work, b.exited]) : work;
}
