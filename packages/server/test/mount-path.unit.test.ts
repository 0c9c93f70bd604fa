import { describe, expect, it } from "vitest";
import { checkMounts } from "../src/volumes/mount-path.ts";

const one =
  (path: string): (() => void) =>
  () =>
    checkMounts([{ name: "v", path }]);

describe("volume mount paths", () => {
  it("takes absolute, normal paths of the sandbox's own", () => {
    for (const path of ["/data", "/mnt/cache", "/workspace/repo", "/opt/tools", "/etc/myapp", "/runner"])
      expect(one(path), path).not.toThrow();
    expect(() =>
      checkMounts([
        { name: "a", path: "/data" },
        { name: "b", path: "/data2", read_only: true },
      ]),
    ).not.toThrow();
  });

  it("refuses what would cover or sit inside the guest's own directories", () => {
    for (const path of [
      "/",
      "/proc",
      "/proc/self",
      "/sys/fs",
      "/dev",
      "/dev/shm",
      "/run",
      "/run/bothy",
      "/opt",
      "/opt/bothy",
      "/opt/bothy/node",
      "/etc",
      "/etc/resolv.conf",
      "/etc/ld.so.preload",
    ])
      expect(one(path), path).toThrow(expect.objectContaining({ code: "invalid_volume_mount" }));
  });

  it("refuses relative, unnormal and odd paths", () => {
    for (const path of ["data", "./data", "/data/", "//data", "/data/../proc", "/a/./b", "/data\nx", "/a\0b"])
      expect(one(path), JSON.stringify(path)).toThrow(expect.objectContaining({ code: "invalid_volume_mount" }));
  });

  it("refuses one volume twice and mounts inside one another", () => {
    const twice = [
      { name: "v", path: "/a" },
      { name: "v", path: "/b" },
    ];
    expect(() => checkMounts(twice)).toThrow(expect.objectContaining({ code: "invalid_volume_mount" }));
    for (const [p, q] of [
      ["/a", "/a"],
      ["/a", "/a/b"],
      ["/a/b", "/a"],
    ] as const)
      expect(() =>
        checkMounts([
          { name: "v", path: p },
          { name: "w", path: q },
        ]),
      ).toThrow(expect.objectContaining({ code: "invalid_volume_mount" }));
  });
});
