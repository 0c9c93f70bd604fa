/**
 * Snapshots and fork on a real server (gVisor, real runsc, real overlayfs): a snapshot keeps what
 * a sandbox wrote (files, a directory, a file removed from the template) as a layer the size of
 * those writes; children started from it see that and nothing written after it, nor each other's
 * writes, and each has its own identity; the parent's deletion leaves them working; a snapshot in
 * use cannot be deleted; another tenant cannot see, start from or delete one (seen from the
 * attacker's side, a key of tenant b); the storage and sandbox quotas refuse with 429 and make
 * nothing; `memory: true` is 501 on gVisor. On a `bothy serve` killed with -9 and restarted
 * cleanly, snapshots survive and an asleep sandbox is snapshotted. Deleting everything leaves no
 * layer, file or mount.
 *
 * On QEMU (one source VM, so the part stays short under software emulation): a fork of 2 with
 * memory gives children that resume with the source's running service and files, each answering
 * with its own hostname, machine id and random bytes, and diverging; the source is unaffected; a
 * disk-only snapshot of the same source starts a child that boots cold with the files and none of
 * the processes; deleting everything leaves no VM, layer, file, mount or cgroup. A `bothy serve`
 * killed with -9 while a memory capture holds its VM stopped (saved, disks inactive) leaves a VM
 * the next server runs again, its disk writable. Each snapshot says whether it kept memory (API,
 * SDK, CLI).
 */
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, readdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ConflictError, NotFoundError, NotSupportedError, Sandbox, Snapshot } from "@bothy/sdk";
import { api, deleteSandbox, pollUntil, runCommand } from "./helpers/client.ts";
import { driverTitle, testDriver } from "./helpers/drivers.ts";
import { hostLeaks, noLeaks } from "./helpers/host-state.ts";
import { spawnTestServe, type ServeProcess } from "./helpers/serve-process.ts";
import { useTestServer } from "./helpers/suite.ts";
import type { TestServer } from "./helpers/test-server.ts";

const qemu = testDriver("qemu");
const MIB = 1024 * 1024;
const SANDBOX = { template: "seed", vcpu: 1, memory_mib: 512 };
const CHILDREN = 5;

const BOTHY = fileURLToPath(new URL("../../cli/bin/bothy.js", import.meta.url));

/** Runs the bothy CLI as a user would, against `url`. */
function bothy(url: string, args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [BOTHY, ...args], {
      env: { ...process.env, BOTHY_URL: url },
      stdio: ["ignore", "pipe", "pipe"],
    });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on("data", (c: Buffer) => out.push(c));
    child.stderr.on("data", (c: Buffer) => err.push(c));
    child.on("error", reject);
    child.on("close", (code) =>
      resolve({ code, stdout: Buffer.concat(out).toString(), stderr: Buffer.concat(err).toString() }),
    );
  });
}

/** The layers of a home's snapshot store (staging copies included: `.staging` is beside, not in it). */
async function snapshotFiles(home: string): Promise<{ layers: string[]; staging: string[] }> {
  return {
    layers: await readdir(join(home, "snapshots", "layers")).catch(() => []),
    staging: await readdir(join(home, "snapshots", ".staging")).catch(() => []),
  };
}

describe("snapshots and fork (gVisor)", () => {
  let ts: TestServer;
  let bKey = "";
  const asB = (): Record<string, string> => ({ authorization: `Bearer ${bKey}` });
  let parent = "";
  let base = ""; // the named snapshot of the parent
  let forkSnap = "";
  let children: string[] = [];
  const sh = async (id: string, cmd: string): Promise<string> => {
    const out = await runCommand(ts.wsUrl, id, { cmd });
    expect(out.exit?.exit_code, `${id}: ${cmd}: ${out.stderr}`).toBe(0);
    return out.stdout;
  };

  useTestServer({ BOTHY_DRIVER: "gvisor" }, (s) => (ts = s));

  beforeAll(async () => {
    expect((await api(ts.url, "POST", "/tenants", { tenant: "b" })).status).toBe(201);
    const key = await api(ts.url, "POST", "/keys", { tenant: "b", name: "b" });
    bKey = String(key.json["key"]);
    const made = await api(ts.url, "POST", "/sandboxes", SANDBOX);
    expect(made.status, JSON.stringify(made.json)).toBe(201);
    parent = String(made.json["sandbox_id"]);
  });

  it(
    "keeps what the sandbox wrote (files, a dir, a removed template file) in a layer of that size",
    { timeout: 120_000 },
    async () => {
      await sh(
        parent,
        [
          "echo pre > /root/pre.txt",
          "mkdir -p /home/agent/work && echo inside > /home/agent/work/file",
          "rm /etc/debian_version",
          "head -c 20971520 /dev/urandom > /root/blob",
        ].join(" && "),
      );
      const snap = await api(ts.url, "POST", `/sandboxes/${parent}/snapshots`, { name: "base" });
      expect(snap.status, JSON.stringify(snap.json)).toBe(201);
      expect(snap.json).toMatchObject({
        name: "base",
        source_sandbox_id: parent,
        template: "seed",
        driver: "gvisor",
        memory: false,
        used_by: [],
      });
      base = String(snap.json["snapshot_id"]);
      expect(base).toMatch(/^snap_[a-z2-7]{20}$/);
      // What the sandbox wrote (20 MiB and a few small files), not the template's ~260 MB.
      const bytes = Number(snap.json["bytes"]);
      expect(bytes).toBeGreaterThanOrEqual(20 * MIB);
      expect(bytes).toBeLessThan(22 * MIB);
      expect((await snapshotFiles(ts.home)).layers).toHaveLength(1);
      // The sandbox ran on, thawed, and what it writes now is not in the snapshot.
      await sh(parent, "echo post > /root/post.txt");
      expect((await api(ts.url, "GET", "/snapshots")).json["snapshots"]).toMatchObject([{ snapshot_id: base }]);
      expect((await api(ts.url, "GET", "/snapshots/base")).json["snapshot_id"]).toBe(base);
    },
  );

  it("starts a sandbox from a snapshot with the snapshot's files only", { timeout: 120_000 }, async () => {
    const made = await api(ts.url, "POST", "/sandboxes", { snapshot: base });
    expect(made.status, JSON.stringify(made.json)).toBe(201);
    const id = String(made.json["sandbox_id"]);
    expect(made.json["template"]).toBe("seed");
    expect(
      await sh(
        id,
        "cat /root/pre.txt /home/agent/work/file; test -e /etc/debian_version || echo removed; test -e /root/post.txt || echo no-post; stat -c %s /root/blob",
      ),
    ).toBe(`pre\ninside\nremoved\nno-post\n${20 * MIB}\n`);
    // A create naming another template beside the snapshot is refused, not silently changed.
    const both = await api(ts.url, "POST", "/sandboxes", { snapshot: base, template: "seed" });
    expect([both.status, both.json["code"]]).toEqual([400, "invalid_request"]);
    expect(await deleteSandbox(ts.url, id)).toBe("deleted");
  });

  it(
    "boots `warm` sandboxes from a snapshot ahead: creates from it take them, apart; no other tenant can; deleting the snapshot gives the rest up",
    { timeout: 180_000 },
    async () => {
      const snap = await api(ts.url, "POST", `/sandboxes/${parent}/snapshots`, { warm: 3 });
      expect(snap.status, JSON.stringify(snap.json)).toBe(201);
      const warmSnap = String(snap.json["snapshot_id"]);
      const ready = async (): Promise<number> =>
        Number((await api(ts.url, "GET", `/snapshots/${warmSnap}`)).json["warm_ready"]);
      await pollUntil("three warm sandboxes of the snapshot", async () => (await ready()) === 3, 150_000);
      // Tenant b, naming a's snapshot, takes none of them: it is a snapshot b does not have.
      const theirs = await api(ts.url, "POST", "/sandboxes", { snapshot: warmSnap }, asB());
      expect([theirs.status, theirs.json["code"]]).toEqual([404, "snapshot_not_found"]);
      expect(await ready()).toBe(3);
      const taken: string[] = [];
      for (let i = 0; i < 2; i++) {
        const made = await api(ts.url, "POST", "/sandboxes", { snapshot: warmSnap });
        expect(made.status, JSON.stringify(made.json)).toBe(201);
        taken.push(String(made.json["sandbox_id"]));
      }
      const warmFlags = ts.events.flatMap((e) =>
        e.event === "sandbox_created" && taken.includes(e.sandbox_id) ? [e.warm] : [],
      );
      expect(warmFlags).toEqual([true, true]);
      expect(await ready()).toBe(1);
      await Promise.all(taken.map((id, i) => sh(id, `echo warm-${i} > /root/who && touch /root/warm-${i}`)));
      for (const [i, id] of taken.entries())
        expect(await sh(id, "cat /root/who /root/pre.txt; hostname; ls /root | grep -c '^warm-'")).toBe(
          `warm-${i}\npre\n${id}\n1\n`,
        );
      for (const id of taken) expect(await deleteSandbox(ts.url, id)).toBe("deleted");
      // The third, never taken, goes with the snapshot, and with it the last mount of its layer.
      const layers = (await snapshotFiles(ts.home)).layers.length;
      expect((await api(ts.url, "DELETE", `/snapshots/${warmSnap}`)).status).toBe(200);
      expect((await snapshotFiles(ts.home)).layers).toHaveLength(layers - 1);
      expect(ts.server.manager.poolStats()).toEqual({ ready: 0, booting: 0 });
    },
  );

  it(
    "forks children that diverge: each sees its own and the parent's pre-fork files only, with its own identity",
    { timeout: 180_000 },
    async () => {
      const fork = await api(ts.url, "POST", `/sandboxes/${parent}/fork`, { count: CHILDREN });
      expect(fork.status, JSON.stringify(fork.json)).toBe(201);
      forkSnap = String((fork.json["snapshot"] as Record<string, unknown>)["snapshot_id"]);
      children = (fork.json["sandboxes"] as Array<{ sandbox_id: string; state: string }>).map((s) => s.sandbox_id);
      expect(children).toHaveLength(CHILDREN);
      expect(new Set(children).size).toBe(CHILDREN);
      // The parent writes after the fork; each child writes its own file.
      await sh(parent, "echo after-fork > /root/after.txt && echo parent > /root/who");
      await Promise.all(children.map((id, i) => sh(id, `echo child-${i} > /root/who && echo ${i} > /root/mine-${i}`)));
      const seen = await Promise.all(
        children.map((id) =>
          sh(
            id,
            "cat /root/who /root/pre.txt /root/post.txt; ls /root | grep -c '^mine-'; test -e /root/after.txt || echo no-after; hostname; cat /etc/machine-id; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo",
          ),
        ),
      );
      const identities = seen.map((out, i) => {
        const lines = out.trim().split("\n");
        // Its own write, the parent's before the fork (post.txt included), nothing of its siblings or after.
        expect(lines.slice(0, 6)).toEqual([`child-${i}`, "pre", "post", "1", "no-after", children[i]]);
        return { hostname: lines[5], machineId: lines[6], random: lines[7] };
      });
      for (const key of ["hostname", "machineId", "random"] as const)
        expect(new Set(identities.map((x) => x[key])).size, key).toBe(CHILDREN);
      expect(identities[0]?.machineId).toMatch(/^[0-9a-f]{32}$/);
      // The parent saw none of the children's writes.
      expect(await sh(parent, "cat /root/who; ls /root | grep -c '^mine-' || true")).toBe("parent\n0\n");
      expect((await api(ts.url, "GET", `/snapshots/${forkSnap}`)).json["used_by"]).toEqual([...children].sort());
    },
  );

  it("gives each child its own E2B access token, which opens no sibling's envd", async () => {
    const tokens = await Promise.all(
      children.map(async (id) => {
        const info = await api(ts.url, "GET", `/e2b/sandboxes/${id}`);
        expect(info.status, JSON.stringify(info.json)).toBe(200);
        return String(info.json["envdAccessToken"]);
      }),
    );
    expect(new Set(tokens).size).toBe(CHILDREN);
    // A holder of one child's token (say, code in that child that read it) against every child's envd.
    // Child j wrote /root/mine-j after the fork (the test above).
    const envd = (j: number, token: string): Promise<Response> =>
      fetch(`${ts.url}/e2b/envd/files?path=/root/mine-${j}`, {
        headers: { "e2b-sandbox-id": children[j] ?? "", "x-access-token": token },
      });
    for (const [i, token] of tokens.entries())
      for (const j of children.keys()) {
        const res = await envd(j, token);
        if (i === j) expect([i, j, res.status, await res.text()]).toEqual([i, j, 200, `${j}\n`]);
        else expect([i, j, res.status]).toEqual([i, j, 401]);
      }
  });

  it("refuses to delete a snapshot in use, naming the sandboxes", async () => {
    const del = await api(ts.url, "DELETE", `/snapshots/${forkSnap}`);
    expect(del.status).toBe(409);
    expect(del.type).toMatch(/problem\+json/);
    expect(del.json["code"]).toBe("snapshot_in_use");
    for (const id of children) expect(String(del.json["detail"])).toContain(id);
    expect((await api(ts.url, "GET", `/snapshots/${forkSnap}`)).status).toBe(200);
  });

  it("leaves the children working after their parent is deleted", { timeout: 60_000 }, async () => {
    expect(await deleteSandbox(ts.url, parent)).toBe("deleted");
    expect(await sh(children[0] ?? "", "cat /root/pre.txt /root/who")).toBe("pre\nchild-0\n");
  });

  it("answers another tenant's snapshot as one that does not exist: GET, DELETE, start from, by id and name", async () => {
    const before = (await snapshotFiles(ts.home)).layers;
    for (const [method, path, body, unknownPath, unknownBody] of [
      ["GET", `/snapshots/${base}`, undefined, "/snapshots/snap_aaaaaaaaaaaaaaaaaaaa", undefined],
      ["GET", "/snapshots/base", undefined, "/snapshots/nothing", undefined],
      ["DELETE", `/snapshots/${base}`, undefined, "/snapshots/snap_aaaaaaaaaaaaaaaaaaaa", undefined],
      ["DELETE", "/snapshots/base", undefined, "/snapshots/nothing", undefined],
      ["POST", "/sandboxes", { snapshot: base }, "/sandboxes", { snapshot: "snap_aaaaaaaaaaaaaaaaaaaa" }],
      ["POST", "/sandboxes", { snapshot: "base" }, "/sandboxes", { snapshot: "nothing" }],
    ] as const) {
      const theirs = await api(ts.url, method, path, body, asB());
      const unknown = await api(ts.url, method, unknownPath, unknownBody, asB());
      expect([method, path, theirs.status, theirs.json["code"]]).toEqual([method, path, 404, "snapshot_not_found"]);
      // Byte for byte what an unknown one gets: nothing tells that it exists in another tenant.
      const blank = (j: Record<string, unknown>): string =>
        JSON.stringify(j)
          .replaceAll(base, "REF")
          .replaceAll("snap_aaaaaaaaaaaaaaaaaaaa", "REF")
          .replaceAll("nothing", "REF")
          .replaceAll("base", "REF");
      expect(blank(theirs.json)).toBe(blank(unknown.json));
    }
    expect((await api(ts.url, "GET", "/snapshots", undefined, asB())).json["snapshots"]).toEqual([]);
    // Nor can b snapshot or fork a's sandbox: it is an unknown sandbox to b.
    for (const path of [`/sandboxes/${children[0] ?? ""}/snapshots`, `/sandboxes/${children[0] ?? ""}/fork`]) {
      const res = await api(ts.url, "POST", path, path.endsWith("fork") ? { count: 1 } : {}, asB());
      expect([path, res.status, res.json["code"]]).toEqual([path, 404, "sandbox_not_found"]);
    }
    expect((await api(ts.url, "GET", `/snapshots/${base}`)).status).toBe(200);
    expect((await snapshotFiles(ts.home)).layers).toEqual(before);
  });

  it("answers memory: true with 501 on gVisor and makes nothing; a filesystem snapshot still works", async () => {
    const before = await snapshotFiles(ts.home);
    const res = await api(ts.url, "POST", `/sandboxes/${children[1] ?? ""}/snapshots`, { memory: true });
    expect([res.status, res.json["code"]]).toEqual([501, "snapshot_memory_unsupported"]);
    expect(String(res.json["detail"])).toMatch(/"memory": false/);
    expect(await snapshotFiles(ts.home)).toEqual(before);
    const bad = await api(ts.url, "POST", `/sandboxes/${children[1] ?? ""}/snapshots`, { name: "Not A Name" });
    expect([bad.status, bad.json["code"]]).toEqual([400, "invalid_request"]);
    const taken = await api(ts.url, "POST", `/sandboxes/${children[1] ?? ""}/snapshots`, { name: "base" });
    expect([taken.status, taken.json["code"]]).toEqual([409, "snapshot_exists"]);
  });

  it(
    "refuses past the storage and sandbox quotas with 429, making no row, layer or sandbox",
    { timeout: 120_000 },
    async () => {
      const made = await api(ts.url, "POST", "/sandboxes", SANDBOX, asB());
      expect(made.status, JSON.stringify(made.json)).toBe(201);
      const bSandbox = String(made.json["sandbox_id"]);
      await sh(bSandbox, "head -c 3145728 /dev/urandom > /root/three-mib");
      expect((await api(ts.url, "PATCH", "/tenants/b/quota", { max_storage_mib: 2, max_sandboxes: 3 })).status).toBe(
        200,
      );
      const before = await snapshotFiles(ts.home);
      const over = await api(ts.url, "POST", `/sandboxes/${bSandbox}/snapshots`, {}, asB());
      expect([over.status, over.json["code"]]).toEqual([429, "quota_exceeded"]);
      expect(String(over.json["detail"])).toMatch(/max_storage_mib/);
      expect(await snapshotFiles(ts.home)).toEqual(before);
      expect((await api(ts.url, "GET", "/snapshots", undefined, asB())).json["snapshots"]).toEqual([]);
      // Three children would take b past max_sandboxes: refused before any snapshot or sandbox is made.
      expect((await api(ts.url, "PATCH", "/tenants/b/quota", { max_storage_mib: null })).status).toBe(200);
      const sandboxesBefore = (
        (await api(ts.url, "GET", "/sandboxes", undefined, asB())).json["sandboxes"] as unknown[]
      ).length;
      const fork = await api(ts.url, "POST", `/sandboxes/${bSandbox}/fork`, { count: 3 }, asB());
      expect([fork.status, fork.json["code"]]).toEqual([429, "quota_exceeded"]);
      expect(String(fork.json["detail"])).toMatch(/max_sandboxes/);
      expect(await snapshotFiles(ts.home)).toEqual(before);
      expect((await api(ts.url, "GET", "/snapshots", undefined, asB())).json["snapshots"]).toEqual([]);
      expect(((await api(ts.url, "GET", "/sandboxes", undefined, asB())).json["sandboxes"] as unknown[]).length).toBe(
        sandboxesBefore,
      );
      expect(await deleteSandbox(ts.url, bSandbox)).toBe("deleted");
    },
  );

  it(
    "is driven by @bothy/sdk (snapshot, fork, create from, Snapshot) and the CLI (snapshot, fork)",
    { timeout: 120_000 },
    async () => {
      const conn = { baseUrl: ts.url };
      const source = await Sandbox.connect(children[1] ?? "", conn);
      const snap = await source.snapshot({ name: "sdk" });
      expect([snap.name, snap.memory]).toEqual(["sdk", false]);
      await expect(source.snapshot({ memory: true })).rejects.toBeInstanceOf(NotSupportedError);
      await expect(source.fork(1, { memory: true })).rejects.toBeInstanceOf(NotSupportedError);
      const fromSdk = await Sandbox.create({ ...conn, snapshot: "sdk" });
      expect((await fromSdk.commands.run("cat /root/who")).stdout).toBe("child-1\n");
      const { snapshot: forked, sandboxes } = await source.fork(1, { name: "sdk-fork" });
      expect(forked.used_by).toEqual([sandboxes[0]?.sandboxId]);
      expect((await sandboxes[0]?.commands.run("cat /root/who"))?.stdout).toBe("child-1\n");
      expect((await Snapshot.list(conn)).map((s) => s.name)).toEqual(expect.arrayContaining(["sdk", "sdk-fork"]));
      await expect(Snapshot.delete("sdk", conn)).rejects.toBeInstanceOf(ConflictError);
      for (const sbx of [fromSdk, ...sandboxes]) await sbx.kill({ wait: true });
      for (const name of ["sdk", "sdk-fork"]) await Snapshot.delete(name, conn);
      await expect(Snapshot.get("sdk", conn)).rejects.toBeInstanceOf(NotFoundError);

      const cli = await bothy(ts.url, ["fork", children[1] ?? "", "--count", "1", "--name", "cli", "--json"]);
      expect(cli.code, cli.stderr).toBe(0);
      const out = JSON.parse(cli.stdout) as {
        snapshot: { snapshot_id: string };
        sandboxes: Array<{ sandbox_id: string }>;
      };
      const listed = await bothy(ts.url, ["snapshot", "ls"]);
      const row = listed.stdout.split("\n").find((l) => l.startsWith(out.snapshot.snapshot_id));
      // MEMORY (after BYTES): a gVisor snapshot keeps files only.
      expect(listed.stdout.split("\n")[0]).toMatch(/BYTES +MEMORY +USED_BY/);
      expect(row?.split(/ +/)[5]).toBe("no");
      const memoryRefused = await bothy(ts.url, ["snapshot", "create", children[1] ?? "", "--memory"]);
      expect([memoryRefused.code === 0, memoryRefused.stderr]).toEqual([false, expect.stringMatching(/memory/)]);
      const refused = await bothy(ts.url, ["snapshot", "rm", "cli"]);
      expect(refused.code).not.toBe(0);
      expect(refused.stderr).toMatch(/in use/);
      expect(await deleteSandbox(ts.url, out.sandboxes[0]?.sandbox_id ?? "")).toBe("deleted");
      const removed = await bothy(ts.url, ["snapshot", "rm", "cli"]);
      expect([removed.code, removed.stdout]).toEqual([0, "cli\n"]);
    },
  );

  it(
    "leaves no layer, staging copy or mount once every sandbox and snapshot is deleted",
    { timeout: 60_000 },
    async () => {
      for (const id of children) expect(await deleteSandbox(ts.url, id)).toBe("deleted");
      for (const id of [forkSnap, base]) {
        const del = await api(ts.url, "DELETE", `/snapshots/${id}`);
        expect([del.status, del.json]).toEqual([200, { deleted: id }]);
      }
      expect(await snapshotFiles(ts.home)).toEqual({ layers: [], staging: [] });
      expect((await api(ts.url, "GET", `/snapshots/${base}`)).status).toBe(404);
    },
  );
});

describe("snapshots across a server crash and a clean restart (gVisor)", () => {
  let home = "";
  let serve: ServeProcess | undefined;

  afterAll(async () => {
    await serve?.stop();
    if (home) await rm(home, { recursive: true, force: true });
  });

  const start = (env: Record<string, string> = {}): Promise<string> => {
    serve = spawnTestServe(home, { BOTHY_DRIVER: "gvisor", ...env });
    return serve.url;
  };

  it(
    "resumes a sandbox frozen by a capture the server was killed in; keeps snapshots through kill -9 and a clean restart, snapshots an asleep sandbox, and leaves nothing behind",
    { timeout: 240_000 },
    async () => {
      home = await mkdtemp("/tmp/bothy-test-snapshots-");
      // The first server holds every capture with its sandbox frozen until `hold` exists (never here).
      const hold = join(home, "capture-hold");
      let url = await start({ BOTHY_TEST_CAPTURE_HOLD: hold });
      const ws = (): string => url.replace(/^http/, "ws");
      const sh = async (id: string, cmd: string): Promise<string> => (await runCommand(ws(), id, { cmd })).stdout;
      const made = await api(url, "POST", "/sandboxes", SANDBOX);
      expect(made.status, JSON.stringify(made.json)).toBe(201);
      const id = String(made.json["sandbox_id"]);
      expect(await sh(id, "echo one > /root/one && echo ok")).toBe("ok\n");

      // kill -9 while the capture has the sandbox frozen and its copy half made.
      const held = api(url, "POST", `/sandboxes/${id}/snapshots`, { name: "crashed" }).catch(() => undefined);
      await pollUntil("the capture to freeze its sandbox", () => existsSync(`${hold}.frozen`), 60_000);
      expect((await snapshotFiles(home)).staging).toHaveLength(1);
      await serve?.kill();
      await held;
      url = await start();
      // Taken over and running on (not stopped, as a failed take-over leaves a sandbox).
      expect((await api(url, "GET", `/sandboxes/${id}`)).json["state"]).toBe("running");
      expect(await sh(id, "cat /root/one && echo runs")).toBe("one\nruns\n");
      expect(serve?.logs.some((l) => l["event"] === "snapshot_capture_thawed" && l["sandbox_id"] === id)).toBe(true);
      expect((await api(url, "GET", "/snapshots")).json["snapshots"]).toEqual([]);
      // The copy it had made in staging, never published, is gone too.
      expect(await snapshotFiles(home)).toEqual({ layers: [], staging: [] });

      const first = await api(url, "POST", `/sandboxes/${id}/snapshots`, { name: "first" });
      expect(first.status, JSON.stringify(first.json)).toBe(201);

      await serve?.kill();
      url = await start();
      expect((await api(url, "GET", "/snapshots/first")).json["snapshot_id"]).toBe(first.json["snapshot_id"]);
      // The sandbox was taken over: it runs on, and writes after the snapshot.
      expect(await sh(id, "echo two > /root/two && echo ok")).toBe("ok\n");

      // A clean stop leaves the sandbox asleep (stopped, its disk kept): it is snapshotted as it lies.
      await serve?.stop();
      url = await start();
      expect((await api(url, "GET", `/sandboxes/${id}`)).json["state"]).toBe("stopped");
      const asleep = await api(url, "POST", `/sandboxes/${id}/snapshots`, { name: "asleep" });
      expect(asleep.status, JSON.stringify(asleep.json)).toBe(201);
      expect((await api(url, "GET", `/sandboxes/${id}`)).json["state"]).toBe("stopped");

      const fromFirst = await api(url, "POST", "/sandboxes", { snapshot: "first" });
      const fromAsleep = await api(url, "POST", "/sandboxes", { snapshot: "asleep" });
      expect([fromFirst.status, fromAsleep.status]).toEqual([201, 201]);
      const a = String(fromFirst.json["sandbox_id"]);
      const b = String(fromAsleep.json["sandbox_id"]);
      expect(await sh(a, "cat /root/one; test -e /root/two || echo no-two")).toBe("one\nno-two\n");
      expect(await sh(b, "cat /root/one /root/two")).toBe("one\ntwo\n");

      for (const sandbox of [a, b, id]) expect(await deleteSandbox(url, sandbox)).toBe("deleted");
      for (const name of ["first", "asleep"]) expect((await api(url, "DELETE", `/snapshots/${name}`)).status).toBe(200);
      expect(await snapshotFiles(home)).toEqual({ layers: [], staging: [] });
      await serve?.stop();
      serve = undefined;
      expect(await hostLeaks(home)).toEqual(noLeaks());
    },
  );
});

describe.skipIf(qemu.missing !== undefined)(driverTitle(qemu, "snapshots across a server crash (QEMU)"), () => {
  let home = "";
  let serve: ServeProcess | undefined;

  afterAll(async () => {
    await serve?.stop();
    if (home) await rm(home, { recursive: true, force: true });
  });

  it(
    "runs again a VM a memory capture stopped when its server was killed, with its disk writable, and leaves nothing behind",
    { timeout: 300_000 },
    async () => {
      home = await mkdtemp("/tmp/bothy-test-snapshots-qemu-");
      // The first server holds every capture with its VM stopped until `hold` exists (never here).
      const hold = join(home, "capture-hold");
      serve = spawnTestServe(home, { BOTHY_DRIVER: "qemu", BOTHY_TEST_CAPTURE_HOLD: hold });
      let url = await serve.url;
      const ws = (): string => url.replace(/^http/, "ws");
      const sh = async (id: string, cmd: string): Promise<string> => (await runCommand(ws(), id, { cmd })).stdout;
      const made = await api(url, "POST", "/sandboxes", SANDBOX);
      expect(made.status, JSON.stringify(made.json)).toBe(201);
      const id = String(made.json["sandbox_id"]);
      expect(await sh(id, "echo one > /root/one && echo ok")).toBe("ok\n");

      // kill -9 once the capture has saved the VM's memory (QEMU in postmigrate, its disks
      // inactive) and copied its disk, before the thaw.
      const held = api(url, "POST", `/sandboxes/${id}/snapshots`, { memory: true }).catch(() => undefined);
      await pollUntil("the capture to stop its VM", () => existsSync(`${hold}.frozen`), 120_000);
      await serve.kill();
      await held;
      serve = spawnTestServe(home, { BOTHY_DRIVER: "qemu" });
      url = await serve.url;
      // Taken over and running on (a take-over that fails stops the sandbox), its disk active again.
      expect((await api(url, "GET", `/sandboxes/${id}`)).json["state"]).toBe("running");
      expect(await sh(id, "cat /root/one && echo two > /root/two && sync && cat /root/two")).toBe("one\ntwo\n");
      expect(serve.logs.find((l) => l["event"] === "snapshot_capture_thawed")).toMatchObject({
        sandbox_id: id,
        was: "postmigrate",
      });
      expect(existsSync(join(home, "sandboxes", id, "capture-frozen"))).toBe(false);
      // The snapshot was never published, and its half in staging is gone.
      expect((await api(url, "GET", "/snapshots")).json["snapshots"]).toEqual([]);
      expect(await snapshotFiles(home)).toEqual({ layers: [], staging: [] });

      expect(await deleteSandbox(url, id)).toBe("deleted");
      await serve.stop();
      serve = undefined;
      expect(await hostLeaks(home)).toEqual(noLeaks());
    },
  );
});

describe.skipIf(qemu.missing !== undefined)(driverTitle(qemu, "snapshots and fork (QEMU)"), () => {
  let ts: TestServer;
  let source = "";
  let memorySnap = "";
  let diskSnap = "";
  const made: string[] = [];
  /**
   * A small HTTP service that answers with the hostname of the machine it runs on at each request,
   * and a client that asks it from inside the sandbox (bash's /dev/tcp: no client program needed).
   */
  const SETUP = [
    "echo pre > /root/pre.txt",
    "cat > /root/service.js <<'EOF'",
    "require('http').createServer((q, s) => s.end(require('os').hostname())).listen(8080, '127.0.0.1');",
    "EOF",
    "cat > /root/ask.sh <<'EOF'",
    "exec 3<>/dev/tcp/127.0.0.1/8080 || exit 7",
    "printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3",
    "tail -n 1 <&3",
    "echo",
    "EOF",
    "(setsid node /root/service.js </dev/null >/root/svc.log 2>&1 &)",
  ].join("\n");
  const ASK = "bash /root/ask.sh";
  const run = async (id: string, cmd: string): Promise<{ code: number | null | undefined; out: string }> => {
    const r = await runCommand(ts.wsUrl, id, { cmd });
    return { code: r.exit?.exit_code, out: r.stdout };
  };
  const sh = async (id: string, cmd: string): Promise<string> => {
    const r = await runCommand(ts.wsUrl, id, { cmd });
    expect(r.exit?.exit_code, `${id}: ${cmd}: ${r.stderr}`).toBe(0);
    return r.stdout;
  };

  useTestServer({ BOTHY_DRIVER: "qemu" }, (s) => (ts = s));

  beforeAll(async () => {
    const res = await api(ts.url, "POST", "/sandboxes", SANDBOX);
    expect(res.status, JSON.stringify(res.json)).toBe(201);
    source = String(res.json["sandbox_id"]);
    made.push(source);
    await sh(source, SETUP);
    // The service is up once it answers (Node takes seconds to start under emulation, more on a loaded host).
    const deadline = Date.now() + 150_000;
    for (let asked = await run(source, ASK); asked.out.trim() !== source; asked = await run(source, ASK)) {
      if (Date.now() > deadline)
        throw new Error(`the source's service never answered: ${await sh(source, "cat /root/svc.log")}`);
      await new Promise((r) => setTimeout(r, 1000));
    }
  }, 300_000);

  it(
    "forks 2 with memory: the running service and files survive, each child is its own machine and diverges, the source is unaffected",
    { timeout: 150_000 },
    async () => {
      const fork = await api(ts.url, "POST", `/sandboxes/${source}/fork`, { count: 2, memory: true });
      expect(fork.status, JSON.stringify(fork.json)).toBe(201);
      const snapshot = fork.json["snapshot"] as Record<string, unknown>;
      memorySnap = String(snapshot["snapshot_id"]);
      expect(snapshot).toMatchObject({ driver: "qemu", memory: true });
      const children = (fork.json["sandboxes"] as Array<{ sandbox_id: string }>).map((s) => s.sandbox_id);
      made.push(...children);
      expect(children).toHaveLength(2);
      await sh(source, "echo after-fork > /root/after.txt && echo source > /root/who");
      await Promise.all(children.map((id, i) => sh(id, `echo child-${i} > /root/who`)));
      const seen = await Promise.all(
        children.map((id) =>
          sh(
            id,
            `${ASK}; cat /root/who /root/pre.txt; test -e /root/after.txt || echo no-after; hostname; cat /etc/machine-id; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo`,
          ),
        ),
      );
      const identities = seen.map((out, i) => {
        const lines = out.trim().split("\n");
        // The service the source started answers in the child, with the child's hostname.
        expect(lines.slice(0, 5)).toEqual([children[i], `child-${i}`, "pre", "no-after", children[i]]);
        return { machineId: lines[5], random: lines[6] };
      });
      const sourceIdentity = (await sh(source, "cat /etc/machine-id")).trim();
      expect(new Set([sourceIdentity, ...identities.map((x) => x.machineId)]).size).toBe(3);
      expect(new Set(identities.map((x) => x.random)).size).toBe(2);
      // The source runs on, with its own service, files and hostname.
      expect(await sh(source, `${ASK}; cat /root/who /root/after.txt`)).toBe(`${source}\nsource\nafter-fork\n`);
      expect((await api(ts.url, "GET", `/snapshots/${memorySnap}`)).json["used_by"]).toEqual([...children].sort());
    },
  );

  it(
    "a disk-only snapshot of the same source starts a child that boots cold with the files and none of the processes",
    { timeout: 150_000 },
    async () => {
      const snap = await api(ts.url, "POST", `/sandboxes/${source}/snapshots`, {});
      expect(snap.status, JSON.stringify(snap.json)).toBe(201);
      diskSnap = String(snap.json["snapshot_id"]);
      expect(snap.json["memory"]).toBe(false);
      expect((await api(ts.url, "GET", `/snapshots/${memorySnap}`)).json["memory"]).toBe(true);
      // What the sandbox wrote since its template (a few MiB of guest writes), not the template's disk.
      expect(Number(snap.json["bytes"])).toBeLessThan(64 * MIB);
      const res = await api(ts.url, "POST", "/sandboxes", { snapshot: diskSnap });
      expect(res.status, JSON.stringify(res.json)).toBe(201);
      const child = String(res.json["sandbox_id"]);
      made.push(child);
      expect(await sh(child, "cat /root/who /root/after.txt; hostname")).toBe(`source\nafter-fork\n${child}\n`);
      expect((await run(child, ASK)).code).not.toBe(0);
      const del = await api(ts.url, "DELETE", `/snapshots/${diskSnap}`);
      expect([del.status, del.json["code"]]).toEqual([409, "snapshot_in_use"]);
    },
  );

  it(
    "leaves no VM, layer, file, mount or cgroup once every sandbox and snapshot is deleted",
    { timeout: 60_000 },
    async () => {
      for (const id of made) expect(await deleteSandbox(ts.url, id)).toBe("deleted");
      for (const id of [memorySnap, diskSnap]) {
        const del = await api(ts.url, "DELETE", `/snapshots/${id}`);
        expect([del.status, del.json]).toEqual([200, { deleted: id }]);
      }
      expect(await snapshotFiles(ts.home)).toEqual({ layers: [], staging: [] });
      expect(await hostLeaks(ts.home)).toEqual(noLeaks());
    },
  );
});
