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
import { BootError, type BootStep } from "../errors/internal-errors.ts";
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
 * How a boot starts: a new sandbox; one started again on the disk it kept (woken, or restored from
 * the memory a pause saved); one still running from before a server restart, taken over.
 */
export type BootMode = "new" | "kept disk" | "take-over";

type StepName = Extract<BootStep, "start" | "handshake" | "identify" | "network" | "limits">;

/** The named steps of each mode, in order. A new boot and one on a kept disk differ only in the start's undo. */
export const BOOT_STEPS: Record<BootMode, readonly StepName[]> = {
  new: ["start", "handshake", "identify", "network", "limits"],
  "kept disk": ["start", "handshake", "identify", "network", "limits"],
  // It already has its identity, network and limits.
  "take-over": ["start", "handshake"],
};

export function bootMode(spec: SandboxSpec): BootMode {
  return spec.attach ? "take-over" : spec.reuseDisk ? "kept disk" : "new";
}

/** What the steps of one boot share. */
interface Boot {
  readonly mode: BootMode;
  readonly driver: Driver;
  readonly spec: SandboxSpec;
  readonly handle: SandboxHandle;
  readonly timeoutMs: number;
  readonly signal: AbortSignal | undefined;
  readonly cleanup: CleanupStack;
  /** The step running now: a sandbox that exits during boot failed in it. */
  step: StepName;
  stream?: GuestStream;
  agent?: AgentClient;
  /** Rejects when the sandbox exits before the boot is over; every later step races it. */
  exited?: Promise<never>;
}

const STEPS: Record<StepName, (b: Boot) => Promise<void>> = {
  async start(b) {
    // Undo first: a start that fails half-way may have made host objects. A kept disk is not this
    // boot's to remove.
    b.cleanup.push("start", () => (b.mode === "new" ? b.handle.destroy() : b.handle.stop()));
    b.stream = await b.handle.start(b.signal);
    const agent = (b.agent = new AgentClient(b.stream.input, b.stream.output));
    b.cleanup.push("agent", () => agent.close(new BothyError("agent_unavailable", "Boot failed.")));
    b.exited = b.handle.wait().then((exit) => {
      throw new BootError(
        b.step,
        `Sandbox ${b.spec.id} exited during boot (code ${exit.code ?? "none"}, signal ${exit.signal ?? "none"}).`,
        diagnosticsOf(b.handle),
      );
    });
    b.exited.catch(() => undefined);
  },
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
};

/**
 * Boots one sandbox up to a ready agent, step by step (BOOT_STEPS). Each step that makes something
 * pushes its undo; on any failure the undos run once, newest first, before the error is thrown, so
 * a failed boot leaves nothing on the host (but a kept disk).
 */
export async function bootSandbox(
  driver: Driver,
  spec: SandboxSpec,
  timeoutMs: number,
  signal?: AbortSignal,
): Promise<BootedSandbox> {
  const mode = bootMode(spec);
  const b: Boot = {
    mode,
    driver,
    spec,
    handle: driver.create(spec),
    timeoutMs,
    signal,
    cleanup: new CleanupStack(),
    step: "start",
  };
  const stepsMs: Record<string, number> = {};
  try {
    for (const step of BOOT_STEPS[mode]) {
      b.step = step;
      const t0 = performance.now();
      await STEPS[step](b);
      stepsMs[step] = Math.round(performance.now() - t0);
    }
    b.cleanup.release();
    for (const [phase, ms] of Object.entries(b.handle.startSteps ?? {})) stepsMs[`start.${phase}`] = ms;
    return { spec, handle: b.handle, agent: agentOf(b), stepsMs };
  } catch (err) {
    const diagnostics = diagnosticsOf(b.handle);
    const undone: unknown[] = [];
    await b.cleanup.run((_name, e) => undone.push(e));
    // A failed undo is for the log (the cause chain), never the client's message.
    const cause = undone.length === 0 ? err : new AggregateError([err, ...undone], "boot failed, and undoing it too");
    if (err instanceof BootError && undone.length === 0) throw err;
    // A driver's refusal (this host cannot give what was asked, and how to fix it) is the answer as it is.
    if (err instanceof BothyError && err.code === "not_supported")
      throw undone.length === 0 ? err : new BothyError(err.code, err.message, { cause });
    throw new BootError(b.step, `Could not boot sandbox ${spec.id} (${mode}): ${STEP_FAILED[b.step]}.`, {
      cause,
      ...diagnostics,
    });
  }
}

/** What each step's failure means, in words a client may see. */
const STEP_FAILED: Record<StepName, string> = {
  start: "the driver could not start it",
  handshake: "its guest agent did not answer",
  identify: "its guest agent did not take its identity",
  network: "its guest network could not be configured",
  limits: "the guest could not apply the sandbox's limits",
};

/**
 * Brings a paused sandbox back: the driver restores it, a new agent client asks the running agent
 * for a fresh hello, and the guest gets its identity again (the clock moved; new entropy does no
 * harm). The old client was closed at pause.
 */
export async function reattachSandbox(booted: BootedSandbox, timeoutMs: number, signal?: AbortSignal): Promise<void> {
  const resume = booted.handle.resume?.bind(booted.handle);
  if (!resume) throw new BothyError("not_supported", "This driver cannot resume sandboxes.");
  const stream = await resume(signal);
  const agent = new AgentClient(stream.input, stream.output);
  try {
    await agent.handshake(timeoutMs, signal, true);
    if (booted.handle.needsIdentity) await agent.identify(guestIdentity(booted.spec));
  } catch (err) {
    agent.close(new BothyError("agent_unavailable", "Resume failed."));
    throw new BootError("handshake", `Sandbox ${booted.spec.id} was restored but its agent did not answer.`, {
      cause: err,
    });
  }
  booted.agent = agent;
}

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
