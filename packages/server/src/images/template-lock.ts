/**
 * A lock file that serializes template builds across processes. Created with O_EXCL and holding
 * the owner's pid and start time; a lock whose owner is gone (or whose pid now belongs to another
 * process) is stale and broken.
 */
import { randomBytes } from "node:crypto";
import { link, readFile, rename, unlink, writeFile } from "node:fs/promises";
import { setTimeout as sleep } from "node:timers/promises";

interface LockOwner {
  pid: number;
  /** Start time in clock ticks since boot (/proc/PID/stat field 22): tells a reused pid apart. */
  start: string;
}

const POLL_MS = 500;

async function processStart(pid: number): Promise<string | undefined> {
  let stat: string;
  try {
    stat = await readFile(`/proc/${pid}/stat`, "utf8");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw err;
  }
  // The command name (field 2) may hold spaces and parentheses: count fields after the last ")".
  return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19];
}

async function readOwner(file: string): Promise<{ raw: string; owner: LockOwner | undefined } | undefined> {
  let raw: string;
  try {
    raw = await readFile(file, "utf8");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw err;
  }
  try {
    const parsed = JSON.parse(raw) as Partial<LockOwner>;
    if (typeof parsed.pid === "number" && typeof parsed.start === "string")
      return { raw, owner: { pid: parsed.pid, start: parsed.start } };
  } catch (err) {
    if (!(err instanceof SyntaxError)) throw err;
  }
  // Locks are written whole (see tryCreate), so an unparsable one is damage, not a writer at work.
  return { raw, owner: undefined };
}

async function isAlive(owner: LockOwner): Promise<boolean> {
  return (await processStart(owner.pid)) === owner.start;
}

/** Moves a stale lock away; if it changed hands meanwhile, the new owner's lock is put back. */
async function breakStale(file: string, staleRaw: string): Promise<void> {
  const aside = `${file}.stale-${process.pid}-${randomBytes(4).toString("hex")}`;
  try {
    await rename(file, aside);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return;
    throw err;
  }
  if ((await readFile(aside, "utf8")) !== staleRaw) {
    // link() fails if yet another lock appeared: then that one wins and this one is dropped.
    await link(aside, file).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== "EEXIST") throw err;
    });
  }
  await unlink(aside);
}

/**
 * Written aside and then linked: link() is atomic and fails when the lock exists, so a reader never
 * sees a lock file that is created but still empty.
 */
async function tryCreate(file: string, content: string): Promise<boolean> {
  const temp = `${file}.new-${process.pid}-${randomBytes(4).toString("hex")}`;
  await writeFile(temp, content, { flag: "wx" });
  try {
    await link(temp, file);
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
    return false;
  } finally {
    await unlink(temp);
  }
}

/**
 * Waits for and takes the lock; `onWait` is told the holder's pid once. Returns the release
 * function, which removes the file only while it is still this process's.
 */
export async function acquireLock(
  file: string,
  signal: AbortSignal,
  onWait: (holderPid: number) => void,
): Promise<() => Promise<void>> {
  const start = await processStart(process.pid);
  if (start === undefined) throw new Error("cannot read /proc/self/stat: template builds need Linux /proc");
  const mine = JSON.stringify({ pid: process.pid, start } satisfies LockOwner);
  let told = false;
  for (;;) {
    signal.throwIfAborted();
    if (await tryCreate(file, mine)) break;
    const held = await readOwner(file);
    if (held === undefined) continue;
    if (held.owner === undefined || !(await isAlive(held.owner))) {
      await breakStale(file, held.raw);
      continue;
    }
    if (!told) {
      onWait(held.owner.pid);
      told = true;
    }
    await sleep(POLL_MS, undefined, { signal }).catch((err: unknown) => {
      throw signal.aborted ? signal.reason : err;
    });
  }
  return async () => {
    const held = await readOwner(file);
    if (held?.raw === mine) await unlink(file);
  };
}
