import { BothyError } from "@bothy/protocol";
import type { AgentClient } from "../agent/agent-client.ts";
import { Wakeup } from "../util/wakeup.ts";

/** A change under a watched directory, named relative to it as envd names it. */
export interface DirChange {
  name: string;
  op: "create" | "write" | "remove";
}

/**
 * The watcher that runs in the guest, on the guest's own Node (18 in Debian templates, whose
 * fs.watch has no recursive mode on Linux: each directory gets its own watcher). inotify's
 * "rename" covers create, delete and both ends of a move, so the entry is looked up to tell them
 * apart; "change" is a write or an attribute change (so CHMOD is reported as WRITE). One JSON line per change, after a first
 * `{"ready":true}` once every watcher is in place.
 */
const WATCHER = `
const fs = require("fs"), path = require("path");
const [root, recursive] = [process.argv[1], process.argv[2] === "1"];
// bothy's agent writes a file as ".NAME.bothy-HEX" and renames it onto NAME: that reads as a
// write of NAME (and its creation if NAME was new), as envd reports a write in place.
const TEMP = /^\\.(.+)\\.bothy-[0-9a-f]+$/;
const watchers = new Map(), known = new Set(), written = new Set();
const out = (o) => process.stdout.write(JSON.stringify(o) + "\\n");
function unwatch(dir) {
  for (const [d, w] of watchers) if (d === dir || d.startsWith(dir + "/")) { w.close(); watchers.delete(d); }
}
function watch(dir) {
  if (watchers.has(dir)) return;
  let w;
  try { w = fs.watch(dir, (type, name) => name != null && changed(dir, type, String(name))); } catch { return; }
  w.on("error", () => unwatch(dir));
  watchers.set(dir, w);
  let entries = [];
  try { entries = fs.readdirSync(dir, { withFileTypes: true }); } catch {}
  for (const e of entries) {
    known.add(path.join(dir, e.name));
    if (recursive && e.isDirectory()) watch(path.join(dir, e.name));
  }
}
function changed(dir, type, name) {
  const full = path.join(dir, name);
  const rel = path.relative(root, full);
  const temp = TEMP.exec(name);
  let st;
  try { st = fs.lstatSync(full); } catch {}
  if (temp) { if (type === "rename" && !st) written.add(path.join(dir, temp[1])); return; }
  if (type === "change") return out({ name: rel, op: "write" });
  if (!st) { known.delete(full); unwatch(full); return out({ name: rel, op: "remove" }); }
  const wrote = written.delete(full);
  if (!wrote || !known.has(full)) out({ name: rel, op: "create" });
  if (wrote) out({ name: rel, op: "write" });
  known.add(full);
  if (recursive && st.isDirectory()) watch(full);
}
watch(root);
if (watchers.size === 0) { process.stderr.write("cannot watch " + root + "\\n"); process.exit(2); }
out({ ready: true });
`;

function shellQuote(arg: string): string {
  return `'${arg.replace(/'/g, `'\\''`)}'`;
}

/**
 * Watches a guest directory until `signal` aborts: yields "ready" once the watch is in place,
 * then each change, and "keepalive" after `keepaliveMs` without one. The watcher is killed when
 * the caller stops reading.
 */
export async function* watchGuestDir(
  agent: AgentClient,
  dir: string,
  recursive: boolean,
  signal: AbortSignal,
  keepaliveMs: number | undefined,
): AsyncGenerator<DirChange | "ready" | "keepalive"> {
  const queue: (DirChange | "ready")[] = [];
  let ended: { error?: BothyError } | undefined;
  const wakeup = new Wakeup();
  let partial = "";
  let stderr = "";
  const handle = agent.exec(
    { cmd: `exec /usr/bin/node -e ${shellQuote(WATCHER)} ${shellQuote(dir)} ${recursive ? "1" : "0"}`, cwd: "/" },
    {
      onStarted: () => undefined,
      onOutput: (fd, data, consumed) => {
        consumed();
        if (fd === 2) {
          stderr = (stderr + data.toString("utf8")).slice(-1000);
          return;
        }
        const lines = (partial + data.toString("utf8")).split("\n");
        partial = lines.pop() ?? "";
        for (const line of lines) {
          const msg = JSON.parse(line) as { ready?: true } & Partial<DirChange>;
          queue.push(msg.ready ? "ready" : { name: msg.name ?? "", op: msg.op ?? "write" });
        }
        wakeup.wake();
      },
      onExited: (code) => {
        ended =
          code === 0 || signal.aborted
            ? {}
            : { error: new BothyError("file_error", `The directory watch ended: ${stderr.trim() || `exit ${code}`}`) };
        wakeup.wake();
      },
      onError: (err) => {
        ended = { error: err };
        wakeup.wake();
      },
    },
  );
  const onAbort = (): void => wakeup.wake();
  signal.addEventListener("abort", onAbort);
  try {
    for (;;) {
      const item = queue.shift();
      if (item !== undefined) {
        yield item;
        continue;
      }
      if (signal.aborted) return;
      if (ended) {
        if (ended.error) throw ended.error;
        return;
      }
      if (await wakeup.wait(keepaliveMs)) yield "keepalive";
    }
  } finally {
    signal.removeEventListener("abort", onAbort);
    if (!ended) handle.signal("SIGKILL");
  }
}
