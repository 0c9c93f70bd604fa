import { execFile } from "node:child_process";
import { readdir, readFile } from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import Database from "better-sqlite3";

const pexec = promisify(execFile);

export interface HostLeaks {
  runscProcesses: string[];
  qemuProcesses: string[];
  runscContainers: string[];
  mounts: string[];
  sandboxDirs: string[];
  liveLedgerRows: string[];
}

/** What a bothy home still holds on the host: processes, containers, mounts, dirs, live rows. */
export async function hostLeaks(home: string): Promise<HostLeaks> {
  const { stdout: ps } = await pexec("ps", ["-eo", "pid=,args="]);
  const runscProcesses = ps.split("\n").filter((l) => /runsc/.test(l) && l.includes(join(home, "runsc")));
  const qemuProcesses = ps.split("\n").filter((l) => /qemu-system/.test(l) && l.includes(`${home}/`));
  let runscContainers: string[] = [];
  try {
    const { stdout } = await pexec("runsc", ["--root", join(home, "runsc"), "list", "-quiet"]);
    runscContainers = stdout.split("\n").filter(Boolean);
  } catch {
    runscContainers = []; // no runsc root: nothing was ever started
  }
  const mounts = (await readFile("/proc/self/mounts", "utf8")).split("\n").filter((l) => l.split(" ")[1]?.startsWith(home));
  const sandboxDirs = await readdir(join(home, "sandboxes")).catch(() => [] as string[]);
  let liveLedgerRows: string[] = [];
  try {
    const db = new Database(join(home, "ledger.sqlite"), { readonly: true, fileMustExist: true });
    liveLedgerRows = (db.prepare(`SELECT id FROM sandboxes WHERE state IN ('creating','running','paused','deleting')`).all() as Array<{ id: string }>).map((r) => r.id);
    db.close();
  } catch {
    liveLedgerRows = [];
  }
  return { runscProcesses, qemuProcesses, runscContainers, mounts, sandboxDirs, liveLedgerRows };
}

export function noLeaks(): HostLeaks {
  return { runscProcesses: [], qemuProcesses: [], runscContainers: [], mounts: [], sandboxDirs: [], liveLedgerRows: [] };
}
