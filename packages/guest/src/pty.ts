import { spawn } from "node:child_process";
import { readdirSync, readFileSync, readlinkSync } from "node:fs";
import type { SignalName } from "@bothy/protocol";
import type { Spawner } from "./spawner.ts";

/**
 * PTY mode without a native module: util-linux's `script` (in every Debian, bsdutils is
 * essential) opens a pseudo-terminal, runs the command in a new session on it, and relays bytes
 * between the pty and its own stdin/stdout pipes, which the agent already knows how to stream.
 */
export const SCRIPT_PATH = "/usr/bin/script";
/** coreutils (essential in Debian); by path, since the spawner helper does not search PATH. */
const STTY_PATH = "/bin/stty";

export interface PtySize {
  cols: number;
  rows: number;
}

/** `script` arguments; the command travels in the environment, so no quoting can go wrong. */
export function ptyArgs(size: PtySize): string[] {
  const inner = `stty cols ${size.cols} rows ${size.rows} 2>/dev/null; exec /bin/sh -c "$BOTHY_PTY_CMD"`;
  return ["-q", "-f", "-e", "-c", inner, "/dev/null"];
}

interface ProcStat {
  pid: number;
  ppid: number;
  session: number;
  /** The foreground process group of the process's terminal. */
  tpgid: number;
}

/**
 * The guest's processes (as many as its process limit allows at most), read synchronously: an
 * asynchronous read would start libuv's thread pool, dear under gVisor's ptrace, at the first
 * terminal's start.
 */
function procStats(): ProcStat[] {
  const out: ProcStat[] = [];
  for (const name of readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    let text = "";
    try {
      text = readFileSync(`/proc/${name}/stat`, "utf8");
    } catch {
      continue; // ended while we looked
    }
    // Fields after the command name, which may itself hold spaces and parentheses.
    const fields = text.slice(text.lastIndexOf(")") + 2).split(" ");
    if (fields.length < 6) continue;
    out.push({ pid: Number(name), ppid: Number(fields[1]), session: Number(fields[3]), tpgid: Number(fields[5]) });
  }
  return out;
}

/** Sets the terminal size; the kernel then sends SIGWINCH to the foreground process group. */
export async function resizePty(scriptPid: number, size: PtySize, spawner?: Spawner): Promise<void> {
  const leader = procStats().find((p) => p.ppid === scriptPid)?.pid;
  if (leader === undefined) return;
  let tty: string | undefined;
  try {
    tty = readlinkSync(`/proc/${leader}/fd/0`);
  } catch {
    return; // ended meanwhile
  }
  if (!tty?.startsWith("/dev/pts/")) return;
  const args = ["-F", tty, "cols", String(size.cols), "rows", String(size.rows)];
  if (spawner?.available) return spawner.runQuiet(STTY_PATH, args);
  await new Promise<void>((resolve) => {
    const stty = spawn(STTY_PATH, args, { stdio: "ignore" });
    stty.once("error", () => resolve());
    stty.once("exit", () => resolve());
  });
}

/** Signals a terminal sends to its foreground job rather than to the whole session. */
const JOB_SIGNALS: ReadonlySet<SignalName> = new Set(["SIGINT", "SIGQUIT"]);

/**
 * Signals the command `script` runs, which sits in a session of its own. SIGINT and SIGQUIT go
 * to the terminal's foreground process group, as ^C and ^\ would (without relying on the line
 * discipline: gVisor's pty does not turn ^C into a signal); the rest go to the whole session.
 * `script` then exits with the command's status.
 */
export async function signalSession(scriptPid: number, signal: SignalName): Promise<void> {
  const stats = procStats();
  const leader = stats.find((p) => p.ppid === scriptPid);
  if (!leader) return kill(scriptPid, signal);
  if (JOB_SIGNALS.has(signal) && leader.tpgid > 0) return kill(-leader.tpgid, signal);
  // Caught between `script`'s fork and the child's setsid, the child leads no session yet (and
  // has no children): it is signalled itself, or the signal would reach nobody.
  if (leader.session !== leader.pid) return kill(leader.pid, signal);
  for (const p of stats) if (p.session === leader.pid) kill(p.pid, signal);
}

function kill(pid: number, signal: SignalName): void {
  try {
    process.kill(pid, signal);
  } catch {
    // already gone
  }
}
