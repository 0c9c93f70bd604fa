import { posix } from "node:path";
import { BothyError, type VolumeMount } from "@bothy/protocol";

/**
 * Where a volume may not appear in a sandbox: the kernel's own file systems, the agent's files
 * and the server's runtime directory (a volume there would hide or replace what the guest needs).
 */
const RESERVED = ["/proc", "/sys", "/dev", "/run/bothy", "/opt/bothy", "/etc/ld.so.preload", "/etc/resolv.conf"];

function refuse(path: string, why: string): BothyError {
  return new BothyError(
    "invalid_volume_mount",
    `volumes: ${JSON.stringify(path.slice(0, 200))} ${why}; mount a volume at an absolute path of its own, such as /data.`,
  );
}

/**
 * Checks a create's volume mounts: each path absolute and normal, not `/`, not under a reserved
 * directory, not inside another mount of the same create; each volume once.
 */
export function checkMounts(mounts: readonly VolumeMount[]): void {
  const names = new Set<string>();
  const paths: string[] = [];
  for (const m of mounts) {
    const { path } = m;
    if (!path.startsWith("/")) throw refuse(path, "is not an absolute path");
    if (posix.normalize(path) !== path || path.endsWith("/"))
      throw refuse(path, "is not a normal path (no //, . or .., no trailing /)");
    if (path === "/") throw refuse(path, "is the root directory");
    if (/[\0\n]/.test(path)) throw refuse(path, "holds a NUL or newline");
    const reserved = RESERVED.find((r) => path === r || path.startsWith(`${r}/`) || r.startsWith(`${path}/`));
    if (reserved !== undefined) throw refuse(path, `would cover or sit inside ${reserved}, which the sandbox needs`);
    const nested = paths.find((p) => p === path || path.startsWith(`${p}/`) || p.startsWith(`${path}/`));
    if (nested !== undefined) throw refuse(path, `overlaps another mount of this create (${nested})`);
    if (names.has(m.name))
      throw new BothyError("invalid_volume_mount", `volumes: ${m.name} is named twice; mount each volume once.`);
    names.add(m.name);
    paths.push(path);
  }
}
