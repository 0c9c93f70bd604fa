import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import {
  describeLayout,
  limitsProblem,
  parseCgroupLayout,
  requireHostLimits,
  sandboxCgroupDirs,
} from "../src/drivers/host-cgroups.ts";

/** Debian 12 cloud image booted with cgroup v1 (this project's development machine). */
const HYBRID = `25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`;

/** systemd's legacy layout with cpu and cpuacct co-mounted, and no cgroup2 at all. */
const LEGACY = `31 23 0:28 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,nosuid - cgroup cgroup rw,pids
`;

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

/** A pure cgroup v2 host: cgroup2 at `root`, whose cgroup.controllers lists `controllers`. */
function v2Host(controllers: string): { root: string; mountinfo: string } {
  const root = mkdtempSync(join(tmpdir(), "bothy-cgroup-"));
  dirs.push(root);
  writeFileSync(join(root, "cgroup.controllers"), `${controllers}\n`);
  return {
    root,
    mountinfo: `25 30 0:23 / /sys rw - sysfs sysfs rw\n26 25 0:24 / ${root} rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n`,
  };
}

describe("host cgroup layout", () => {
  it("finds the v1 controllers of a hybrid host, not its controller-less cgroup2", () => {
    const layout = parseCgroupLayout(HYBRID);
    expect(layout).toMatchObject({
      version: 1,
      hybrid: true,
      missing: [],
      controllers: { cpu: "/sys/fs/cgroup/cpu", memory: "/sys/fs/cgroup/memory", pids: "/sys/fs/cgroup/pids" },
    });
    expect(limitsProblem(layout)).toBeUndefined();
    expect(describeLayout(layout)).toBe("cgroup v1 (hybrid) with cpu, memory, pids");
    // runsc makes a sandbox's cgroup in every hierarchy it knows: all of them are the sandbox's.
    expect(sandboxCgroupDirs(layout, "k3x9", "sb_x")).toContain("/sys/fs/cgroup/cpuacct/bothy-k3x9/sb_x");
    expect(sandboxCgroupDirs(layout, "k3x9", "sb_x")).toContain("/sys/fs/cgroup/pids/bothy-k3x9/sb_x");
  });

  it("finds co-mounted v1 controllers on a legacy host", () => {
    const layout = parseCgroupLayout(LEGACY);
    expect(layout).toMatchObject({ version: 1, hybrid: false, missing: [] });
    expect(layout.version === 1 && layout.controllers.cpu).toBe("/sys/fs/cgroup/cpu,cpuacct");
  });

  it("takes a pure v2 host's controllers from its root's cgroup.controllers", () => {
    const host = v2Host("cpuset cpu io memory hugetlb pids rdma misc");
    const layout = parseCgroupLayout(host.mountinfo, host.root);
    expect(layout).toEqual({ version: 2, root: host.root, missing: [] });
    expect(sandboxCgroupDirs(layout, "k3x9", "sb_x")).toEqual([join(host.root, "bothy-k3x9", "sb_x")]);
    expect(() => requireHostLimits(layout, "required")).not.toThrow();
  });

  it("refuses a host without a controller, saying how to fix it, unless the operator opts out", () => {
    const host = v2Host("cpuset io memory pids");
    const layout = parseCgroupLayout(host.mountinfo, host.root);
    expect(layout.missing).toEqual(["cpu"]);
    expect(() => requireHostLimits(layout, "required")).toThrow(
      expect.objectContaining({
        name: "NotSupportedError",
        message: expect.stringMatching(/without cpu \(cgroup controllers\).*BOTHY_HOST_LIMITS=off/),
      }),
    );
    expect(() => requireHostLimits(layout, "off")).not.toThrow();
  });

  it("reports a host with no cgroups mounted at all as missing every controller", () => {
    const layout = parseCgroupLayout("25 30 0:23 / /sys rw - sysfs sysfs rw\n");
    expect(layout).toMatchObject({ version: 1, hierarchies: [], missing: ["cpu", "memory", "pids"] });
    expect(limitsProblem(layout)).toMatch(
      /^This host has no cgroup hierarchies without cpu, memory, pids \(cgroup controllers\)/,
    );
  });
});
