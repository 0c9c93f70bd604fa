import { BothyError } from "@bothy/protocol";
import { randomBytes } from "node:crypto";
import { AgentClient, type GuestIdentity } from "../agent/agent-client.ts";
import { bootTimeoutMs, type Driver, type SandboxHandle, type SandboxSpec } from "../drivers/driver.ts";
import { configureGuestNetwork } from "../network/guest-config.ts";
import { BootError, type BootStep } from "../errors/internal-errors.ts";

/** A sandbox whose guest agent has answered the handshake. */
export interface BootedSandbox {
  spec: SandboxSpec;
  handle: SandboxHandle;
  agent: AgentClient;
}

/**
 * Boots one sandbox up to a ready agent. On any failure everything it made is destroyed before
 * the error is thrown, so a failed boot leaves nothing on the host.
 */
export async function bootSandbox(
  driver: Driver,
  spec: SandboxSpec,
  timeoutMs: number,
  signal?: AbortSignal,
): Promise<BootedSandbox> {
  const handle = driver.create(spec);
  let agent: AgentClient | undefined;
  let step: BootStep = "start";
  try {
    const stream = await handle.start(signal);
    agent = new AgentClient(stream.input, stream.output);
    const exited = handle.wait().then((exit) => {
      const diagnostics = driverSaid(handle);
      throw new BootError(
        step,
        `Sandbox ${spec.id} exited during boot (code ${exit.code ?? "none"}, signal ${exit.signal ?? "none"}).`,
        diagnostics ? { diagnostics } : {},
      );
    });
    step = "handshake";
    await Promise.race([
      agent.handshake(bootTimeoutMs(driver.acceleration, timeoutMs), signal, stream.resync === true),
      exited,
    ]);
    // A sandbox taken over after a server restart already has its identity and network.
    step = "identify";
    if (handle.needsIdentity && !spec.attach) await Promise.race([agent.identify(guestIdentity(spec)), exited]);
    step = "network";
    if (handle.guestNetwork && !spec.attach)
      await Promise.race([configureGuestNetwork(agent, handle.guestNetwork), exited]);
    step = "limits";
    if (!spec.attach) await Promise.race([applyLimits(agent, spec, handle), exited]);
    exited.catch(() => undefined);
    return { spec, handle, agent };
  } catch (err) {
    const diagnostics = driverSaid(handle);
    agent?.close(new BothyError("agent_unavailable", "Boot failed."));
    // A sandbox started again on its disk keeps it: the files are not this boot's to remove.
    await (spec.reuseDisk ? handle.stop() : handle.destroy());
    if (err instanceof BootError) throw err;
    throw new BootError(step, `Could not boot sandbox ${spec.id}: ${STEP_FAILED[step]}.`, {
      cause: err,
      ...(diagnostics ? { diagnostics } : {}),
    });
  }
}

/** What each step's failure means, in words a client may see. */
const STEP_FAILED: Record<BootStep, string> = {
  prepare: "its files could not be prepared",
  start: "the driver could not start it",
  attach: "its running VM or container could not be taken over",
  restore: "its saved memory could not be restored",
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

function driverSaid(handle: SandboxHandle): string | undefined {
  return (handle as { diagnostics?: string }).diagnostics?.slice(-500) || undefined;
}
