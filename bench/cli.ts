/**
 * bench/cli [--runs R=15]: how long a CLI command takes to start in a checkout, against `node -e 0`
 * (Node's own start). Each API command runs against an address where nothing listens (it starts,
 * parses, tries to connect, is refused, prints the error and exits), so no server's work is in the
 * figure: from the built bundle (bin/bothy.js runs it while `npm run build` is current) and from the
 * TypeScript sources (BOTHY_CLI_SOURCE=1, what every command cost before the bundle). Runs of the
 * three kinds alternate, so load changes hit them alike. Goal: every bundled command under 0.2 s
 * (`node -e 0` is ~0.09 s on a quiet host of this kind). Exits 1 when the bundle is not current (run `npm run build` first).
 */
import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { runsFromBundle } from "../packages/cli/bin/bundle-current.mjs";
import { intArg, median, parseArgs } from "./bench-util.ts";

const usage = "usage: bench/cli [--runs R=15]";
const { flags } = parseArgs(process.argv.slice(2), ["runs"], usage);
const runs = intArg(flags.get("runs"), 15, "--runs", 1, 1000, usage);
const cliDir = fileURLToPath(new URL("../packages/cli/", import.meta.url));
const bothy = fileURLToPath(new URL("../packages/cli/bin/bothy.js", import.meta.url));
// Port 1 on loopback: nothing listens, the connect is refused at once.
const env = { ...process.env, BOTHY_URL: "http://127.0.0.1:1", BOTHY_API_KEY: "bothy_" + "0".repeat(64) };

if (!runsFromBundle(cliDir, ["ls"])) {
  console.error("The CLI's bundle is not current: run `npm run build` first.");
  process.exit(1);
}

/**
 * Runs one command and returns its wall time. A CLI run must end the way a real one does (the
 * usage, or the refused connection named): a bundle that crashes at load would be fast too.
 */
function timed(args: string[], extraEnv: Record<string, string> = {}): Promise<number> {
  return new Promise((resolve, reject) => {
    const started = performance.now();
    const child = spawn(process.execPath, args, { env: { ...env, ...extraEnv }, stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    child.stdout.on("data", (c: Buffer) => (out += c.toString()));
    child.stderr.on("data", (c: Buffer) => (out += c.toString()));
    child.on("error", reject);
    child.on("close", () => {
      const ms = performance.now() - started;
      const expected = args[0] === "-e" ? /^$/ : args.at(-1) === "help" ? /^usage: bothy/ : /connection_failed/;
      if (!expected.test(out)) reject(new Error(`node ${args.join(" ")} printed:\n${out}`));
      else resolve(ms);
    });
  });
}

const commands = [
  ["ls"],
  ["info", "sbx_aaaaaaaaaaaaaaaaaaaa"],
  ["exec", "sbx_aaaaaaaaaaaaaaaaaaaa", "--", "true"],
  ["help"],
];
const node: number[] = [];
const bundled = new Map(commands.map((c) => [c.join(" "), [] as number[]]));
const source: number[] = [];
for (let i = 0; i < runs; i++) {
  node.push(await timed(["-e", "0"]));
  for (const c of commands) bundled.get(c.join(" "))?.push(await timed([bothy, ...c]));
  // The sources are slow (~1 s); a third as many runs are enough to show the difference.
  if (i % 3 === 0) source.push(await timed([bothy, "ls"], { BOTHY_CLI_SOURCE: "1" }));
}

const base = median(node);
const ms = (x: number): string => `${x.toFixed(0)} ms`;
console.log(`# cli start, ${runs} runs each (median): node -e 0 ${ms(base)}`);
let worst = 0;
for (const [name, xs] of bundled) {
  const m = median(xs);
  worst = Math.max(worst, m);
  console.log(
    `bothy ${name.padEnd(40)} bundle ${ms(m).padStart(8)}  ${(m / base).toFixed(2)}x node -e 0  (+${ms(m - base)})`,
  );
}
const s = median(source);
console.log(
  `bothy ${"ls".padEnd(40)} source ${ms(s).padStart(8)}  ${(s / base).toFixed(2)}x node -e 0  (+${ms(s - base)})`,
);
// Load slows every start alike; node -e 0 above ~90 ms here means a busy host.
console.log(
  `goal: every bundled command under 200 ms: ${worst < 200 ? "met" : "NOT met"} (slowest ${ms(worst)}, ${(worst / base).toFixed(2)}x node -e 0)`,
);
