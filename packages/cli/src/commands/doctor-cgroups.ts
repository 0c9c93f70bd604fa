/** `bothy doctor`'s cgroup checks: they run the server's own layout detection, so doctor and server agree. */
import { describeLayout, HOST_LIMITS_ENV, limitsProblem, type CgroupLayout } from "@bothy/server";
import type { Check } from "./doctor.ts";

export { hostCgroupLayout, HOST_LIMITS_ENV } from "@bothy/server";

/**
 * Whether each driver's sandboxes get their CPU quota, memory limit and pids backstop on this
 * host's cgroup layout (the server's own detection, so doctor and server agree): gVisor's from
 * runsc, a VM's from the server, which puts its QEMU in the sandbox's cgroup. Without the
 * controllers the server refuses to start sandboxes unless BOTHY_HOST_LIMITS=off.
 */
export function cgroupChecks(layout: CgroupLayout, hostLimits: string | undefined): Check[] {
  const where = (
    layout.version === 2 ? [layout.root] : Object.values(layout.controllers).filter((d) => d !== undefined)
  )
    .map((d) => `${d}/bothy-<tag>/<id>`)
    .join(", ");
  const problem = limitsProblem(layout);
  const drivers = [
    { name: "limits (gVisor)", how: "runsc sets each sandbox's CPU quota, memory limit and pids backstop" },
    { name: "limits (QEMU)", how: "the server puts each VM's QEMU, with its limits," },
  ];
  return drivers.map(({ name, how }): Check => {
    if (problem === undefined)
      return {
        name,
        status: "ok",
        detail: `${describeLayout(layout)}: ${how} in ${where}`,
      };
    if (hostLimits === "off")
      return {
        name,
        status: "warn",
        detail: `${describeLayout(layout)}: sandboxes run WITHOUT CPU, memory and process limits (${HOST_LIMITS_ENV}=off)`,
        fix: problem,
      };
    return {
      name,
      status: "fail",
      detail: `${describeLayout(layout)}: the server refuses to start sandboxes (not_supported)`,
      fix: problem,
    };
  });
}
