import { describe, expect, it } from "vitest";
import { cpioNewc } from "../src/images/cpio-newc.ts";

/** Reads a newc archive back: name, mode, data of each entry. */
function parse(buf: Buffer): Array<{ name: string; mode: number; data: string }> {
  const out: Array<{ name: string; mode: number; data: string }> = [];
  let off = 0;
  const align = (n: number): number => (n + 3) & ~3;
  for (;;) {
    expect(buf.toString("ascii", off, off + 6)).toBe("070701");
    const field = (i: number): number => parseInt(buf.toString("ascii", off + 6 + i * 8, off + 14 + i * 8), 16);
    const mode = field(1);
    const size = field(6);
    const nameSize = field(11);
    const name = buf.toString("utf8", off + 110, off + 110 + nameSize - 1);
    const dataAt = align(off + 110 + nameSize);
    if (name === "TRAILER!!!") return out;
    out.push({ name, mode, data: buf.toString("utf8", dataAt, dataAt + size) });
    off = align(dataAt + size);
  }
}

describe("cpio newc writer", () => {
  it("writes directories, files and symlinks the kernel can unpack, with 4-byte alignment", () => {
    const archive = cpioNewc([
      { type: "dir", path: "bin" },
      { type: "file", path: "/bin/busybox", data: Buffer.from("abc"), mode: 0o755 },
      { type: "symlink", path: "bin/sh", target: "busybox" },
      { type: "file", path: "init", data: Buffer.from("#!/bin/sh\n") },
    ]);
    expect(parse(archive)).toEqual([
      { name: "bin", mode: 0o040755, data: "" },
      { name: "bin/busybox", mode: 0o100755, data: "abc" },
      { name: "bin/sh", mode: 0o120777, data: "busybox" },
      { name: "init", mode: 0o100644, data: "#!/bin/sh\n" },
    ]);
    expect(archive.length % 4).toBe(0);
  });

  it("is byte-identical for identical input and refuses paths that climb out", () => {
    const entries = [{ type: "file" as const, path: "a", data: Buffer.from("x") }];
    expect(cpioNewc(entries).equals(cpioNewc(entries))).toBe(true);
    expect(() => cpioNewc([{ type: "dir", path: "../etc" }])).toThrow(/bad initramfs path/);
  });
});
