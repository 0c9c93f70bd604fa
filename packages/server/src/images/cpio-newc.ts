/**
 * A writer for the `newc` cpio format the kernel unpacks as an initramfs. Written here rather
 * than run through a host `cpio`: the archive is a handful of entries, and building it in memory
 * keeps the output byte-identical for identical input (mtime 0, fixed inode numbers).
 */

export type CpioEntry =
  | { type: "dir"; path: string; mode?: number }
  | { type: "file"; path: string; data: Buffer; mode?: number }
  | { type: "symlink"; path: string; target: string };

const S_IFDIR = 0o040000;
const S_IFREG = 0o100000;
const S_IFLNK = 0o120000;
const TRAILER = "TRAILER!!!";

function pad4(n: number): Buffer {
  return Buffer.alloc((4 - (n % 4)) % 4);
}

function header(ino: number, mode: number, nlink: number, size: number, nameSize: number): Buffer {
  const fields = [ino, mode, 0, 0, nlink, 0, size, 0, 0, 0, 0, nameSize, 0];
  return Buffer.from(`070701${fields.map((f) => f.toString(16).padStart(8, "0")).join("")}`, "ascii");
}

function record(ino: number, path: string, mode: number, nlink: number, data: Buffer): Buffer[] {
  const name = Buffer.from(`${path}\0`, "utf8");
  const head = header(ino, mode, nlink, data.length, name.length);
  // The name is padded so that header + name ends on a 4-byte boundary; then the data likewise.
  return [head, name, pad4(head.length + name.length), data, pad4(data.length)];
}

/** The archive of `entries`, in order: a directory must come before what it holds. */
export function cpioNewc(entries: readonly CpioEntry[]): Buffer {
  const parts: Buffer[] = [];
  entries.forEach((e, i) => {
    const path = e.path.replace(/^\/+/, "");
    if (path === "" || path.split("/").includes("..")) throw new Error(`bad initramfs path ${e.path}`);
    const ino = i + 1;
    if (e.type === "dir") parts.push(...record(ino, path, S_IFDIR | (e.mode ?? 0o755), 2, Buffer.alloc(0)));
    else if (e.type === "file") parts.push(...record(ino, path, S_IFREG | (e.mode ?? 0o644), 1, e.data));
    else parts.push(...record(ino, path, S_IFLNK | 0o777, 1, Buffer.from(e.target, "utf8")));
  });
  parts.push(...record(0, TRAILER, 0, 1, Buffer.alloc(0)));
  return Buffer.concat(parts);
}
