/**
 * Any node answers for any sandbox (issue #28 items 3-4), with three real `bothy serve` nodes on
 * one PostgreSQL (helpers/cluster-nodes.ts) and gVisor: creates are placed across the nodes;
 * commands, a PTY, files, a port and the E2B SDK work through a node that does not run the
 * sandbox; one Idempotency-Key sent to two nodes at once makes one sandbox; a drained node gets no
 * new sandbox (`bothy node drain`). From the attacker's side: a request that claims to be forwarded by a node, without
 * the cluster's secret, with a wrong signature or replayed, is refused; another tenant's sandbox is
 * 404 to a key through every node. One cluster and few sandboxes for the file.
 */
import { execFile } from "node:child_process";
import { readFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Sandbox as E2bSandbox } from "e2b";
import { api, pollUntil, runCommand } from "./helpers/client.ts";
import { startBackgroundCommand } from "./helpers/background.ts";
import { startClusterNodes, type ClusterNodes } from "./helpers/cluster-nodes.ts";
import { driverTitle, testDriver } from "./helpers/drivers.ts";
import { useE2bEnv } from "./helpers/e2b-env.ts";
import { ClusterSecret, FORWARDED_HEADER } from "../src/cluster/cluster-secret.ts";

const driver = testDriver("gvisor");
const BOTHY = fileURLToPath(new URL("../../cli/bin/bothy.js", import.meta.url));
const pexec = promisify(execFile);
const PORT_SERVER = await readFile(new URL("./fixtures/port-server.mjs", import.meta.url));
const BODY = { template: "seed", vcpu: 1, memory_mib: 256 };

describe.skipIf(driver.missing !== undefined)(driverTitle(driver, "routing across three nodes"), () => {
  let cluster: ClusterNodes;
  /** Sandboxes made by the file, deleted at its end: id → the node that runs it. */
  const made = new Map<string, string>();
  const url = (i: number): string => cluster.nodes[i]?.url ?? "";
  const ws = (i: number): string => url(i).replace(/^http/, "ws");
  /** The index of a node that does not run sandbox `id`. */
  const other = (id: string): number => cluster.nodes.findIndex((n) => n.id !== made.get(id));
  const owner = (id: string): number => cluster.nodes.findIndex((n) => n.id === made.get(id));

  async function nodeOf(id: string): Promise<string> {
    const rows = await cluster.query<{ node_id: string | null }>("SELECT node_id FROM sandboxes WHERE id = $1", [id]);
    return String(rows[0]?.node_id);
  }

  async function create(i: number, headers: Record<string, string> = {}): Promise<{ status: number; id: string }> {
    const res = await api(url(i), "POST", "/sandboxes", BODY, headers);
    expect([200, 201], `${JSON.stringify(res.json)}\n${cluster.logsAbout(String(res.json["sandbox_id"]))}`).toContain(
      res.status,
    );
    const id = String(res.json["sandbox_id"]);
    made.set(id, await nodeOf(id));
    return { status: res.status, id };
  }

  beforeAll(async () => {
    cluster = await startClusterNodes();
  }, 180_000);

  afterAll(async () => {
    for (const id of made.keys()) await api(url(0), "DELETE", `/sandboxes/${id}`).catch(() => undefined);
    await pollUntil("every sandbox deleted", async () => {
      const rows = await cluster.query("SELECT id FROM sandboxes WHERE state NOT IN ('deleted', 'failed')");
      return rows.length === 0;
    }).catch(() => undefined);
    await cluster?.stop();
  }, 120_000);

  it("places creates sent to one node across the nodes", { timeout: 120_000 }, async () => {
    for (let n = 0; n < 3; n++) await create(0);
    // Equal nodes, each create weighed against the ones before: one on each.
    expect(new Set(made.values())).toEqual(new Set(cluster.nodes.map((n) => n.id)));
  });

  it("runs commands and a PTY through a node that does not run the sandbox", { timeout: 60_000 }, async () => {
    const [id] = [...made.keys()];
    if (id === undefined) throw new Error("no sandbox");
    const via = other(id);
    const r = await runCommand(ws(via), id, { cmd: "echo routed" });
    expect([r.stdout, r.exit?.exit_code]).toEqual(["routed\n", 0]);
    const pty = await runCommand(ws(via), id, { cmd: "stty size", pty: { cols: 100, rows: 30 } });
    expect(pty.stdout).toBe("30 100\r\n");
    const shown = await api(url(via), "GET", `/sandboxes/${id}`);
    expect([shown.status, shown.json["state"]]).toEqual([200, "running"]);
  });

  it("streams files both ways through a node that does not run the sandbox", { timeout: 60_000 }, async () => {
    const [id] = [...made.keys()];
    if (id === undefined) throw new Error("no sandbox");
    const via = url(other(id));
    const content = Buffer.alloc(3 * 1024 * 1024, "0123456789abcdef");
    const path = `/sandboxes/${id}/files?path=${encodeURIComponent("/workspace/big.bin")}`;
    const put = await fetch(`${via}${path}`, {
      method: "PUT",
      headers: { "content-type": "application/octet-stream" },
      body: content,
    });
    expect(put.status).toBe(200);
    const got = await fetch(`${via}${path}`);
    expect(got.status).toBe(200);
    expect(Buffer.from(await got.arrayBuffer()).equals(content)).toBe(true);
    // The owner's problem+json comes back unchanged.
    const missing = await fetch(`${via}/sandboxes/${id}/files?path=${encodeURIComponent("/workspace/none")}`);
    expect(missing.status).toBe(404);
    expect(missing.headers.get("content-type")).toMatch(/^application\/problem\+json/);
    expect(((await missing.json()) as { code: string }).code).toBe("file_not_found");
  });

  it("serves a port of the sandbox through a node that does not run it", { timeout: 90_000 }, async () => {
    const [id] = [...made.keys()];
    if (id === undefined) throw new Error("no sandbox");
    const via = url(other(id));
    const put = await fetch(`${via}/sandboxes/${id}/files?path=/workspace/port-server.mjs`, {
      method: "PUT",
      body: PORT_SERVER,
      headers: { "content-type": "application/octet-stream" },
    });
    expect(put.status).toBe(200);
    await startBackgroundCommand(via, id, "node /workspace/port-server.mjs 8000 0.0.0.0 > /tmp/srv.log 2>&1");
    await pollUntil("port 8000 listening", async () => {
      const res = await api(via, "GET", `/sandboxes/${id}/ports`);
      return ((res.json["ports"] ?? []) as Array<{ port: number }>).some((p) => p.port === 8000);
    });
    const res = await fetch(`${via}/sandboxes/${id}/ports/8000/hello`);
    expect([res.status, await res.text()]).toEqual([200, "hello from inside\n"]);
  });

  it("answers the E2B SDK through a node that does not run the sandbox", { timeout: 90_000 }, async () => {
    const restore = useE2bEnv(url(0));
    try {
      const sbx = await E2bSandbox.create();
      made.set(sbx.sandboxId, await nodeOf(sbx.sandboxId));
      restore();
      const back = useE2bEnv(url(other(sbx.sandboxId)));
      try {
        const again = await E2bSandbox.connect(sbx.sandboxId);
        await again.files.write("/tmp/e2b.txt", "through another node");
        expect(await again.files.read("/tmp/e2b.txt")).toBe("through another node");
        const r = await again.commands.run("cat /tmp/e2b.txt");
        expect([r.stdout, r.exitCode]).toEqual(["through another node", 0]);
      } finally {
        back();
      }
    } finally {
      restore();
    }
  });

  it("makes one sandbox for one Idempotency-Key sent to two nodes at once", { timeout: 60_000 }, async () => {
    const count = async (): Promise<number> => (await cluster.query("SELECT id FROM sandboxes")).length;
    const before = await count();
    const headers = { "idempotency-key": "cluster-race-1" };
    const answers = await Promise.all([0, 1].map((i) => api(url(i), "POST", "/sandboxes", BODY, headers)));
    expect(answers.map((a) => a.status).sort()).toEqual([200, 201]);
    const ids = new Set(answers.map((a) => String(a.json["sandbox_id"])));
    expect(ids.size).toBe(1);
    const [id] = [...ids];
    if (id === undefined) throw new Error("no sandbox");
    made.set(id, await nodeOf(id));
    expect(await count()).toBe(before + 1);
  });

  it("places no create on a drained node, even one sent to it", { timeout: 90_000 }, async () => {
    // The emptiest node: the one placement would choose first if it were not drained.
    const loads = (await api(url(0), "GET", "/nodes")).json["nodes"] as Array<{ node_id: string; sandboxes: number }>;
    const emptiest = [...loads].sort((a, b) => a.sandboxes - b.sandboxes)[0]?.node_id;
    const at = cluster.nodes.findIndex((n) => n.id === emptiest);
    const drained = cluster.nodes[at];
    if (!drained) throw new Error("no node");
    const env = { ...process.env, BOTHY_URL: url(0) };
    const cli = await pexec(process.execPath, [BOTHY, "node", "drain", drained.id, "--json"], { env });
    expect(JSON.parse(cli.stdout)).toMatchObject({ node_id: drained.id, draining: true, lapsed: false });
    const listed = await api(url(2), "GET", "/nodes");
    expect((listed.json["nodes"] as Array<{ node_id: string; draining: boolean }>).map((n) => n.draining)).toEqual(
      cluster.nodes.map((n) => n.id === drained.id),
    );
    for (let n = 0; n < 2; n++) {
      const { id } = await create(at);
      expect(made.get(id)).not.toBe(drained.id);
    }
    const back = await api(url(0), "DELETE", `/nodes/${drained.id}/drain`);
    expect([back.status, back.json["draining"]]).toEqual([200, false]);
    const unknown = await api(url(0), "POST", "/nodes/node-z/drain");
    expect([unknown.status, unknown.json["code"]]).toEqual([404, "node_not_found"]);
  });

  it("keeps another tenant's sandbox 404 to a key through every node", { timeout: 60_000 }, async () => {
    expect((await api(url(0), "POST", "/tenants", { tenant: "b" })).status).toBe(201);
    const minted = await api(url(1), "POST", "/keys", { tenant: "b", name: "b" });
    expect(minted.status).toBe(201);
    const bKey = { authorization: `Bearer ${String(minted.json["key"])}` };
    const [id] = [...made.keys()];
    if (id === undefined) throw new Error("no sandbox");
    for (let i = 0; i < cluster.nodes.length; i++) {
      const res = await api(url(i), "GET", `/sandboxes/${id}`, undefined, bKey);
      expect([res.status, res.json["code"]]).toEqual([404, "sandbox_not_found"]);
      const unknown = await api(url(i), "GET", `/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaa`, undefined, bKey);
      expect(unknown.json["detail"]).toBe(String(res.json["detail"]).replace(id, "sbx_aaaaaaaaaaaaaaaaaaaa"));
    }
  });

  it("refuses a request that claims to be forwarded without the cluster's signature, or replayed", async () => {
    const [id] = [...made.keys()];
    if (id === undefined) throw new Error("no sandbox");
    const via = owner(id);
    const path = `/sandboxes/${id}`;
    const forged = [
      "v1;node-a;1;00000000000000000000000000000000;" + "0".repeat(64),
      `v1;node-a;${Date.now()};${"ab".repeat(16)};${"0".repeat(64)}`,
      ClusterSecret.fromString("not-the-cluster-secret-but-long-enough").sign("node-a", "GET", path),
      "anything",
    ];
    for (const header of forged) {
      const res = await api(url(via), "GET", path, undefined, { [FORWARDED_HEADER]: header });
      expect([res.status, res.json["code"]]).toEqual([403, "forward_refused"]);
    }
    // A signature seen in transit (made here with the cluster's secret) works once, never twice.
    const secret = ClusterSecret.fromString((await readFile(cluster.secretFile, "utf8")).trim());
    const captured = secret.sign("node-a", "GET", path);
    const first = await api(url(via), "GET", path, undefined, { [FORWARDED_HEADER]: captured });
    expect(first.status).toBe(200);
    const replay = await api(url(via), "GET", path, undefined, { [FORWARDED_HEADER]: captured });
    expect([replay.status, replay.json["code"]]).toEqual([403, "forward_refused"]);
    // Signed for another path, it is refused for this one.
    const elsewhere = secret.sign("node-a", "GET", `${path}/metrics`);
    const moved = await api(url(via), "GET", path, undefined, { [FORWARDED_HEADER]: elsewhere });
    expect([moved.status, moved.json["code"]]).toEqual([403, "forward_refused"]);
  });
});
