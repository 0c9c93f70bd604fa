/**
 * bench/e2b [--runs R=20] [--driver gvisor|qemu]: create → run `echo ok` → kill, through the
 * unmodified `e2b` SDK (bothy's E2B surface) and through @bothy/sdk, against the same server,
 * interleaved so load changes hit both alike. Prints medians and their ratio (goal <= 1.2), and the
 * ratio against @bothy/sdk running the login shell envd runs (`bash -l -c`); no pass/fail.
 */
import { Sandbox as E2bSandbox } from "e2b";
import { Sandbox as BothySandbox } from "@bothy/sdk";
import { startTestServer, type TestServer } from "../packages/server/test/helpers/test-server.ts";
import { header, intArg, median, parseArgs, secs, seedTemplate, stopAndInspect, withTimeout } from "./bench-util.ts";

const usage = "usage: bench/e2b [--runs R=20] [--driver gvisor|qemu]";
const { flags } = parseArgs(process.argv.slice(2), ["runs", "driver"], usage);
const runs = intArg(flags.get("runs"), 20, "--runs", 1, 1000, usage);
const driver = flags.get("driver") ?? "gvisor";

/** Milliseconds of each phase of one run. */
interface Phases {
  create: number;
  run: number;
  kill: number;
  total: number;
}

/** Times create → run → kill; `kill` runs even when the run fails. */
async function timed<S extends { sandboxId: string }>(
  create: () => Promise<S>,
  run: (sbx: S) => Promise<{ stdout: string }>,
  kill: (sbx: S) => Promise<unknown>,
): Promise<Phases> {
  const t0 = performance.now();
  const sbx = await withTimeout(create(), "create");
  const t1 = performance.now();
  let t2 = t1;
  try {
    const r = await withTimeout(run(sbx), `run in ${sbx.sandboxId}`);
    t2 = performance.now();
    if (r.stdout !== "ok\n") throw new Error(`${sbx.sandboxId}: echo ok gave ${JSON.stringify(r.stdout)}`);
  } finally {
    await kill(sbx);
  }
  const t3 = performance.now();
  return { create: t1 - t0, run: t2 - t1, kill: t3 - t2, total: t3 - t0 };
}

const viaE2b = (): Promise<Phases> =>
  timed(
    () => E2bSandbox.create("base"),
    (sbx) => sbx.commands.run("echo ok"),
    (sbx) => sbx.kill(),
  );

const viaBothy = (baseUrl: string, cmd = "echo ok"): Promise<Phases> =>
  timed(
    () => BothySandbox.create({ baseUrl }),
    (sbx) => sbx.commands.run(cmd),
    (sbx) => sbx.kill(),
  );

/** What envd runs for `commands.run("echo ok")`: a login bash. */
const LOGIN_SHELL = "exec /bin/bash -l -c 'echo ok'";

function line(name: string, xs: readonly Phases[]): string {
  const m = (k: keyof Phases): string => secs(median(xs.map((x) => x[k])));
  return `  ${name.padEnd(11)} total ${m("total")}  (create ${m("create")}, run ${m("run")}, kill ${m("kill")})`;
}

console.log(await header());
await seedTemplate();
let ts: TestServer | undefined;
let failed = false;
try {
  ts = await startTestServer({ BOTHY_DRIVER: driver, BOTHY_POOL_SIZE: "0" });
  process.env["E2B_API_URL"] = `${ts.url}/e2b`;
  process.env["E2B_SANDBOX_URL"] = `${ts.url}/e2b/envd`;
  // E2B keys are bothy keys: the admin key the test server minted.
  process.env["E2B_API_KEY"] = ts.apiKey;
  delete process.env["E2B_DOMAIN"];
  delete process.env["E2B_DEBUG"];

  // Warm both paths once (module loading, the first connection of each client).
  await viaE2b();
  await viaBothy(ts.url);
  const e2b: Phases[] = [];
  const bothy: Phases[] = [];
  const bothyLogin: Phases[] = [];
  for (let i = 0; i < runs; i++) {
    e2b.push(await viaE2b());
    bothy.push(await viaBothy(ts.url));
    bothyLogin.push(await viaBothy(ts.url, LOGIN_SHELL));
  }
  const total = (xs: readonly Phases[]): number => median(xs.map((x) => x.total));
  const ratio = total(e2b) / total(bothy);
  console.log(`create → echo ok → kill, ${runs} runs each on ${driver}, medians:`);
  console.log(line("e2b SDK", e2b));
  console.log(line("@bothy/sdk", bothy));
  // envd runs every command as `bash -l -c` (a login shell reads /etc/profile and ~/.profile,
  // which fork `id` and `mesg`), bothy's SDK as `sh -c`: the same login shell through
  // @bothy/sdk separates the cost of the E2B surface from that of the shell the e2b SDK asks for.
  console.log(line("bothy+login", bothyLogin));
  console.log(`  ratio e2b/bothy ${ratio.toFixed(2)} (goal <= 1.2)`);
  console.log(`  ratio e2b/bothy running the same login shell ${(total(e2b) / total(bothyLogin)).toFixed(2)}`);
} catch (err) {
  failed = true;
  console.error(err);
} finally {
  if (ts) {
    const { leaks, log } = await stopAndInspect(ts, "bench-e2b", failed);
    if (leaks.length > 0) {
      failed = true;
      console.error(`left behind:\n  ${leaks.join("\n  ")}`);
    }
    if (log) console.error(`server log kept at ${log}`);
  }
}
process.exit(failed ? 1 : 0);
