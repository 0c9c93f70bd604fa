// The host's waiter on a gVisor container (native/runsc-waiter.c), with shell scripts standing in
// for `runsc run --detach` (a START that returns at once and leaves processes behind) and for
// `runsc delete` (an END that records that it ran): real processes, no runsc.
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { afterEach, beforeEach, expect, it } from "vitest";

const waiter = fileURLToPath(new URL("../dist/runsc-waiter", import.meta.url));

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(path.join(tmpdir(), "bothy-runsc-waiter-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** Runs the waiter; resolves with its exit code once it ended, and what it printed on stdout. */
function runWaiter(args: string[]): Promise<{ code: number | null; stdout: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(waiter, args, { stdio: ["ignore", "pipe", "inherit"] });
    let stdout = "";
    child.stdout.on("data", (c: Buffer) => (stdout += c.toString()));
    child.once("error", reject);
    child.once("close", (code) => resolve({ code, stdout }));
  });
}

it("waits for what START left running, then runs END, and ends with the status of the process that ended badly", async () => {
  expect(existsSync(waiter), "run `npm run build` first").toBe(true);
  const gate = path.join(dir, "gate");
  const order = path.join(dir, "order");
  // START leaves an orphan (as runsc leaves the sentry) that ends with 3 once the gate exists,
  // and a second one that ends well; START itself ends at once, with 0.
  const start = [
    "sh",
    "-c",
    `(while [ ! -e "$1" ]; do sleep 0.05; done; echo orphan >> "$2"; exit 3) &
     (echo started >> "$2"; exit 0) &
     exit 0`,
    "start",
    gate,
    order,
  ];
  const end = ["sh", "-c", 'echo end >> "$1"', "end", order];
  const done = runWaiter([...start, "--", ...end]);
  // The waiter is still there while the orphan runs: END has not run.
  const deadline = Date.now() + 10_000;
  while (!(await readFile(order, "utf8").catch(() => "")).includes("started")) {
    if (Date.now() > deadline) throw new Error("START's second orphan never ran");
    await new Promise((r) => setTimeout(r, 20));
  }
  expect(await readFile(order, "utf8")).not.toContain("end");
  await writeFile(gate, "");
  const { code, stdout } = await done;
  expect(code).toBe(3);
  expect((await readFile(order, "utf8")).trim().split("\n")).toEqual(["started", "orphan", "end"]);
  // Its stdout was handed down to START only: the waiter writes nothing of its own there.
  expect(stdout).toBe("");
});

it("ends with START's status after running END when START fails", async () => {
  const order = path.join(dir, "order");
  const { code } = await runWaiter(["sh", "-c", "exit 5", "--", "sh", "-c", 'echo end >> "$1"', "end", order]);
  expect(code).toBe(5);
  expect(await readFile(order, "utf8")).toBe("end\n");
});

it("refuses a command line without START or END", async () => {
  expect((await runWaiter(["true"])).code).toBe(2);
  expect((await runWaiter(["--", "true"])).code).toBe(2);
  expect((await runWaiter(["true", "--"])).code).toBe(2);
});
