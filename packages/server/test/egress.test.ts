/**
 * The egress gateway end to end in the network lab (helpers/net-topology.ts): the real `bothy
 * serve` in its namespace, sandboxes under host policies whose TCP 80/443 nft redirects to the
 * gateway, and a simulated internet with an HTTP(S) echo server (its own test CA) and a resolver
 * that knows the test names. Nothing here leaves the machine.
 */
import { createHash, randomBytes } from "node:crypto";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { Sandbox } from "@bothy/sdk";
import { api, createSandbox, deleteSandbox, runCommand } from "./helpers/client.ts";
import { homeFilesHolding, SANDBOX_TREES } from "./helpers/host-state.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { bodyOf, egressProbe, startEgressProbe, type EgressCheck } from "./helpers/egress-probe.ts";
import { useNetLab } from "./helpers/net-lab.ts";
import { NAMES, PRIVATE_HOST, PUBLIC_HTTP } from "./helpers/net-topology.ts";

const root = process.getuid?.() === 0;
const drivers = testDrivers();
const driver = (name: "gvisor" | "qemu") =>
  drivers.find((d) => d.name === name) ?? { name, missing: "BOTHY_TEST_DRIVERS to name it" };
const gvisor = driver("gvisor");
const qemu = driver("qemu");

const http = (host: string, extra: Partial<EgressCheck> = {}): EgressCheck => ({
  kind: "http",
  address: PUBLIC_HTTP,
  host,
  ...extra,
});
const https = (host: string, extra: Partial<EgressCheck> = {}): EgressCheck => ({
  kind: "https",
  address: PUBLIC_HTTP,
  host,
  ...extra,
});

/** The sandbox's own rules in these tests: index 0 denies `other`, then the allowed names. */
const POLICY = {
  rules: [{ host: NAMES.other, action: "deny" as const }],
  allow_hosts: [NAMES.api, "*.svc.bothy.test", NAMES.private],
};

describe.skipIf(!root)("egress gateway", () => {
  const lab = useNetLab("egress", (topo) => ({ NODE_EXTRA_CA_CERTS: topo.caFile }));
  const { topo, made } = lab;

  it.skipIf(gvisor.missing !== undefined)(
    driverTitle(gvisor, "host rules, tenant default first, HTTPS by SNI, private names refused, audit, restart"),
    async () => {
      // Made before the tenant has a default: it has no policy, so it is not redirected at all.
      const plain = await createSandbox(lab.base, { driver: "gvisor" });
      made.push(plain);
      expect((await api(lab.base, "PUT", "/policy", { deny_hosts: ["b.svc.bothy.test"] })).status).toBe(200);
      const created = await api(lab.base, "POST", "/sandboxes", { template: "seed", driver: "gvisor", policy: POLICY });
      expect(created.status, JSON.stringify(created.json)).toBe(201);
      const id = String(created.json["sandbox_id"]);
      made.push(id);
      expect((created.json["policy"] as { rules: unknown[] }).rules).toEqual([
        { host: "b.svc.bothy.test", action: "deny", source: "tenant", index: 0 },
        { host: NAMES.other, action: "deny", source: "sandbox", index: 0 },
        { host: NAMES.api, action: "allow", source: "sandbox", index: 1 },
        { host: "*.svc.bothy.test", action: "allow", source: "sandbox", index: 2 },
        { host: NAMES.private, action: "allow", source: "sandbox", index: 3 },
      ]);

      const r = await egressProbe(
        lab.base,
        id,
        {
          api: http(NAMES.api),
          pattern: http(NAMES.svcSub),
          apex: http(NAMES.svcApex),
          denied: http(NAMES.other),
          tenant: http("b.svc.bothy.test"),
          privateName: http(NAMES.private),
          literal: http(PUBLIC_HTTP),
          placeholder: http(NAMES.api, { headers: { authorization: "Bearer bothy_ph_0123456789abcdef" } }),
          httpsApi: https(NAMES.api),
          httpsDenied: https(NAMES.other),
          sniRules: https(NAMES.api, { host: NAMES.other, servername: NAMES.api }),
          sniDenies: https(NAMES.other, { host: NAMES.api, servername: NAMES.other }),
          upgrade: { kind: "upgrade", address: PUBLIC_HTTP, host: NAMES.api },
          keepalive: { kind: "keepalive", address: PUBLIC_HTTP, host: NAMES.api, hosts: [NAMES.api, NAMES.other] },
        },
        topo.caPem,
      );
      const show = (k: string): string => `${k}: ${JSON.stringify(r[k])}`;
      expect(r["api"]?.status, show("api")).toBe(200);
      expect(bodyOf(r["api"])).toMatchObject({ label: "wan", host: NAMES.api, url: "/echo" });
      expect(r["pattern"]?.status, show("pattern")).toBe(200);
      // `*.svc.bothy.test` does not match its apex: the default (deny, implied by allow_hosts) decides.
      expect(r["apex"]?.status, show("apex")).toBe(403);
      expect(bodyOf(r["apex"])).toMatchObject({ code: "egress_denied", rule: "default", host: NAMES.svcApex });
      expect(r["denied"]?.status, show("denied")).toBe(403);
      expect(bodyOf(r["denied"])).toMatchObject({
        code: "egress_denied",
        rule: "sandbox#0",
        how_to_get_access: expect.stringContaining("PUT /policy"),
      });
      expect(bodyOf(r["tenant"]), show("tenant")).toMatchObject({ code: "egress_denied", rule: "tenant#0" });
      // Allowed by name, but it resolves to a private address: refused, naming it.
      expect(r["privateName"]?.status, show("privateName")).toBe(403);
      expect(bodyOf(r["privateName"])).toMatchObject({ code: "egress_denied", rule: "address" });
      expect(String(bodyOf(r["privateName"])["detail"])).toContain(PRIVATE_HOST);
      // An address as the host is judged as a host string: no rule names it, the default denies.
      expect(bodyOf(r["literal"]), show("literal")).toMatchObject({ code: "egress_denied", rule: "default" });
      expect(bodyOf(r["placeholder"]), show("placeholder")).toMatchObject({
        code: "egress_denied",
        rule: "placeholder",
      });
      expect(r["httpsApi"]?.status, show("httpsApi")).toBe(200);
      expect(bodyOf(r["httpsApi"])).toMatchObject({ sni: NAMES.api, host: NAMES.api });
      expect(r["httpsDenied"]?.err, show("httpsDenied")).toMatch(/alert access denied/i);
      // The SNI is what HTTPS is judged by, whatever Host says inside.
      expect(r["sniRules"]?.status, show("sniRules")).toBe(200);
      expect(bodyOf(r["sniRules"])).toMatchObject({ sni: NAMES.api, host: NAMES.other });
      expect(r["sniDenies"]?.err, show("sniDenies")).toMatch(/alert access denied/i);
      expect(r["upgrade"], show("upgrade")).toMatchObject({ status: 101, body: "ping-through-the-gateway" });
      // Each request on a keep-alive connection is judged on its own.
      const steps = r["keepalive"]?.steps ?? [];
      expect(
        steps.map((s) => s.status),
        show("keepalive"),
      ).toEqual([200, 403]);
      expect(steps[0]?.port).toBe(steps[1]?.port);

      // The sandbox without a policy goes straight out: a name the gateway would refuse reaches wan.
      const direct = await egressProbe(lab.base, plain, { privateName: http(NAMES.private) }, topo.caPem);
      expect(bodyOf(direct["privateName"]), JSON.stringify(direct)).toMatchObject({ label: "wan" });
      expect((await api(lab.base, "GET", `/sandboxes/${plain}/audit`)).json["events"]).toEqual([]);

      // The audit: every decision, from the ledger, per sandbox and type.
      const denied = (await api(lab.base, "GET", `/sandboxes/${id}/audit?type=egress.denied`)).json["events"] as Array<{
        type: string;
        data: Record<string, unknown>;
      }>;
      expect(denied.every((e) => e.type === "egress.denied")).toBe(true);
      const viaSdk = await (await Sandbox.connect(id, { baseUrl: lab.base })).audit({ types: ["egress.denied"] });
      expect(viaSdk.map((e) => e.seq)).toEqual(denied.map((e) => (e as unknown as { seq: number }).seq));
      expect(denied.map((e) => e.data)).toEqual(
        expect.arrayContaining([
          expect.objectContaining({ host: NAMES.other, rule: "sandbox#0", method: "GET", path: "/echo" }),
          expect.objectContaining({ host: NAMES.other, rule: "sandbox#0", method: null, path: null }),
          expect.objectContaining({ host: NAMES.private, rule: "address", outcome: "refused" }),
          expect.objectContaining({ host: "b.svc.bothy.test", rule: "tenant#0" }),
        ]),
      );
      const allowed = (await api(lab.base, "GET", `/sandboxes/${id}/audit?type=egress.allowed`)).json[
        "events"
      ] as Array<{
        data: Record<string, unknown>;
      }>;
      expect(allowed.map((e) => e.data)).toEqual(
        expect.arrayContaining([
          expect.objectContaining({ host: NAMES.api, rule: "sandbox#1", action: "allow", address: PUBLIC_HTTP }),
        ]),
      );
      expect((await api(lab.base, "GET", `/sandboxes/${id}/audit?type=sandbox.created`)).status).toBe(400);
      const other = await api(lab.base, "GET", `/sandboxes/sbx_aaaaaaaaaaaaaaaaaaaa/audit`);
      expect(other.json["code"]).toBe("sandbox_not_found");

      // The server dies: its successor takes the sandbox over with its redirect, and its rules hold.
      await lab.restart("kill");
      const after = await egressProbe(lab.base, id, { api: http(NAMES.api), denied: https(NAMES.other) }, topo.caPem);
      expect(after["api"]?.status, JSON.stringify(after)).toBe(200);
      expect(after["denied"]?.err, JSON.stringify(after)).toMatch(/alert access denied/i);

      // A clean stop stops it; woken again, it is plumbed anew, redirect included.
      await lab.restart("stop");
      const state = (await api(lab.base, "GET", `/sandboxes/${id}`)).json["state"];
      if (state !== "running") expect((await api(lab.base, "POST", `/sandboxes/${id}/resume`)).status).toBe(200);
      const woken = await egressProbe(lab.base, id, { api: http(NAMES.api), denied: http(NAMES.other) }, topo.caPem);
      expect(woken["api"]?.status, JSON.stringify(woken)).toBe(200);
      expect(bodyOf(woken["denied"]), JSON.stringify(woken)).toMatchObject({ rule: "sandbox#0" });

      expect((await api(lab.base, "DELETE", "/policy")).status).toBe(200);
      for (const s of [id, plain]) expect(await deleteSandbox(lab.base, s)).toBe("deleted");
      const left = await topo.bothyObjects(undefined);
      expect(left.chains).toEqual([]);
      expect(left.mapElements).toBe(0);
    },
    600_000,
  );

  it.skipIf(gvisor.missing !== undefined)(
    driverTitle(
      gvisor,
      "an ask rule holds the request until a person decides: approved goes out once, denied HTTPS gets the alert",
    ),
    async () => {
      const id = await createSandbox(lab.base, {
        driver: "gvisor",
        policy: {
          rules: [
            { host: NAMES.api, action: "ask" },
            { host: NAMES.other, action: "ask" },
          ],
        },
      });
      made.push(id);
      const probe = egressProbe(
        lab.base,
        id,
        {
          approved: http(NAMES.api, { method: "POST", body: "deploy please" }),
          denied: https(NAMES.other),
        },
        topo.caPem,
        120_000,
      );
      let pending: Array<{ approval_id: string; host: string; method: string | null; excerpt: string }> = [];
      while (pending.length < 2) {
        const listed = await api(lab.base, "GET", `/approvals?state=pending&sandbox_id=${id}`);
        pending = listed.json["approvals"] as typeof pending;
        if (pending.length < 2) await new Promise((r) => setTimeout(r, 200));
      }
      const byHost = new Map(pending.map((p) => [p.host, p]));
      expect(byHost.get(NAMES.api)).toMatchObject({ method: "POST", excerpt: "deploy please" });
      // Passed-through HTTPS is held before dialing: its method and path are not seen.
      expect(byHost.get(NAMES.other)).toMatchObject({ method: null });
      const approve = await api(lab.base, "POST", `/approvals/${byHost.get(NAMES.api)!.approval_id}/approve`, {});
      expect(approve.status, JSON.stringify(approve.json)).toBe(200);
      const deny = await api(lab.base, "POST", `/approvals/${byHost.get(NAMES.other)!.approval_id}/deny`, {
        reason: "not today",
      });
      expect(deny.status, JSON.stringify(deny.json)).toBe(200);
      const r = await probe;
      expect(r["approved"]?.status, JSON.stringify(r)).toBe(200);
      expect(bodyOf(r["approved"])).toMatchObject({ method: "POST", body: "deploy please" });
      expect(r["denied"]?.err, JSON.stringify(r)).toMatch(/alert access denied/i);
      const audit = (
        await api(lab.base, "GET", `/sandboxes/${id}/audit?type=egress.allowed,egress.asked,egress.denied`)
      ).json["events"] as Array<{ type: string; data: Record<string, unknown> }>;
      const apiSteps = audit.filter((e) => e.data["host"] === NAMES.api).map((e) => [e.type, e.data["outcome"]]);
      expect(apiSteps).toEqual([
        ["egress.asked", "pending"],
        ["egress.allowed", "approved"],
      ]);
      expect(audit.filter((e) => e.data["host"] === NAMES.other).map((e) => [e.type, e.data["outcome"]])).toEqual([
        ["egress.asked", "pending"],
        ["egress.denied", "denied"],
      ]);
      expect(await deleteSandbox(lab.base, id)).toBe("deleted");
    },
    600_000,
  );

  it.skipIf(gvisor.missing !== undefined)(
    driverTitle(gvisor, "a request held when the server is killed is cancelled by the next start and never goes out"),
    async () => {
      const id = await createSandbox(lab.base, {
        driver: "gvisor",
        policy: { rules: [{ host: NAMES.api, action: "ask" }] },
      });
      made.push(id);
      const path = `/echo/held-${randomBytes(4).toString("hex")}`;
      const probe = await startEgressProbe(
        lab.base,
        id,
        { held: http(NAMES.api, { method: "POST", path, body: "x" }) },
        topo.caPem,
        120_000,
      );
      let pending: Array<{ approval_id: string }> = [];
      while (pending.length === 0) {
        pending = (await api(lab.base, "GET", `/approvals?state=pending&sandbox_id=${id}`)).json["approvals"] as Array<{
          approval_id: string;
        }>;
        if (pending.length === 0) await new Promise((r) => setTimeout(r, 200));
      }
      const approvalId = pending[0]!.approval_id;
      await lab.restart("kill");
      // The next start cancels what the killed server held; a late approval finds nothing to release.
      expect((await api(lab.base, "GET", `/approvals/${approvalId}`)).json).toMatchObject({ state: "cancelled" });
      expect((await api(lab.base, "POST", `/approvals/${approvalId}/approve`, {})).status).toBe(409);
      // The sandbox's client lost its connection with the server; the request never reached wan.
      let out = await probe.read(lab.base);
      for (let i = 0; i < 300 && out === undefined; i++) {
        await new Promise((r) => setTimeout(r, 200));
        out = await probe.read(lab.base);
      }
      expect(out?.["held"]?.ok, JSON.stringify(out)).toBe(false);
      const allowed = (await api(lab.base, "GET", `/sandboxes/${id}/audit?type=egress.allowed`)).json[
        "events"
      ] as Array<{
        data: Record<string, unknown>;
      }>;
      expect(allowed.filter((e) => e.data["path"] === path)).toEqual([]);
      expect(await deleteSandbox(lab.base, id)).toBe("deleted");
    },
    600_000,
  );

  it.skipIf(gvisor.missing !== undefined)(
    driverTitle(gvisor, "secrets: swapped in for the bound host only, refused elsewhere, scrubbed from answers"),
    async () => {
      const GH = `ghp_${randomBytes(12).toString("hex")}`;
      const TOK = `tok-${randomBytes(12).toString("hex")}`;
      expect((await api(lab.base, "PUT", "/secrets/gh", { value: GH, hosts: [NAMES.api] })).status).toBe(201);
      const tok = { value: TOK, hosts: ["*.svc.bothy.test"], inject: { header: "X-Token", format: "{value}" } };
      expect((await api(lab.base, "PUT", "/secrets/tok", tok)).status).toBe(201);
      const id = await createSandbox(lab.base, { driver: "gvisor", secrets: ["gh", "tok"] });
      made.push(id);
      const env = await runCommand(lab.base.replace(/^http/, "ws"), id, { cmd: 'printf "%s %s" "$GH" "$TOK"' });
      const [ghPh, tokPh] = env.stdout.split(" ");
      expect(ghPh).toMatch(/^bothy_ph_/);
      expect(tokPh).toMatch(/^bothy_ph_/);
      // HTTPS of a sandbox with secrets is terminated with a leaf of bothy's CA, which the guest trusts.
      const ca = `${await readFile(join(lab.home, "secrets", "egress-ca.crt"), "utf8")}\n${topo.caPem}`;
      const bearer = { authorization: `Bearer ${ghPh}` };
      const r = await egressProbe(
        lab.base,
        id,
        {
          bound: https(NAMES.api, { headers: bearer }),
          unbound: https(NAMES.other, { headers: bearer }),
          injected: https(NAMES.svcSub),
          clear: http(NAMES.api, { headers: bearer }),
        },
        ca,
      );
      const sha = (s: string): string => createHash("sha256").update(s).digest("hex");
      expect(r["bound"]?.status, JSON.stringify(r)).toBe(200);
      // The upstream got the value (its hash says so); the sandbox sees only the placeholder.
      expect(bodyOf(r["bound"])).toMatchObject({
        authorization: `Bearer ${ghPh}`,
        sha256: { authorization: sha(`Bearer ${GH}`), "x-token": null },
      });
      expect(bodyOf(r["injected"])).toMatchObject({ x_token: tokPh, sha256: { "x-token": sha(TOK) } });
      expect(r["unbound"]?.status, JSON.stringify(r)).toBe(403);
      expect(bodyOf(r["unbound"])).toMatchObject({ code: "secret_refused" });
      expect(bodyOf(r["clear"])).toMatchObject({ code: "egress_denied", rule: "placeholder" });
      const audit = (await api(lab.base, "GET", `/sandboxes/${id}/audit?type=secret.injected,secret.refused`)).json[
        "events"
      ] as Array<{ type: string; data: Record<string, unknown> }>;
      expect(audit.map((e) => [e.type, e.data["secret"], e.data["host"]])).toEqual(
        expect.arrayContaining([
          ["secret.injected", "gh", NAMES.api],
          ["secret.injected", "tok", NAMES.svcSub],
          ["secret.refused", "gh", NAMES.other],
        ]),
      );
      for (const value of [GH, TOK]) {
        expect(JSON.stringify(audit)).not.toContain(value);
        expect(JSON.stringify(r)).not.toContain(value);
        expect(JSON.stringify(lab.server.logs)).not.toContain(value);
      }
      const { read, hits } = await homeFilesHolding(lab.home, [GH, TOK], SANDBOX_TREES);
      expect(read.some((f) => f.endsWith("ledger.sqlite-wal"))).toBe(true);
      expect(hits).toEqual([]);
      expect(await deleteSandbox(lab.base, id)).toBe("deleted");
    },
    600_000,
  );

  it.skipIf(qemu.missing !== undefined)(
    driverTitle(qemu, "a VM's HTTP and HTTPS pass the gateway, its secret swapped in"),
    async () => {
      const VALUE = `vm_${randomBytes(12).toString("hex")}`;
      expect((await api(lab.base, "PUT", "/secrets/vmkey", { value: VALUE, hosts: [NAMES.api] })).status).toBe(201);
      const id = await createSandbox(lab.base, { driver: "qemu", policy: POLICY, secrets: ["vmkey"] });
      made.push(id);
      const env = await runCommand(lab.base.replace(/^http/, "ws"), id, { cmd: 'printf %s "$VMKEY"' });
      const bearer = { authorization: `Bearer ${env.stdout}` };
      const ca = `${await readFile(join(lab.home, "secrets", "egress-ca.crt"), "utf8")}\n${topo.caPem}`;
      const r = await egressProbe(
        lab.base,
        id,
        {
          api: http(NAMES.api),
          denied: http(NAMES.other),
          httpsApi: https(NAMES.api, { headers: bearer }),
          httpsDenied: https(NAMES.other),
        },
        ca,
        30_000,
      );
      expect(r["api"]?.status, JSON.stringify(r)).toBe(200);
      expect(bodyOf(r["denied"])).toMatchObject({ code: "egress_denied", rule: "sandbox#0" });
      expect(r["httpsApi"]?.status, JSON.stringify(r)).toBe(200);
      expect(bodyOf(r["httpsApi"])).toMatchObject({
        authorization: bearer.authorization,
        sha256: { authorization: createHash("sha256").update(`Bearer ${VALUE}`).digest("hex") },
      });
      // A sandbox with secrets has its HTTPS terminated, so a denial is answered inside TLS, naming the rule.
      expect(r["httpsDenied"]?.status, JSON.stringify(r)).toBe(403);
      expect(bodyOf(r["httpsDenied"])).toMatchObject({ code: "egress_denied", rule: "sandbox#0" });
      expect(await deleteSandbox(lab.base, id)).toBe("deleted");
      const left = await topo.bothyObjects(undefined);
      expect(left.chains).toEqual([]);
      expect(left.mapElements).toBe(0);
    },
    600_000,
  );
});
