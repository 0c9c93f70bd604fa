/**
 * The published shape of the SDK and the CLI: `npm pack` them (with @bothy/protocol), install the
 * tarballs into a fresh directory outside the repository, and use them there from plain
 * JavaScript on Node, with no TypeScript loader and no workspace to fall back on.
 */
import { execFile } from "node:child_process";
import { mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestServer, type TestServer } from "../../server/test/helpers/test-server.ts";
import { noLeaks } from "../../server/test/helpers/host-state.ts";
import { waitDeleted } from "../../server/test/helpers/client.ts";
import { Sandbox } from "../src/index.ts";

const run = promisify(execFile);
/**
 * npm's own variables (npm_config_local_prefix and the like, set when the tests run under npm)
 * stay out of the npm calls: the install directory must stand on its own, as a user's would.
 */
const npmEnv = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^npm_/i.test(k)));
const REPO = fileURLToPath(new URL("../../..", import.meta.url));
// Packing builds the packages and installing fetches ws and zod: minutes on a busy machine.
const NPM_DEADLINE_MS = 300_000;
const NODE_DEADLINE_MS = 120_000;

/** What a user who installed the tarballs runs: written into the install directory, run with node. */
const APP = `import { Sandbox } from "@bothy/sdk";

const say = (line) => process.stdout.write(JSON.stringify(line) + "\\n");
const sandbox = await Sandbox.create({ template: "seed", vcpu: 1, memoryMib: 512, timeoutS: 600 });
say({ created: sandbox.sandboxId });
try {
  const echo = await sandbox.commands.run("echo hello from the package");
  await sandbox.files.write("note.txt", "written by the packed SDK");
  const text = await sandbox.files.read("note.txt");
  say({ exitCode: echo.exitCode, stdout: echo.stdout, text, sdk: import.meta.resolve("@bothy/sdk") });
} finally {
  await sandbox.kill();
  say({ killed: sandbox.sandboxId });
}
`;

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

describe("@bothy/sdk and @bothy/cli as packed tarballs [gvisor]", () => {
  let ts: TestServer;
  let dir: string;
  let app: string;
  let tarballs: string[] = [];
  const created: string[] = [];

  /** Node as the user has it: first on PATH, no loader, no inherited NODE_OPTIONS. */
  function userEnv(): NodeJS.ProcessEnv {
    const env: NodeJS.ProcessEnv = { ...npmEnv, BOTHY_URL: ts.url };
    env["PATH"] = `${dirname(process.execPath)}:${env["PATH"] ?? ""}`;
    delete env["NODE_OPTIONS"];
    return env;
  }

  /** Runs `file` (node, or the installed `bothy`) in the install directory; a non-zero exit is a result. */
  async function exec(file: string, args: string[]): Promise<Run> {
    try {
      const r = await run(file, args, { cwd: app, env: userEnv(), timeout: NODE_DEADLINE_MS });
      return { code: 0, ...r };
    } catch (err) {
      const e = err as { code?: unknown; stdout?: string; stderr?: string };
      if (typeof e.code !== "number") throw err;
      return { code: e.code, stdout: e.stdout ?? "", stderr: e.stderr ?? "" };
    }
  }

  const bothy = (args: string[]): Promise<Run> => exec(join(app, "node_modules/.bin/bothy"), args);

  beforeAll(async () => {
    ts = await startTestServer({ BOTHY_DRIVER: "gvisor" });
    dir = await mkdtemp(join(tmpdir(), "bothy-pack-"));
    expect(relative(REPO, dir).startsWith("..")).toBe(true);
    // prepack builds each package, so the tarballs hold what the sources say now.
    await run(
      "npm",
      ["pack", "--pack-destination", dir, "-w", "@bothy/protocol", "-w", "@bothy/sdk", "-w", "@bothy/cli"],
      { cwd: REPO, env: npmEnv, timeout: NPM_DEADLINE_MS, maxBuffer: 16 * 1024 * 1024 },
    );
    tarballs = (await readdir(dir)).filter((f) => f.endsWith(".tgz")).map((f) => join(dir, f));
    app = join(dir, "app");
    await run("mkdir", [app]);
    await run("npm", ["init", "-y"], { cwd: app, env: npmEnv, timeout: NPM_DEADLINE_MS });
    await run("npm", ["install", "--no-audit", "--no-fund", "--prefer-offline", ...tarballs], {
      cwd: app,
      env: npmEnv,
      timeout: NPM_DEADLINE_MS,
    });
    await writeFile(join(app, "app.mjs"), APP);
  });

  afterAll(async () => {
    try {
      for (const id of created) await Sandbox.kill(id, { baseUrl: ts.url });
    } finally {
      try {
        if (dir) await rm(dir, { recursive: true, force: true });
      } finally {
        expect(await ts?.stop()).toEqual(noLeaks());
      }
    }
  });

  it("packs JavaScript and declarations, not TypeScript sources", async () => {
    expect(tarballs.map((t) => relative(dir, t)).sort()).toEqual([
      "bothy-cli-0.1.0.tgz",
      "bothy-protocol-0.1.0.tgz",
      "bothy-sdk-0.1.0.tgz",
    ]);
    for (const tarball of tarballs) {
      const files = (await run("tar", ["-tzf", tarball])).stdout.trim().split("\n");
      expect(files).toContain("package/package.json");
      expect(files.filter((f) => f.endsWith(".ts") && !f.endsWith(".d.ts"))).toEqual([]);
      expect(files.filter((f) => f.startsWith("package/src/") || f.startsWith("package/test/"))).toEqual([]);
    }
  });

  it("the installed SDK creates a sandbox, runs echo, reads a file and kills it, from plain JavaScript", async () => {
    const r = await exec(process.execPath, ["app.mjs"]);
    const lines = r.stdout
      .trim()
      .split("\n")
      .filter(Boolean)
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    const id = lines[0]?.["created"];
    if (typeof id === "string") created.push(id);
    expect(r.stderr).toBe("");
    expect(r.code).toBe(0);
    expect(lines[1]).toEqual({
      exitCode: 0,
      stdout: "hello from the package\n",
      text: "written by the packed SDK",
      sdk: `file://${join(app, "node_modules/@bothy/sdk/dist/index.js")}`,
    });
    expect(lines[2]).toEqual({ killed: id });
    // kill() answers once the sandbox is deleting; the list drops it when its teardown has ended.
    expect(await waitDeleted(ts.url, String(id))).toBe("deleted");
    expect((await Sandbox.list({ baseUrl: ts.url })).map((s) => s.sandbox_id)).not.toContain(id);
  });

  it("the installed CLI runs --help and ls against the server, and says that serve needs the repository", async () => {
    const help = await bothy(["--help"]);
    expect(help.code).toBe(0);
    expect(help.stderr).toContain("usage: bothy <command>");

    const sandbox = await Sandbox.create({ baseUrl: ts.url, template: "seed", vcpu: 1, memoryMib: 512, timeoutS: 600 });
    created.push(sandbox.sandboxId);
    const ls = await bothy(["ls", "--quiet"]);
    expect(ls).toEqual({ code: 0, stdout: `${sandbox.sandboxId}\n`, stderr: "" });
    await sandbox.kill();

    const serve = await bothy(["serve"]);
    expect(serve.code).toBe(1);
    expect(serve.stderr).toContain("`bothy serve` runs the server's code, which this installed CLI does not carry");
  });
});
