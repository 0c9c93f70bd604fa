import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { readdir, readFile, stat } from "node:fs/promises";
import { join, relative } from "node:path";
import { promisify } from "node:util";
import Database from "better-sqlite3";
import { hostCgroupLayout, sandboxCgroupDirs } from "../../src/drivers/host-cgroups.ts";
import { hostTag } from "../../src/util/host-names.ts";

const pexec = promisify(execFile);

/** The parts of a home that hold sandboxes' trees, disks and guest images (for `skip` below). */
export const SANDBOX_TREES = /^(sandboxes|runsc|qemu|initramfs|disk-blanks)\//;

/**
 * Every file of a server's home (ledger and WAL, log, secrets, sandbox directories...) under 256
 * MiB, which skips disk images, and which of them hold any of `needles`: a secret must be in none.
 * `skip` leaves out the files whose path relative to the home it matches (a running sandbox's tree).
 */
export async function homeFilesHolding(
  home: string,
  needles: string[],
  skip?: RegExp,
): Promise<{ read: string[]; hits: string[] }> {
  const read: string[] = [];
  const hits: string[] = [];
  for (const entry of await readdir(home, { withFileTypes: true, recursive: true })) {
    if (!entry.isFile()) continue;
    const path = join(entry.parentPath, entry.name);
    if (skip?.test(relative(home, path))) continue;
    // A teardown in the background may remove a file between the listing and the read.
    const size = await stat(path).then(
      (s) => s.size,
      () => undefined,
    );
    if (size === undefined || size >= 256 * 1024 * 1024) continue;
    const bytes = await readFile(path).catch(() => undefined);
    if (bytes === undefined) continue;
    read.push(path);
    if (needles.some((n) => bytes.includes(n))) hits.push(path);
  }
  return { read, hits };
}

export interface HostLeaks {
  runscProcesses: string[];
  qemuProcesses: string[];
  runscContainers: string[];
  mounts: string[];
  sandboxDirs: string[];
  liveLedgerRows: string[];
  /** Cgroup directories (`bothy/<id>` in any hierarchy) of this home's sandboxes. */
  cgroups: string[];
}

/**
 * What a bothy home still holds on the host: processes, containers, mounts, directories no paused
 * or stopped sandbox owns, and rows of sandboxes that should have a process.
 */
export async function hostLeaks(home: string): Promise<HostLeaks> {
  const { stdout: ps } = await pexec("ps", ["-eo", "pid=,args="]);
  // A `runsc list` is a query a running server (its sweeper) makes, not a sandbox.
  const runscProcesses = ps
    .split("\n")
    .filter((l) => /runsc/.test(l) && l.includes(join(home, "runsc")) && !/ list -quiet$/.test(l));
  const qemuProcesses = ps.split("\n").filter((l) => /qemu-system/.test(l) && l.includes(`${home}/`));
  let runscContainers: string[] = [];
  try {
    // The runsc the server ran with (BOTHY_RUNSC): another release's state files may not read the same.
    const { stdout } = await pexec(process.env["BOTHY_RUNSC"] || "runsc", [
      "--root",
      join(home, "runsc"),
      "list",
      "-quiet",
    ]);
    runscContainers = stdout.split("\n").filter(Boolean);
  } catch {
    runscContainers = []; // no runsc root: nothing was ever started
  }
  const mounts = (await readFile("/proc/self/mounts", "utf8"))
    .split("\n")
    .filter((l) => l.split(" ")[1]?.startsWith(home));
  let liveLedgerRows: string[] = [];
  let dormant = new Set<string>();
  let everyId: string[] = [];
  try {
    const db = new Database(join(home, "ledger.sqlite"), { readonly: true, fileMustExist: true });
    liveLedgerRows = (
      db.prepare(`SELECT id FROM sandboxes WHERE state IN ('creating','running','deleting')`).all() as Array<{
        id: string;
      }>
    ).map((r) => r.id);
    everyId = (db.prepare(`SELECT id FROM sandboxes`).all() as Array<{ id: string }>).map((r) => r.id);
    dormant = new Set(
      (db.prepare(`SELECT id FROM sandboxes WHERE state IN ('paused','stopped')`).all() as Array<{ id: string }>).map(
        (r) => r.id,
      ),
    );
    db.close();
  } catch {
    liveLedgerRows = [];
  }
  // A paused or stopped sandbox keeps its directory (its disk) by design; any other is a leak.
  const sandboxDirs = (await readdir(join(home, "sandboxes")).catch(() => [] as string[])).filter(
    (d) => !dormant.has(d),
  );
  // Stopped and paused sandboxes hold no cgroup either: only running ones have processes to limit.
  const layout = await hostCgroupLayout();
  const tag = hostTag(home);
  const cgroups = everyId.flatMap((id) => sandboxCgroupDirs(layout, tag, id)).filter((d) => existsSync(d));
  return { runscProcesses, qemuProcesses, runscContainers, mounts, sandboxDirs, liveLedgerRows, cgroups };
}

export function noLeaks(): HostLeaks {
  return {
    runscProcesses: [],
    qemuProcesses: [],
    runscContainers: [],
    mounts: [],
    sandboxDirs: [],
    liveLedgerRows: [],
    cgroups: [],
  };
}
