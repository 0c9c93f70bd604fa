/**
 * One policy layer and one event stream across nodes: two real `bothy serve` nodes on one PostgreSQL
 * 15 with one vault key file, node X in the network lab (its gateway in front of its gVisor
 * sandboxes, a simulated internet behind it) and node Y on loopback. From the attacker's side: a
 * key revoked through X is refused by Y at the next request and its stream on Y ends; a tenant's
 * stream on Y shows none of another tenant's events made on X; a node given another vault key
 * refuses to start. And the cluster's promises: /events gap-free on both nodes while both create
 * at once and resumed on the other node; a secret made through Y swapped in for a sandbox on X;
 * requests X holds decided through Y, the approved one out once and the denied one refused.
 * Every wait has a deadline.
 */
import { spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import pg from "pg";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import type { BothyEvent } from "@bothy/protocol";
import { testKernelDir, testTemplatesDir } from "../../../test/paths.ts";
import { api, deleteSandbox, runCommand } from "./helpers/client.ts";
import { driverTitle, testDriver } from "./helpers/drivers.ts";
import { bodyOf, egressProbe, type EgressCheck } from "./helpers/egress-probe.ts";
import { useNetLab } from "./helpers/net-lab.ts";
import { NAMES, PUBLIC_HTTP } from "./helpers/net-topology.ts";
import { startPostgres, type TestPostgres } from "./helpers/postgres.ts";
import { spawnTestServe, type ServeProcess } from "./helpers/serve-process.ts";

const root = process.getuid?.() === 0;
const gvisor = testDriver("gvisor");
const BOTHY = fileURLToPath(new URL("../../cli/bin/bothy.js", import.meta.url));

/** Polls `done` every 50 ms until it holds; fails naming `what` after `ms`. */
async function until(what: string, done: () => boolean | Promise<boolean>, ms = 60_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await done())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** An open `GET /events` whose events are collected as they come. */
interface Stream {
  events: BothyEvent[];
  /** Set once the server ended the stream. */
  ended: boolean;
  close(): void;
}

async function openStream(base: string, query = "", headers: Record<string, string> = {}): Promise<Stream> {
  const controller = new AbortController();
  const res = await fetch(`${base}/events${query}`, { headers, signal: controller.signal });
  expect(res.status).toBe(200);
  const stream: Stream = { events: [], ended: false, close: () => controller.abort() };
  void (async () => {
    const decoder = new TextDecoder();
    let text = "";
    try {
      for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
        text += decoder.decode(chunk, { stream: true });
        let cut;
        while ((cut = text.indexOf("\n\n")) >= 0) {
          const data = text
            .slice(0, cut)
            .split("\n")
            .find((l) => l.startsWith("data: "));
          text = text.slice(cut + 2);
          if (data) stream.events.push(JSON.parse(data.slice(6)) as BothyEvent);
        }
      }
    } catch {
      // Aborted by `close`, or cut by the server: either way it has ended.
    }
    stream.ended = true;
  })();
  return stream;
}

const seqs = (events: BothyEvent[]): number[] => events.map((e) => e.seq);
const createdIds = (events: BothyEvent[]): string[] =>
  events.filter((e) => e.type === "sandbox.created").map((e) => String(e.sandbox_id));

/**
 * `POST /sandboxes` through `base`, made again when another node closed its row while it was being
 * made (409): until the sweeper runs on the leader only, for lapsed nodes' rows only (issue #28
 * item 6, not this file's), each node's first sweep, at its start, closes every live row it does not
 * own, another node's creates included.
 */
async function create(
  base: string,
  body: Record<string, unknown>,
  headers: Record<string, string> = {},
): Promise<string> {
  for (let attempt = 1; ; attempt++) {
    const res = await api(base, "POST", "/sandboxes", { template: "seed", driver: "gvisor", ...body }, headers);
    if (res.status === 201) return String(res.json["sandbox_id"]);
    if (res.status !== 409 || attempt === 3)
      throw new Error(`create through ${base}: ${res.status} ${JSON.stringify(res.json)}`);
  }
}

describe.skipIf(!root || gvisor.missing !== undefined)(
  driverTitle(gvisor, "the policy layer and /events across two nodes on one PostgreSQL"),
  () => {
    let postgres: TestPostgres | undefined;
    let keyDir = "";
    let keyFile = "";
    /** The cluster's database by TCP on loopback (node Y), and by its unix socket (node X, in its own network namespace). */
    let tcpUrl = "";
    let socketUrl = "";

    /** What every node of this cluster gets; the sweeper is kept out of the way (another's job: issue #28 item 6). */
    const nodeEnv = (id: string, databaseUrl: string): Record<string, string> => ({
      BOTHY_DATABASE_URL: databaseUrl,
      BOTHY_NODE_URL: "http://127.0.0.1:1",
      BOTHY_NODE_ID: id,
      BOTHY_NODE_LEASE_S: "3",
      BOTHY_VAULT_KEY_FILE: keyFile,
      BOTHY_SWEEP_INTERVAL_S: "3600",
    });

    beforeAll(async () => {
      postgres = await startPostgres();
      tcpUrl = await postgres.createDatabase("clusterpol");
      const client = new pg.Client({ connectionString: tcpUrl });
      await client.connect();
      const dir = String(
        (await client.query<{ d: string }>("SELECT current_setting('unix_socket_directories') AS d")).rows[0]?.d,
      );
      await client.end();
      const url = new URL(tcpUrl);
      socketUrl = `postgres://postgres@localhost:${url.port}${url.pathname}?host=${encodeURIComponent(dir)}`;
      keyDir = await mkdtemp("/tmp/bothy-clusterpol-keys-");
      keyFile = join(keyDir, "vault.key");
      await writeFile(keyFile, randomBytes(32), { mode: 0o600 });
    }, 120_000);
    // Registered before the nodes' own: after hooks run in reverse, so this runs once both nodes have stopped.
    afterAll(async () => {
      await postgres?.stop();
      if (keyDir) await rm(keyDir, { recursive: true, force: true });
    });

    const lab = useNetLab("clusterpol", (topo) => ({
      NODE_EXTRA_CA_CERTS: topo.caFile,
      ...nodeEnv("node-x", socketUrl),
    }));
    const x = (): string => lab.base;

    let y: ServeProcess | undefined;
    let yHome = "";
    let yBase = "";
    const yMade: string[] = [];
    beforeAll(async () => {
      yHome = await mkdtemp("/tmp/bothy-clusterpol-y-");
      y = spawnTestServe(yHome, { BOTHY_DRIVER: "gvisor", ...nodeEnv("node-y", tcpUrl) });
      yBase = await y.url;
    }, 120_000);

    afterAll(async () => {
      for (const id of yMade) await api(yBase, "DELETE", `/sandboxes/${id}`).catch(() => undefined);
      await y?.stop();
      if (yHome) await rm(yHome, { recursive: true, force: true });
    });

    afterEach((ctx) => {
      if (ctx.task.result?.state !== "fail") return;
      // What each node said last, with the sandbox ids, for the failure's story.
      for (const [name, logs] of [
        ["X", lab.server.logs],
        ["Y", y?.logs ?? []],
      ] as const)
        console.error(
          `node ${name}'s last log lines:\n${logs
            .slice(-40)
            .map((l) => JSON.stringify(l))
            .join("\n")}`,
        );
    });

    it("a key minted through X works on Y; revoked through X, Y refuses it at the next request and ends its stream", async () => {
      expect((await api(x(), "POST", "/tenants", { tenant: "alpha" })).status).toBe(201);
      const minted = await api(x(), "POST", "/keys", { tenant: "alpha", name: "alpha" });
      expect(minted.status).toBe(201);
      const auth = { authorization: `Bearer ${String(minted.json["key"])}` };
      // Y digests it with the cluster's pepper (derived from the vault key) and knows it.
      expect((await api(yBase, "GET", "/sandboxes", undefined, auth)).status).toBe(200);
      expect((await api(yBase, "GET", "/sandboxes", undefined, auth)).status).toBe(200);
      const stream = await openStream(yBase, "", auth);
      expect((await api(x(), "DELETE", `/keys/${String(minted.json["key_id"])}`)).status).toBe(200);
      // At once: no cache on Y still holds the key it verified a moment ago.
      expect((await api(yBase, "GET", "/sandboxes", undefined, auth)).status).toBe(401);
      await until("the revoked key's stream on Y to end", () => stream.ended, 15_000);
    });

    it("/events: gap-free on both nodes while both create at once, resumed on the other node; a tenant's stream on Y shows none of X's", async () => {
      expect((await api(yBase, "POST", "/tenants", { tenant: "beta" })).status).toBe(201);
      const beta = await api(yBase, "POST", "/keys", { tenant: "beta", name: "beta" });
      expect(beta.status).toBe(201);
      const betaAuth = { authorization: `Bearer ${String(beta.json["key"])}` };
      const client = new pg.Client({ connectionString: tcpUrl });
      await client.connect();
      const rowsAfter = async (after: number): Promise<number[]> =>
        (await client.query<{ seq: string }>("SELECT seq FROM events WHERE seq > $1 ORDER BY seq", [after])).rows.map(
          (r) => Number(r.seq),
        );
      try {
        const before = Number(
          (await client.query<{ seq: string }>("SELECT COALESCE(MAX(seq), 0) AS seq FROM events")).rows[0]?.seq,
        );
        const onX = await openStream(x(), `?since=${before}`);
        const onY = await openStream(yBase, `?since=${before}`);
        const betaOnY = await openStream(yBase, `?since=${before}`, betaAuth);
        try {
          // Three creates on each node at once (one of Y's in tenant beta).
          const made = await Promise.all([
            create(x(), {}),
            create(x(), {}),
            create(x(), {}),
            create(yBase, {}),
            create(yBase, {}),
            create(yBase, {}, betaAuth),
          ]);
          const madeOnX = made.slice(0, 3);
          const betaId = made[5] as string;
          lab.made.push(...madeOnX);
          yMade.push(...made.slice(3));
          for (const s of [onX, onY])
            await until("every create's event on both nodes", () =>
              made.every((id) => createdIds(s.events).includes(id)),
            );
          await until("beta's create on Y's beta stream", () => createdIds(betaOnY.events).includes(betaId));

          // Each stream is the database's rows after `before`, in order, none missed, none twice.
          const stored = await rowsAfter(before);
          for (const s of [onX, onY]) {
            const got = seqs(s.events);
            expect(got).toEqual(stored.slice(0, got.length));
          }
          // Tenant beta sees its own sandbox's events only: nothing of X's (tenant default).
          expect(betaOnY.events.length).toBeGreaterThan(0);
          for (const e of betaOnY.events) expect(e.sandbox_id).toBe(betaId);

          // A client of X that stopped after its third event resumes on Y from there.
          const resumeFrom = onX.events[2]?.seq ?? 0;
          const lastSeen = onX.events.at(-1)?.seq ?? 0;
          const resumed = await openStream(yBase, "", { "last-event-id": String(resumeFrom) });
          try {
            await until("the resumed stream on Y to reach X's last event", () =>
              seqs(resumed.events).includes(lastSeen),
            );
            const wanted = stored.filter((s) => s > resumeFrom && s <= lastSeen);
            expect(seqs(resumed.events).slice(0, wanted.length)).toEqual(wanted);
          } finally {
            resumed.close();
          }
          for (const id of madeOnX) expect(await deleteSandbox(x(), id)).toBe("deleted");
          for (const id of made.slice(3, 5)) expect(await deleteSandbox(yBase, id)).toBe("deleted");
          const gone = await api(yBase, "DELETE", `/sandboxes/${betaId}`, undefined, betaAuth);
          expect(gone.status).toBe(200);
        } finally {
          for (const s of [onX, onY, betaOnY]) s.close();
        }
      } finally {
        await client.end();
      }
    });

    it("a secret made through Y is swapped in for a sandbox on X; requests X holds are decided through Y: approved goes out once, denied gets 403", async () => {
      const GH = `ghp_${randomBytes(12).toString("hex")}`;
      expect((await api(yBase, "PUT", "/secrets/gh", { value: GH, hosts: [NAMES.api] })).status).toBe(201);
      const id = await create(x(), {
        secrets: ["gh"],
        policy: {
          rules: [
            { host: NAMES.api, action: "ask" },
            { host: NAMES.other, action: "ask" },
          ],
        },
      });
      lab.made.push(id);
      const placeholder = (await runCommand(x().replace(/^http/, "ws"), id, { cmd: 'printf %s "$GH"' })).stdout;
      expect(placeholder).toMatch(/^bothy_ph_/);
      const ca = `${await readFile(join(lab.home, "secrets", "egress-ca.crt"), "utf8")}\n${lab.topo.caPem}`;
      const https = (host: string, extra: Partial<EgressCheck> = {}): EgressCheck => ({
        kind: "https",
        address: PUBLIC_HTTP,
        host,
        ...extra,
      });
      const probe = egressProbe(
        x(),
        id,
        {
          approved: https(NAMES.api, { headers: { authorization: `Bearer ${placeholder}` } }),
          denied: { kind: "http", address: PUBLIC_HTTP, host: NAMES.other },
        },
        ca,
        120_000,
      );
      // Both are held by X's gateway; Y lists and decides them.
      let pending: Array<{ approval_id: string; host: string }> = [];
      await until("both requests held on X to show as pending on Y", async () => {
        pending = (await api(yBase, "GET", `/approvals?state=pending&sandbox_id=${id}`)).json["approvals"] as Array<{
          approval_id: string;
          host: string;
        }>;
        return pending.length === 2;
      });
      const byHost = new Map(pending.map((p) => [p.host, p.approval_id]));
      const approvedId = byHost.get(NAMES.api) ?? "";
      expect((await api(yBase, "POST", `/approvals/${approvedId}/approve`, {})).status).toBe(200);
      expect(
        (await api(yBase, "POST", `/approvals/${byHost.get(NAMES.other)}/deny`, { reason: "not today" })).status,
      ).toBe(200);
      const r = await probe;
      expect(r["approved"]?.status, JSON.stringify(r)).toBe(200);
      // The upstream got the value sealed through Y (its hash says so); the sandbox saw only the placeholder.
      const sha = (s: string): string => createHash("sha256").update(s).digest("hex");
      expect(bodyOf(r["approved"])).toMatchObject({ sha256: { authorization: sha(`Bearer ${GH}`) } });
      expect(r["denied"]?.status, JSON.stringify(r)).toBe(403);
      // Once: one allowed request to the approved host in the sandbox's audit, read through Y (events
      // are written after the answer, so the denial's may land a moment after the probe ends).
      type AuditEvent = { type: string; data: Record<string, unknown> };
      let audit: AuditEvent[] = [];
      const steps = (host: string): unknown[] =>
        audit.filter((e) => e.data["host"] === host).map((e) => [e.type, e.data["outcome"]]);
      await until("both decisions in the sandbox's audit", async () => {
        audit = (await api(yBase, "GET", `/sandboxes/${id}/audit?type=egress.allowed,egress.denied`)).json[
          "events"
        ] as AuditEvent[];
        return steps(NAMES.api).length > 0 && steps(NAMES.other).length > 0;
      });
      expect(steps(NAMES.api)).toEqual([["egress.allowed", "approved"]]);
      expect(steps(NAMES.other)).toEqual([["egress.denied", "denied"]]);
      // A second decision, through the other node, finds it decided.
      expect((await api(x(), "POST", `/approvals/${approvedId}/deny`, {})).status).toBe(409);
      for (const logs of [lab.server.logs, y?.logs ?? []]) expect(JSON.stringify(logs)).not.toContain(GH);
      expect(await deleteSandbox(x(), id)).toBe("deleted");
    });

    it("a node started with another vault key refuses to start, saying what to do, and shows neither key", async () => {
      const home = await mkdtemp("/tmp/bothy-clusterpol-z-");
      const wrong = randomBytes(32);
      const wrongFile = join(keyDir, "wrong.key");
      await writeFile(wrongFile, wrong, { mode: 0o600 });
      try {
        const child = spawn(process.execPath, [BOTHY, "serve"], {
          env: {
            ...process.env,
            BOTHY_HOME: home,
            BOTHY_TEMPLATES_DIR: testTemplatesDir(),
            BOTHY_KERNEL_DIR: testKernelDir(),
            BOTHY_PORT: "0",
            BOTHY_POOL_SIZE: "0",
            BOTHY_NETWORK: "off",
            BOTHY_DRIVER: "gvisor",
            ...nodeEnv("node-z", tcpUrl),
            BOTHY_VAULT_KEY_FILE: wrongFile,
          },
          stdio: ["ignore", "pipe", "pipe"],
        });
        let output = "";
        child.stdout.on("data", (d: Buffer) => {
          output += d.toString();
          // A node that starts after all is stopped at once (and the checks below fail).
          if (output.includes('"event":"listening"')) child.kill("SIGTERM");
        });
        child.stderr.on("data", (d: Buffer) => (output += d.toString()));
        const code = await new Promise<number | null>((resolve) => child.once("close", resolve));
        expect(code, output).not.toBe(0);
        expect(output).toMatch(/is not the one this ledger's secrets are sealed with/);
        expect(output).toContain("BOTHY_VAULT_KEY_FILE");
        expect(output).not.toContain("listening");
        const right = await readFile(keyFile);
        for (const k of [wrong, right]) {
          expect(output).not.toContain(k.toString("hex"));
          expect(output).not.toContain(k.toString("base64"));
        }
      } finally {
        await rm(home, { recursive: true, force: true });
      }
    });
  },
);
