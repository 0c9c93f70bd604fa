/**
 * bench/density [N=100] [--settle S]: N idle gVisor sandboxes alive at once, and what each costs
 * the host: the PSS of every process the server's sandboxes own (the runsc processes started
 * under its home and their descendants), and MemAvailable before and after. Measured twice: right
 * after the creates, and after every sandbox has run one command and gone idle again. The figure
 * that matters is PSS per sandbox (goal, issue #31: ≤ 25 MB); a breakdown by process kind says
 * where it goes. Idle sleep and the warm pool are off, so every sandbox stays running and counts.
 */
import { readdir, readFile } from "node:fs/promises";
import { setTimeout as sleep } from "node:timers/promises";
import { startTestServer, type TestServer } from "../packages/server/test/helpers/test-server.ts";
import { createSandbox, runCommand } from "../packages/server/test/helpers/client.ts";
import { header, intArg, interruptSignal, parseArgs, seedTemplate, stopAndInspect } from "./bench-util.ts";

const GOAL_MB = 25;

const usage = "usage: bench/density [N=100] [--settle S (seconds to let the sandboxes settle, default 10)]";
const { flags, positional } = parseArgs(process.argv.slice(2), ["settle"], usage);
const count = intArg(positional[0], 100, "N", 1, 1000, usage);
const settleS = intArg(flags.get("settle"), 10, "--settle", 0, 600, usage);
const interrupted = interruptSignal();

interface Proc {
  pid: number;
  ppid: number;
  cmdline: string;
}

async function processes(): Promise<Proc[]> {
  const out: Proc[] = [];
  for (const name of await readdir("/proc")) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = await readFile(`/proc/${name}/stat`, "utf8");
      // The command name may hold spaces and parentheses: the fields after it start at the last ")".
      const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
      const cmdline = (await readFile(`/proc/${name}/cmdline`, "utf8")).replace(/\0/g, " ").trim();
      out.push({ pid: Number(name), ppid, cmdline });
    } catch {
      // The process ended while we looked.
    }
  }
  return out;
}

/** The processes of the server's sandboxes: those naming its home, and everything below them. */
async function homeProcesses(home: string): Promise<Proc[]> {
  const all = await processes();
  const children = new Map<number, Proc[]>();
  for (const p of all) children.set(p.ppid, [...(children.get(p.ppid) ?? []), p]);
  const found = new Map<number, Proc>();
  const visit = (p: Proc): void => {
    if (found.has(p.pid)) return;
    found.set(p.pid, p);
    for (const c of children.get(p.pid) ?? []) visit(c);
  };
  for (const p of all) if (p.cmdline.includes(home) && p.pid !== process.pid) visit(p);
  return [...found.values()];
}

/** Proportional set size in kB (shared pages split among their users), or 0 for a process gone. */
async function pssKb(pid: number): Promise<number> {
  try {
    const m = /^Pss:\s+(\d+) kB/m.exec(await readFile(`/proc/${pid}/smaps_rollup`, "utf8"));
    return Number(m?.[1] ?? 0);
  } catch {
    return 0;
  }
}

async function memAvailableKb(): Promise<number> {
  const m = /^MemAvailable:\s+(\d+) kB/m.exec(await readFile("/proc/meminfo", "utf8"));
  return Number(m?.[1] ?? NaN);
}

/** What kind of process this is, for the breakdown: runsc's role, or the program's name. */
function kind(p: Proc): string {
  const argv = p.cmdline.split(" ");
  const prog = (argv[0] ?? "?").split("/").pop() ?? "?";
  if (prog === "runsc-waiter") return prog;
  if (prog.startsWith("runsc")) {
    const verb = argv.find((a) => ["boot", "gofer", "run", "create", "start", "wait", "exec"].includes(a));
    return `${prog}${verb ? ` ${verb}` : ""}`;
  }
  return prog || "(stub)";
}

const mb = (kb: number): string => `${(kb / 1024).toFixed(1)} MB`;

async function measure(ts: TestServer, label: string, baseAvailKb: number): Promise<number> {
  if (settleS > 0) await sleep(settleS * 1000);
  const procs = await homeProcesses(ts.home);
  const byKind = new Map<string, { n: number; kb: number }>();
  let total = 0;
  for (const p of procs) {
    const kb = await pssKb(p.pid);
    total += kb;
    const k = kind(p);
    const e = byKind.get(k) ?? { n: 0, kb: 0 };
    byKind.set(k, { n: e.n + 1, kb: e.kb + kb });
  }
  const avail = await memAvailableKb();
  const per = total / count;
  console.log(`\n## ${label}`);
  console.log(
    `PSS per sandbox: ${mb(per)} (${(per / 1024 / GOAL_MB).toFixed(2)}x the goal of ${GOAL_MB} MB); ` +
      `${procs.length} processes, ${mb(total)} in all`,
  );
  console.log(`MemAvailable per sandbox: ${mb((baseAvailKb - avail) / count)} (${mb(baseAvailKb - avail)} in all)`);
  for (const [k, e] of [...byKind].sort((a, b) => b[1].kb - a[1].kb))
    console.log(`  ${k.padEnd(24)} ${String(e.n).padStart(5)} procs  ${mb(e.kb / count).padStart(9)} per sandbox`);
  return per;
}

console.log(await header());
const seed = await seedTemplate();
console.log(`# density: ${count} idle gVisor sandboxes, template seed ${seed.hash.slice(0, 12)}, settle ${settleS} s`);

let ts: TestServer | undefined;
const failures: string[] = [];
try {
  ts = await startTestServer({
    BOTHY_DRIVER: "gvisor",
    BOTHY_POOL_SIZE: "0",
    BOTHY_IDLE_TIMEOUT_S: "0",
    BOTHY_MAX_SANDBOXES: String(count + 1),
  });
  console.log(`# server ${ts.url}, home ${ts.home}`);
  const base = await memAvailableKb();
  const ids: string[] = [];
  for (let i = 0; i < count && !interrupted.aborted; i++) {
    ids.push(await createSandbox(ts.url, { template: "seed", vcpu: 1, memoryMib: 256 }));
    if ((i + 1) % 10 === 0) console.log(`  ${i + 1}/${count} created`);
  }
  if (!interrupted.aborted) await measure(ts, "idle, never ran a command", base);
  for (const id of ids) {
    if (interrupted.aborted) break;
    const r = await runCommand(ts.wsUrl, id, { cmd: "true" });
    if (r.exit?.exit_code !== 0) failures.push(`${id}: \`true\` did not exit 0`);
  }
  if (!interrupted.aborted) await measure(ts, "idle again after one command each", base);
} catch (err) {
  failures.push(`run: ${(err as Error).message}`);
} finally {
  if (ts) {
    const found = await stopAndInspect(ts, "bench-density", failures.length > 0);
    for (const l of found.leaks) failures.push(`leak: ${l}`);
  }
}
for (const f of failures) console.log(`failure: ${f}`);
process.exit(failures.length > 0 || interrupted.aborted ? 1 : 0);
