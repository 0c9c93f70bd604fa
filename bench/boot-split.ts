/**
 * bench/boot-split [--runs R=5] [--commands N=10] [--agent-flags "NODE FLAGS"]: where a gVisor sandbox's CPU per cold boot goes. Raw `runsc run`s
 * of bothy's own OCI spec (overlay root, the agent's mounts) with the container's process swapped,
 * each measured by the sandbox's cpuacct cgroup (sentry, gofer, ptrace stubs) when the container
 * is ready, and split by host process: the sentry's threads (system calls and ptrace stops it
 * serves), the stubs (the guest's own user code), the gofer. Variants, in one interleaved run:
 *
 *   echo      `/bin/sh -c 'echo ok'`: the floor of a raw `runsc run`
 *   init      bothy-init (--no-front) starting the spawner helper and `/bin/true` as its agent: the
 *             native part
 *   node      the host's Node, `-e 0`: Node's own start, no snapshot
 *   native    bothy-init, the helper, and bench/boot-probe.c in the agent's place: a native agent's
 *             floor (hello, `limits` answered with `done`, and `exec`)
 *   agent     the whole boot as the driver starts it: bothy-init's native front answers hello and
 *             `limits` (up to its `done`, what a create waits for); the agent from its snapshot and
 *             the helper start with the first command
 *   eager     the boot before the front (`bothy-init --no-front`): the agent from its snapshot and
 *             the helper at boot, the agent answering hello and `limits` itself
 *   agent+flags  the same with `--agent-flags` given to its Node
 *
 * Ready is the container's exit for the first three and the `done` frame for the others. After
 * ready, those also time `--commands` `true` round trips over the channel (exec → exited, no
 * server) against an in-sandbox `sh -c true` fork+exec, as bench/commands does, and the first of
 * them apart (behind the front it starts the agent).
 */
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { encodeFrame, FrameDecoder, PROTOCOL_GENERATION } from "../packages/protocol/src/index.ts";
import { agentSnapshot } from "../packages/server/src/drivers/agent-snapshot.ts";
import { AGENT_SNAPSHOT_SCRIPT, buildOciSpec } from "../packages/server/src/drivers/oci-spec.ts";
import { hostCgroupLayout, homeCgroupDirs } from "../packages/server/src/drivers/host-cgroups.ts";
import { loadConfig } from "../packages/server/src/index.ts";
import { run } from "../packages/server/src/util/host-command.ts";
import { cgroupPath, hostTag } from "../packages/server/src/util/host-names.ts";
import { header, intArg, median, parseArgs, RUNSC, RUNSC_PLATFORM, seedTemplate, withTimeout } from "./bench-util.ts";

const usage = 'usage: bench/boot-split [--runs R=5] [--commands N=10] [--agent-flags "NODE FLAGS"]';
const { flags } = parseArgs(process.argv.slice(2), ["runs", "commands", "agent-flags"], usage);
/** `true` round trips over the channel after each native and agent boot. */
const roundTrips = intArg(flags.get("commands"), 10, "--commands", 0, 1000, usage);
const FLOOR_LOOPS = 20;
/** The in-sandbox floor as bench/commands measures it: microseconds per `sh -c true`. */
const FLOOR_LOOP = `i=0; s=$(date +%s%N); while [ $i -lt ${FLOOR_LOOPS} ]; do sh -c true; i=$((i+1)); done; e=$(date +%s%N); echo $(( (e - s) / ${FLOOR_LOOPS} / 1000 ))`;
/** With --agent-flags, one more variant: the whole boot with these Node flags before the blob's. */
const agentFlags = flags.get("agent-flags")?.split(" ").filter(Boolean);
const runs = intArg(flags.get("runs"), 5, "--runs", 1, 1000, usage);
const RUNSC_FLAGS = [`--platform=${RUNSC_PLATFORM}`, "--network=none", "--overlay2=none"];
const CLK_TCK = 100;
const NO_SPLIT = { sentry: NaN, stubs: NaN, gofer: NaN };

type Variant = "echo" | "init" | "node" | "native" | "agent" | "eager" | "agent+flags";
const VARIANTS: Variant[] = [
  "echo",
  "init",
  "node",
  "native",
  "agent",
  "eager",
  ...(agentFlags ? ["agent+flags" as const] : []),
];
/** The variants that speak the protocol: ready at the `done` of their `limits`, then commands. */
const FRAMED = new Set<Variant>(["native", "agent", "eager", "agent+flags"]);
/** Where the probe appears in the sandbox. */
const PROBE_PATH = "/opt/boot-probe";
interface Sample {
  wallMs: number;
  /** The sandbox cgroup's CPU seconds at ready. */
  cgroup: number;
  sentry: number;
  stubs: number;
  gofer: number;
  /** The sandbox's CPU seconds from start to exit. */
  whole: number;
  /** `true` from its exec frame to its exited frame, median (the FRAMED variants). */
  trueMs?: number;
  /** The first `true` after ready, alone: behind the front it starts the agent. */
  firstMs?: number;
  /** The sandbox's CPU per `true` round trip, mean (robust to others' load, unlike the times). */
  trueCpuMs?: number | undefined;
  /** A `sh -c true` fork+exec inside the sandbox, mean of FLOOR_LOOPS. */
  floorMs?: number;
}

console.log(await header());
const config = loadConfig({ ...process.env });
const agentNode = config.gvisor.agentNode;
if (agentNode === undefined) throw new Error("BOTHY_AGENT_NODE must name the host's Node (the default, `host`)");
const seed = await seedTemplate();
const scratch = await mkdtemp("/tmp/bothy-bench-boot-");
const runscRoot = join(scratch, "runsc");
const blob = await agentSnapshot({
  node: agentNode,
  script: join(config.agentPath, "..", AGENT_SNAPSHOT_SCRIPT),
  dir: join(scratch, "blob"),
  log: () => undefined,
});
if (blob === undefined) throw new Error("the host's Node could not build the agent's snapshot");
/** V8 refuses a blob built under other flags (exit 14): the flags' variant gets a blob of its own. */
const flagsBlob = join(scratch, "flags.blob");
if (agentFlags)
  await run(
    agentNode,
    [
      ...agentFlags,
      "--snapshot-blob",
      flagsBlob,
      "--build-snapshot",
      join(config.agentPath, "..", AGENT_SNAPSHOT_SCRIPT),
    ],
    {
      env: { PATH: "/usr/sbin:/usr/bin:/sbin:/bin" },
    },
  );
const probe = join(scratch, "boot-probe");
await run("gcc", ["-static", "-O2", "-Wall", "-Werror", "-o", probe, join(import.meta.dirname, "boot-probe.c")]);
const layout = await hostCgroupLayout();
const tag = hostTag(scratch);
const cpuacct =
  layout.version === 2 ? layout.root : layout.hierarchies.find((h) => existsSync(join(h, "cpuacct.usage")));

const samples = new Map<Variant, Sample[]>(VARIANTS.map((v) => [v, []]));
try {
  for (let i = 0; i <= runs; i++)
    for (const v of VARIANTS) {
      await sleep(250);
      const s = await bootOnce(v, i);
      if (i > 0) samples.get(v)?.push(s); // the first of each pays for cold caches
    }
  report();
} finally {
  // A boot that failed or timed out may have left its sandbox running.
  const left = await run(RUNSC, ["--root", runscRoot, "list", "-quiet"]).catch(() => ({ stdout: "" }));
  for (const id of left.stdout.split("\n").filter(Boolean)) {
    console.log(`# runsc container ${id} left by a failed boot: deleting it`);
    await run(RUNSC, ["--root", runscRoot, "delete", "--force", id]).catch((err: unknown) =>
      console.log(`# LEAK: runsc delete ${id}: ${(err as Error).message}`),
    );
  }
  for (const d of homeCgroupDirs(layout, tag)) await run("rmdir", [d]).catch(() => undefined);
  await rm(scratch, { recursive: true, force: true });
}

async function bootOnce(variant: Variant, i: number): Promise<Sample> {
  const id = `boot-${variant}-${i}-${process.pid}`;
  const dir = join(scratch, id);
  const rootfs = join(dir, "rootfs");
  await Promise.all(["upper", "work", "rootfs", "bundle"].map((d) => mkdir(join(dir, d), { recursive: true })));
  await run("mount", [
    "-t",
    "overlay",
    "overlay",
    "-o",
    `lowerdir=${seed.rootfs},upperdir=${join(dir, "upper")},workdir=${join(dir, "work")}`,
    rootfs,
  ]);
  try {
    const spec = buildOciSpec({
      id,
      cgroupsPath: cgroupPath(tag, id),
      templateRoot: seed.rootfs,
      templateEnv: seed.env,
      vcpu: 1,
      memoryMib: 512,
      maxProcesses: 1024,
      dir,
      hostLimits: true,
      rootfs,
      agentPath: config.agentPath,
      agentNode,
      agentSnapshot: variant === "agent+flags" ? flagsBlob : blob,
      agentStart: "lazy",
    }) as { process: { args: string[] }; mounts: object[] };
    if (variant === "echo") spec.process.args = ["/bin/sh", "-c", "echo ok"];
    // Without the front: it would hold the channel and wait for frames instead of running `true`.
    if (variant === "init") spec.process.args = ["/opt/bothy/bothy-init", "--no-front", "/bin/true"];
    if (variant === "node") spec.process.args = ["/opt/bothy/node", "-e", "0"];
    if (variant === "eager") spec.process.args.splice(1, 0, "--no-front");
    if (variant === "agent+flags" && agentFlags) {
      const at = spec.process.args.lastIndexOf("/opt/bothy/node");
      spec.process.args.splice(at + 1, 0, ...agentFlags);
    }
    if (variant === "native") {
      spec.process.args = ["/opt/bothy/bothy-init", "--no-front", PROBE_PATH];
      spec.mounts.push({ destination: PROBE_PATH, type: "bind", source: probe, options: ["rbind", "ro"] });
    }
    await writeFile(join(dir, "bundle", "config.json"), JSON.stringify(spec));
    return await withTimeout(boot(variant, id, dir), `runsc run ${id}`);
  } finally {
    await run("umount", ["-l", rootfs]).catch(() => undefined);
    await rm(dir, { recursive: true, force: true });
  }
}

async function boot(variant: Variant, id: string, dir: string): Promise<Sample> {
  const before = await parentSeconds();
  const t0 = performance.now();
  const child = spawn(RUNSC, ["--root", runscRoot, ...RUNSC_FLAGS, "run", "--bundle", join(dir, "bundle"), id], {
    stdio: ["pipe", "pipe", "pipe"],
  });
  child.stderr.resume();
  child.stdin.on("error", () => undefined); // EPIPE after a container that ended early; its close reports it
  const cgroupDir = cpuacct === undefined ? undefined : join(cpuacct, cgroupPath(tag, id));
  return await new Promise<Sample>((resolve, reject) => {
    let sample: Sample | undefined;
    const take = async (): Promise<void> => {
      sample = await measure(cgroupDir, performance.now() - t0);
    };
    const decoder = new FrameDecoder();
    child.stdout.on("data", (chunk: Buffer) => {
      if (!FRAMED.has(variant)) return;
      for (const f of decoder.push(chunk)) {
        const h = f.header as { t: string };
        if (h.t === "hello") {
          child.stdin.write(encodeFrame({ t: "hello_ack", gen: PROTOCOL_GENERATION }));
          child.stdin.write(encodeFrame({ t: "limits", id: 1, max_processes: 1024 }));
        } else if (h.t === "done") void take().then(() => commands(child.stdin, exits), reject);
        else if (h.t === "output") output.push(f.payload);
        else if (h.t === "exited") exits.shift()?.();
      }
    });
    const exits: Array<() => void> = [];
    const output: Buffer[] = [];
    /** `true` round trips (exec → exited), then the in-sandbox fork+exec floor, then the end. */
    const commands = async (stdin: NodeJS.WritableStream, waiting: Array<() => void>): Promise<void> => {
      const exec = (id: number, cmd: string): Promise<void> =>
        new Promise((done) => {
          waiting.push(done);
          stdin.write(encodeFrame({ t: "exec", id, cmd }));
        });
      const times: number[] = [];
      const t1 = performance.now();
      if (roundTrips > 0) await exec(8, "true");
      const firstMs = performance.now() - t1;
      const cpu0 = await cgroupCpu(cgroupDir);
      for (let k = 0; k < roundTrips; k++) {
        const t = performance.now();
        await exec(10 + k, "true");
        times.push(performance.now() - t);
      }
      const cpu1 = await cgroupCpu(cgroupDir);
      output.length = 0;
      if (roundTrips > 0) await exec(9, FLOOR_LOOP);
      if (sample) {
        sample.trueMs = median(times);
        sample.firstMs = firstMs;
        sample.trueCpuMs = roundTrips > 0 ? ((cpu1 - cpu0) * 1000) / roundTrips : undefined;
        sample.floorMs = Number(Buffer.concat(output).toString().trim()) / 1000;
      }
      stdin.end();
    };
    child.once("error", reject);
    child.once("close", (code) => {
      const wallMs = performance.now() - t0;
      // The container has exited: what its cgroup spent, exit included, is in the parent's count now.
      void parentSeconds().then((after) => {
        if (!FRAMED.has(variant))
          return resolve({ ...NO_SPLIT, wallMs, cgroup: after - before, whole: after - before });
        if (sample) resolve({ ...sample, whole: after - before });
        else reject(new Error(`agent boot ${id} ended (${code}) before its limits were answered`));
      }, reject);
    });
  });
}

/** CPU seconds of each process in the sandbox's cgroup, by kind. */
async function measure(cgroupDir: string | undefined, wallMs: number): Promise<Sample> {
  const s: Sample = { wallMs, cgroup: 0, sentry: 0, stubs: 0, gofer: 0, whole: 0 };
  if (cgroupDir === undefined) return s;
  s.cgroup = await cgroupCpu(cgroupDir);
  const pids = (await readFile(join(cgroupDir, "cgroup.procs"), "utf8")).split("\n").filter(Boolean);
  for (const pid of pids) {
    const cmd = await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "");
    const cpu = await procCpu(pid);
    if (cmd.includes("gofer")) s.gofer += cpu;
    // The stubs are forked from the sentry without an exec: no command line of their own.
    else if (cmd === "") s.stubs += cpu;
    else s.sentry += cpu;
  }
  return s;
}

async function procCpu(pid: string): Promise<number> {
  const stat = await readFile(`/proc/${pid}/stat`, "utf8").catch(() => "");
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  // utime, stime: fields 14 and 15, i.e. 11 and 12 after the state.
  return (Number(f[11] ?? 0) + Number(f[12] ?? 0)) / CLK_TCK;
}

/** The home's parent cgroup: it counts every sandbox's CPU, also after a sandbox's own is gone. */
async function parentSeconds(): Promise<number> {
  const parent = cpuacct === undefined ? undefined : join(cpuacct, `bothy-${tag}`);
  if (parent === undefined || !existsSync(parent)) return 0;
  return Number(await readFile(join(parent, "cpuacct.usage"), "utf8")) / 1e9;
}

function report(): void {
  const ms = (x: number): string => (Number.isNaN(x) ? "-" : `${Math.round(x * 1000)}`);
  console.log(
    "variant  wall ms  sandbox CPU ms at ready (sentry / stubs / gofer)  to exit (with the commands)  first `true` ms; `true` ms / in-sandbox fork+exec ms",
  );
  for (const v of VARIANTS) {
    const xs = samples.get(v) ?? [];
    const m = (f: (s: Sample) => number): number => median(xs.map(f));
    console.log(
      `${v.padEnd(8)} ${Math.round(m((s) => s.wallMs))
        .toString()
        .padStart(
          7,
        )}  ${ms(m((s) => s.cgroup)).padStart(21)}  (${ms(m((s) => s.sentry))} / ${ms(m((s) => s.stubs))} / ${ms(m((s) => s.gofer))})  ${ms(m((s) => s.whole))}  ${commandFigures(xs)}`,
    );
  }
}

/** A sandbox cgroup's CPU seconds so far. */
async function cgroupCpu(cgroupDir: string | undefined): Promise<number> {
  return cgroupDir === undefined ? 0 : Number(await readFile(join(cgroupDir, "cpuacct.usage"), "utf8")) / 1e9;
}

/** The `true` round trip over the channel against the in-sandbox floor, medians of the runs. */
function commandFigures(xs: Sample[]): string {
  const t = xs.map((s) => s.trueMs).filter((x): x is number => x !== undefined);
  const f = xs.map((s) => s.floorMs).filter((x): x is number => x !== undefined && Number.isFinite(x));
  if (t.length === 0 || f.length === 0) return "-";
  const cpu = xs.map((s) => s.trueCpuMs).filter((x): x is number => x !== undefined);
  const first = xs.map((s) => s.firstMs).filter((x): x is number => x !== undefined);
  return `first ${median(first).toFixed(0)}; ${median(t).toFixed(1)} / ${median(f).toFixed(1)} = ${(median(t) / median(f)).toFixed(2)}x; CPU per \`true\` ${median(cpu).toFixed(1)} ms`;
}
