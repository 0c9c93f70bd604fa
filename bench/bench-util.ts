/**
 * Shared pieces of the benchmark scripts: statistics, the host header, the seed template, one
 * timed create → exec → delete through the API, and the host checks after a server stops.
 */
// The benchmarks' servers and clients share one admin key, as the tests' do.
import "../test/auth-setup.ts";
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { copyFile, readdir, readFile, rm } from "node:fs/promises";
import { cpus, loadavg } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import Database from "better-sqlite3";
import { TemplateStore, type BuiltTemplate } from "../packages/server/src/index.ts";
import { homeCgroupDirs, hostCgroupLayout, sandboxCgroupDirs } from "../packages/server/src/drivers/host-cgroups.ts";
import { hostTag } from "../packages/server/src/util/host-names.ts";
import { api, createSandbox, runCommand } from "../packages/server/test/helpers/client.ts";
import { hostLeaks, type HostLeaks } from "../packages/server/test/helpers/host-state.ts";
import type { TestServer } from "../packages/server/test/helpers/test-server.ts";
import type { Sandbox } from "@bothy/sdk";
import { testTemplatesDir } from "../test/paths.ts";

const pexec = promisify(execFile);

export const repoRoot = fileURLToPath(new URL("../", import.meta.url));

/** The runsc the server under test runs (BOTHY_RUNSC), and its platform (BOTHY_RUNSC_PLATFORM). */
export const RUNSC = process.env["BOTHY_RUNSC"] || "runsc";
export const RUNSC_PLATFORM = process.env["BOTHY_RUNSC_PLATFORM"] || "ptrace";

/** No step of one run should take this long; a hung step must not hang the benchmark. */
const STEP_TIMEOUT_MS = 60_000;

export function median(xs: readonly number[]): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  const mid = Math.floor(s.length / 2);
  return s.length % 2 === 1 ? (s[mid] ?? NaN) : ((s[mid - 1] ?? NaN) + (s[mid] ?? NaN)) / 2;
}

/** The q-quantile (0..1) by nearest rank. */
export function quantile(xs: readonly number[], q: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))] ?? NaN;
}

export function mean(xs: readonly number[]): number {
  return xs.length === 0 ? NaN : xs.reduce((a, b) => a + b, 0) / xs.length;
}

/** Milliseconds as seconds with three decimals. */
export function secs(ms: number): string {
  return `${(ms / 1000).toFixed(3)} s`;
}

export function summary(xs: readonly number[]): string {
  return `median ${secs(median(xs))}, mean ${secs(mean(xs))}, min ${secs(Math.min(...xs))}, max ${secs(Math.max(...xs))} (n=${xs.length})`;
}

/** One line saying where and when the figures were taken: they move with load. */
export async function header(): Promise<string> {
  const version = await pexec(RUNSC, ["--version"]).then(
    (r) => r.stdout.split("\n")[0]?.trim() ?? "?",
    (err: unknown) => `unavailable (${(err as Error).message})`,
  );
  const load = loadavg()
    .map((l) => l.toFixed(2))
    .join(" ");
  return `# ${new Date().toISOString()}  nproc=${cpus().length}  load=${load}  ${version} (${RUNSC}, platform ${RUNSC_PLATFORM})`;
}

/** The built seed template in the shared test cache; builds it (minutes) when missing. */
export async function seedTemplate(): Promise<BuiltTemplate> {
  const store = new TemplateStore({ sourceDir: `${repoRoot}templates`, storeDir: testTemplatesDir() });
  const built = await store.resolve("seed");
  if (built) return built;
  console.log(`seed template not built in ${store.storeDir}: building it (takes minutes)`);
  return store.build("seed", {
    onProgress: (ev) => ev.line === undefined && console.log(`  build ${ev.step}/${ev.steps} ${ev.title}`),
  });
}

export function withTimeout<T>(p: Promise<T>, what: string, ms = STEP_TIMEOUT_MS): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} took longer than ${ms / 1000} s`)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}

/** ms from `t0` until `echo ok` in sandbox `id` printed its first byte. */
export async function firstOutputMs(wsUrl: string, id: string, t0: number): Promise<number> {
  let first = NaN;
  await withTimeout(
    runCommand(
      wsUrl,
      id,
      { cmd: "echo ok" },
      {
        keepEvents: false,
        onEvent: (ev) => void (ev.type === "stdout" && Number.isNaN(first) && (first = performance.now())),
      },
    ),
    `echo in ${id}`,
  );
  return first - t0;
}

export interface RunTimes {
  id: string;
  create: number;
  /** From the create request to the command's first byte of output reaching the client. */
  firstOutput: number;
  exec: number;
  delete: number;
  /** A GET of the sandbox right after its delete: the HTTP round trip, the floor under delete. */
  get: number;
  total: number;
}

/**
 * create → `echo ok` → delete through the API, each phase timed. Throws when the command does not
 * print exactly "ok\n" with exit 0; the sandbox is deleted on failure too, so a failed run leaves
 * nothing behind that a later leak check would blame on the server.
 */
export async function timedRun(url: string, wsUrl: string): Promise<RunTimes> {
  const t0 = performance.now();
  const id = await withTimeout(createSandbox(url), "create");
  const t1 = performance.now();
  let t2 = t1;
  let first = NaN;
  let deleteTried = false;
  try {
    const res = await withTimeout(
      runCommand(
        wsUrl,
        id,
        { cmd: "echo ok" },
        {
          keepEvents: false,
          onEvent: (ev) => void (ev.type === "stdout" && Number.isNaN(first) && (first = performance.now())),
        },
      ),
      `exec in ${id}`,
    );
    t2 = performance.now();
    if (res.stdout !== "ok\n" || res.exit?.exit_code !== 0) {
      throw new Error(
        `${id}: echo ok gave stdout ${JSON.stringify(res.stdout)}, stderr ${JSON.stringify(res.stderr.slice(0, 200))}, exit ${JSON.stringify(res.exit ?? res.error)}`,
      );
    }
    const del = await withTimeout(api(url, "DELETE", `/sandboxes/${id}`), `delete ${id}`);
    deleteTried = true;
    // DELETE answers once the sandbox is unreachable; the host finishes in the background.
    if (del.status !== 200 || !["deleting", "deleted"].includes(String(del.json["state"])))
      throw new Error(`${id}: delete gave ${del.status} ${JSON.stringify(del.json)}`);
  } finally {
    if (!deleteTried) await api(url, "DELETE", `/sandboxes/${id}`).catch(() => undefined);
  }
  const t3 = performance.now();
  await withTimeout(api(url, "GET", `/sandboxes/${id}`), `get ${id}`);
  const get = performance.now() - t3;
  return { id, create: t1 - t0, firstOutput: first - t0, exec: t2 - t1, delete: t3 - t2, get, total: t3 - t0 };
}

/**
 * Stops a server started by startTestServer and inspects the host the way its stop() does (the
 * ledger before the home goes), plus global checks. Then removes the home; whatever it had left
 * is cleaned up here so the benchmark itself leaves nothing, and the server log is kept when
 * something was wrong.
 */
export async function stopAndInspect(
  ts: TestServer,
  keepLogAs: string,
  keepLog = false,
): Promise<{ leaks: string[]; creates: Creates; log?: string }> {
  // A close that fails must not skip the inspection: what it left is what we are looking for.
  const closeError = await ts.server.close().then(
    () => undefined,
    (err: unknown) => `server close failed: ${(err as Error).message}`,
  );
  const perRoot = await hostLeaks(ts.home);
  const leaks = [...(closeError === undefined ? [] : [closeError]), ...leakLines(perRoot)];
  const seen = new Set([...perRoot.runscProcesses, ...perRoot.qemuProcesses, ...perRoot.mounts]);
  leaks.push(...(await globalLeaks(ts.home, ledgerIds(join(ts.home, "ledger.sqlite")), seen)));
  const creates = await createsFromLog(ts.logPath);
  let log: string | undefined;
  if (leaks.length > 0 || keepLog) {
    log = `/tmp/${keepLogAs}-${Date.now()}.log`;
    await copyFile(ts.logPath, log).catch(() => (log = undefined));
  }
  await removeHome(ts.home, leaks);
  return { leaks, creates, log };
}

/** The helper's per-root findings as lines, labelled by kind. */
function leakLines(leaks: HostLeaks): string[] {
  return Object.entries(leaks).flatMap(([kind, items]: [string, string[]]) => items.map((i) => `${kind}: ${i.trim()}`));
}

function ledgerIds(path: string): string[] {
  try {
    const db = new Database(path, { readonly: true, fileMustExist: true });
    const rows = db.prepare("SELECT id FROM sandboxes").all() as Array<{ id: string }>;
    db.close();
    return rows.map((r) => r.id);
  } catch {
    return []; // no ledger: hostLeaks reports the same absence
  }
}

/**
 * Beyond the helper's per-root checks: any runsc process (runsc, runsc-gofer, runsc-sandbox) or
 * QEMU whose arguments mention the home, any mount line (target or overlay options) under it, and
 * any cgroup runsc made for one of its sandboxes (`bothy-<tag>/<id>`), or the home's parent of them.
 */
async function globalLeaks(home: string, ids: readonly string[], alreadyReported: Set<string>): Promise<string[]> {
  const fresh = (l: string): boolean => l.includes(home) && !alreadyReported.has(l);
  const { stdout } = await pexec("ps", ["-eo", "pid=,args="]);
  const procs = stdout
    .split("\n")
    .filter((l) => /runsc|qemu-system/.test(l) && fresh(l))
    .map((l) => `global process: ${l.trim()}`);
  const mounts = (await readFile("/proc/mounts", "utf8"))
    .split("\n")
    .filter(fresh)
    .map((l) => `global mount: ${l}`);
  const layout = await hostCgroupLayout();
  const cgroups = [
    ...ids.flatMap((id) => sandboxCgroupDirs(layout, hostTag(home), id)),
    ...homeCgroupDirs(layout, hostTag(home)),
  ].filter((d) => existsSync(d));
  return [...procs, ...mounts, ...cgroups.map((d) => `global cgroup: ${d}`)];
}

/** Removes the home after the inspection; a leftover mount or container is removed first. */
async function removeHome(home: string, leaks: string[]): Promise<void> {
  const root = join(home, "runsc");
  const { stdout } = await pexec(RUNSC, ["--root", root, "list", "-quiet"]).catch(() => ({ stdout: "" }));
  for (const id of stdout.split("\n").filter(Boolean)) {
    await pexec(RUNSC, ["--root", root, "delete", "--force", id]).catch((err: unknown) =>
      leaks.push(`bench cleanup: runsc delete ${id}: ${(err as Error).message}`),
    );
  }
  const targets = (await readFile("/proc/mounts", "utf8"))
    .split("\n")
    .map((l) => l.split(" ")[1] ?? "")
    .filter((t) => t.startsWith(`${home}/`));
  for (const t of targets.reverse())
    await pexec("umount", ["-l", t]).catch((err: unknown) =>
      leaks.push(`bench cleanup: umount ${t}: ${(err as Error).message}`),
    );
  await rm(home, { recursive: true, force: true }).catch((err: unknown) =>
    leaks.push(`bench cleanup: rm ${home}: ${(err as Error).message}`),
  );
}

export interface Creates {
  /** Ids whose create took a booted sandbox from the pool. */
  warm: Set<string>;
  total: number;
  /** "warm/total", or why the log could not be read. */
  text: string;
}

/** Which creates took a pool sandbox, from the server's own `sandbox_created` events. */
async function createsFromLog(logPath: string): Promise<Creates> {
  try {
    const events = (await readFile(logPath, "utf8")).split("\n").filter((l) => l.includes('"event":"sandbox_created"'));
    const parsed = events.map((l) => JSON.parse(l) as { sandbox_id?: string; warm?: boolean });
    const warm = new Set(parsed.filter((e) => e.warm === true).map((e) => e.sandbox_id ?? ""));
    return { warm, total: parsed.length, text: `${warm.size}/${parsed.length}` };
  } catch (err) {
    return { warm: new Set(), total: 0, text: `unknown (${(err as Error).message})` };
  }
}

/**
 * Ctrl-C (or SIGTERM) aborts the returned signal so the scripts' finally blocks clean up; a
 * second one exits at once for a cleanup that hangs.
 */
export function interruptSignal(): AbortSignal {
  const ac = new AbortController();
  const onSignal = (sig: NodeJS.Signals): void => {
    if (ac.signal.aborted) {
      console.error(`\n${sig} again: exiting without finishing cleanup`);
      process.exit(130);
    }
    console.error(`\n${sig}: stopping after the current step and cleaning up (again to force)`);
    ac.abort(new Error(`interrupted by ${sig}`));
  };
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);
  return ac.signal;
}

/** Reads `--name value` from argv; the rest stay positional. A bad option prints the usage and exits 2. */
export function parseArgs(
  argv: readonly string[],
  names: readonly string[],
  usage: string,
): { flags: Map<string, string>; positional: string[] } {
  const flags = new Map<string, string>();
  const positional: string[] = [];
  const fail = (why: string): never => {
    console.error(`${why}\n${usage}`);
    process.exit(2);
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] ?? "";
    const name = a.replace(/^--/, "").split("=")[0] ?? "";
    if (a === "-h" || a === "--help") fail("");
    if (a.startsWith("--") && names.includes(name)) {
      const value = a.includes("=") ? a.slice(a.indexOf("=") + 1) : argv[++i];
      flags.set(name, value ?? fail(`--${name} needs a value`));
    } else if (a.startsWith("-")) {
      fail(`unknown option ${a}`);
    } else positional.push(a);
  }
  return { flags, positional };
}

/** An integer option within bounds; anything else prints the usage and exits 2. */
export function intArg(
  text: string | undefined,
  def: number,
  what: string,
  min: number,
  max: number,
  usage: string,
): number {
  if (text === undefined) return def;
  const n = Number(text);
  if (Number.isInteger(n) && n >= min && n <= max) return n;
  console.error(`${what} must be an integer from ${min} to ${max}, got ${JSON.stringify(text)}\n${usage}`);
  process.exit(2);
}

/** The memory cgroup (v1 or v2) runsc made for a sandbox, found by its id. */
export async function cgroupMemory(id: string): Promise<number | undefined> {
  for (const root of ["/sys/fs/cgroup/memory", "/sys/fs/cgroup"]) {
    const walk = async (dir: string, depth: number): Promise<string | undefined> => {
      if (depth > 3) return undefined;
      const entries = await readdir(dir, { withFileTypes: true }).catch(() => []);
      for (const e of entries) {
        if (!e.isDirectory()) continue;
        if (e.name === id) return `${dir}/${e.name}`;
        const found = await walk(`${dir}/${e.name}`, depth + 1);
        if (found) return found;
      }
      return undefined;
    };
    const dir = await walk(root, 0);
    if (!dir) continue;
    for (const file of ["memory.usage_in_bytes", "memory.current"]) {
      const text = await readFile(`${dir}/${file}`, "utf8").catch(() => undefined);
      if (text) return Number(text.trim());
    }
  }
  return undefined;
}

/** `free`'s used MiB inside a sandbox. */
export async function freeUsedMib(sandbox: Sandbox): Promise<number> {
  const r = await sandbox.commands.run("free -m | awk '/^Mem:/ {print $3}'");
  return Number(r.stdout.trim());
}
