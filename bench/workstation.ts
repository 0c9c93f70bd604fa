/**
 * bench/workstation: what a sandbox of the `workstation` template (fullstack + desktop) costs on
 * gVisor, idle, at each stage of issue 18's end-to-end flow, against a seed sandbox of the same
 * size: just created; with PostgreSQL and Redis started; with the desktop (Xvfb, openbox, x11vnc,
 * Chromium on about:blank) started too. Each figure is the sandbox's memory cgroup on the host
 * and `free`'s used memory inside, read after the sandbox sat idle for a while; plus the size of
 * the template's tree. Prints figures; no pass/fail. Needs the template built
 * (`bothy template build workstation`, or a test run, into the tests' template cache).
 */
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { Sandbox } from "@bothy/sdk";
import { TemplateStore } from "../packages/server/src/index.ts";
import { startTestServer, type TestServer } from "../packages/server/test/helpers/test-server.ts";
import { testTemplatesDir } from "../test/paths.ts";
import { cgroupMemory, freeUsedMib, header, repoRoot, stopAndInspect } from "./bench-util.ts";

const IDLE_MS = 15_000;
const pexec = promisify(execFile);
const mib = (b: number | undefined): string => (b === undefined ? "?" : `${(b / 1024 / 1024).toFixed(0)} MiB`);

console.log(await header());
const store = new TemplateStore({ sourceDir: `${repoRoot}templates`, storeDir: testTemplatesDir() });
const built = await store.resolve("workstation");
if (!built) {
  console.error(`workstation is not built in ${store.storeDir}: run a test that needs it, or build it`);
  process.exit(1);
}
const { stdout: du } = await pexec("du", ["-sm", built.rootfs]);
console.log(`template tree: ${du.split("\t")[0]} MB (${built.rootfs})`);

let ts: TestServer | undefined;
try {
  ts = await startTestServer({ BOTHY_DRIVER: "gvisor", BOTHY_POOL_SIZE: "0" });
  const shape = { baseUrl: ts.url, vcpu: 2, memoryMib: 1536 };
  const base = await Sandbox.create({ ...shape, template: "seed" });
  const box = await Sandbox.create({ ...shape, template: "workstation" });
  const report = async (stage: string): Promise<void> => {
    await new Promise((r) => setTimeout(r, IDLE_MS));
    const [host, baseHost] = [await cgroupMemory(box.sandboxId), await cgroupMemory(base.sandboxId)];
    const [free, baseFree] = [await freeUsedMib(box), await freeUsedMib(base)];
    console.log(
      `${stage}: host memory cgroup ${mib(host)} (seed ${mib(baseHost)}), \`free\` used inside ${free} MiB (seed ${baseFree} MiB)`,
    );
  };
  await report("created, idle");
  await box.commands.run("bothy-service start postgres && bothy-service start redis");
  await report("PostgreSQL and Redis started, idle");
  const t = performance.now();
  await box.desktop.start();
  console.log(`desktop start: ${((performance.now() - t) / 1000).toFixed(1)} s`);
  await report("and the desktop started, idle");
  await box.kill();
  await base.kill();
} finally {
  if (ts) {
    const { leaks } = await stopAndInspect(ts, "workstation");
    console.log(leaks.length === 0 ? "leaks: none" : `leaks:\n  ${leaks.join("\n  ")}`);
  }
}
