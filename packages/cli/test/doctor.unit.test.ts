import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { parseCgroupLayout } from "@bothy/server";
import { cgroupChecks } from "../src/commands/doctor-cgroups.ts";

const HYBRID = `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`;

const roots: string[] = [];
afterAll(() => {
  for (const r of roots) rmSync(r, { recursive: true, force: true });
});

function v2(controllers: string): ReturnType<typeof parseCgroupLayout> {
  const root = mkdtempSync(join(tmpdir(), "bothy-doctor-"));
  roots.push(root);
  writeFileSync(join(root, "cgroup.controllers"), controllers);
  return parseCgroupLayout(`26 25 0:24 / ${root} rw - cgroup2 cgroup2 rw\n`, root);
}

describe("bothy doctor's cgroup checks", () => {
  it("says both drivers are limited on a cgroup v1 hybrid host, and where", () => {
    const checks = cgroupChecks(parseCgroupLayout(HYBRID), undefined);
    expect(checks.map((c) => [c.name, c.status])).toEqual([
      ["limits (gVisor)", "ok"],
      ["limits (QEMU)", "ok"],
    ]);
    expect(checks[0]?.detail).toBe(
      "cgroup v1 (hybrid) with cpu, memory, pids: runsc sets each sandbox's CPU quota, memory limit and pids backstop in /sys/fs/cgroup/cpu/bothy-<tag>/<id>, /sys/fs/cgroup/memory/bothy-<tag>/<id>, /sys/fs/cgroup/pids/bothy-<tag>/<id>",
    );
    expect(checks[1]?.detail).toMatch(/^cgroup v1 \(hybrid\).*: the server puts each VM's QEMU, with its limits, in /);
  });

  it("says both drivers are limited on a pure cgroup v2 host", () => {
    const layout = v2("cpuset cpu io memory pids\n");
    const checks = cgroupChecks(layout, undefined);
    expect(checks.every((c) => c.status === "ok")).toBe(true);
    expect(checks[0]?.detail).toMatch(/^cgroup v2 at .*bothy-<tag>\/<id>/);
  });

  it("fails without a controller, with the fix, and only warns when the operator opted out", () => {
    const layout = v2("memory pids\n");
    const failing = cgroupChecks(layout, undefined);
    expect(failing.map((c) => c.status)).toEqual(["fail", "fail"]);
    expect(failing[0]?.detail).toMatch(/without cpu: the server refuses to start sandboxes/);
    expect(failing[0]?.fix).toMatch(/systemd\.unified_cgroup_hierarchy=1.*BOTHY_HOST_LIMITS=off/);
    const optedOut = cgroupChecks(layout, "off");
    expect(optedOut.map((c) => c.status)).toEqual(["warn", "warn"]);
    expect(optedOut[0]?.detail).toMatch(/WITHOUT CPU, memory and process limits/);
  });
});
