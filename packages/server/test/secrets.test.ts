/**
 * The secrets vault and the egress CA on a real `bothy serve` with networking on, inside the
 * network lab (helpers/net-topology.ts): write-only routes, a sandbox's placeholders in every
 * command's env (across a sleep and a server restart), the CA in every guest's trust store (gVisor,
 * and QEMU started warm from its template's snapshot), and the value nowhere: not in any answer,
 * the log, the events, any file of the server's home (ledger and WAL included), nor the guest's
 * file system or environment.
 */
import { randomBytes } from "node:crypto";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { api, createSandbox, deleteSandbox, runCommand, waitForState } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { homeFilesHolding } from "./helpers/host-state.ts";
import { EgressCa } from "../src/gateway/egress-ca.ts";
import { useNetLab } from "./helpers/net-lab.ts";

const root = process.getuid?.() === 0;
const drivers = testDrivers();
/** The secret's value, never sent whole in a command (commands are recorded): the guest rebuilds it from two halves. */
const VALUE = `vault-value-${randomBytes(12).toString("hex")}`;
const HALF = VALUE.length / 2;
const REBUILD = `V="$(printf '%s%s' '${VALUE.slice(0, HALF)}' '${VALUE.slice(HALF)}')"`;
/** Every file of the guest but /proc, /sys and /dev (grep's own command line is in /proc) that holds $V; then grep's status. */
const SEARCH_GUEST = `${REBUILD}; found=0; for d in /*; do case "$d" in /proc|/sys|/dev) ;; *) grep -rlF -- "$V" "$d" 2>/dev/null && found=1;; esac; done; echo "found=$found"`;
const PLACEHOLDER_RE = /^bothy_ph_[a-z2-7]{32}$/;

describe.skipIf(!root)("secrets vault and egress CA", () => {
  // Idle sleep soon, so a sandbox's sleep and wake are part of the test.
  const lab = useNetLab("secrets", () => ({ BOTHY_IDLE_TIMEOUT_S: "4", BOTHY_SWEEP_INTERVAL_S: "1" }));
  const { made } = lab;
  /** Every answer body the tests got, searched for the value at the end. */
  const answers: string[] = [];

  const call = async (method: string, path: string, body?: unknown, headers?: Record<string, string>) => {
    const r = await api(lab.base, method, path, body, headers);
    answers.push(JSON.stringify(r.json));
    return r;
  };
  const sh = async (id: string, cmd: string): Promise<{ code: number | undefined; out: string }> => {
    const r = await runCommand(lab.base.replace(/^http/, "ws"), id, { cmd });
    answers.push(r.stdout, r.stderr);
    return { code: r.exit?.exit_code ?? undefined, out: r.stdout + r.stderr };
  };

  it("keeps secrets write-only: no answer, refusal or listing shows the value", async () => {
    const body = {
      value: VALUE,
      hosts: ["api.github.com"],
      inject: { header: "Authorization", format: "Bearer {value}" },
    };
    const created = await call("PUT", "/secrets/github", body);
    expect(created.status).toBe(201);
    expect(created.json).toMatchObject({ name: "github", tenant: "default", hosts: ["api.github.com"] });
    expect(created.json).not.toHaveProperty("value");
    expect((await call("PUT", "/secrets/github", body)).status).toBe(200);
    expect((await call("PUT", "/secrets/spare", { value: `${VALUE}-spare`, hosts: ["*.example.com"] })).status).toBe(
      201,
    );
    expect((await call("GET", "/secrets")).json["secrets"]).toMatchObject([{ name: "github" }, { name: "spare" }]);
    expect((await call("GET", "/secrets/github")).json).toMatchObject({
      inject: { header: "Authorization", format: "Bearer {value}" },
    });

    // Bad bodies are described by where they are wrong, never by what they held.
    for (const bad of [
      { ...body, value: 12345 },
      { ...body, value: VALUE.repeat(3000) },
      { ...body, extra: VALUE },
      { value: VALUE },
      { value: VALUE, hosts: [`${VALUE} x`] },
      { ...body, inject: { header: "Authorization", format: VALUE } },
    ]) {
      const r = await call("PUT", "/secrets/github", bad);
      expect(r.status, JSON.stringify(r.json)).toBe(400);
      expect(r.json["code"]).toBe("invalid_request");
    }
    expect((await call("PUT", "/secrets/Bad-Name", body)).json["code"]).toBe("invalid_request");
    expect((await call("DELETE", "/secrets/Bad-Name")).json["code"]).toBe("secret_not_found");
    expect((await call("GET", "/secrets/nope")).status).toBe(404);
    expect((await call("GET", "/secrets?tenant=nobody")).json["code"]).toBe("tenant_not_found");

    const minted = await call("POST", "/keys", { name: "agent", scopes: ["sandboxes:read", "sandboxes:write"] });
    const agent = { authorization: `Bearer ${String(minted.json["key"])}` };
    expect((await call("GET", "/secrets", undefined, agent)).status).toBe(403);
    expect((await call("PUT", "/secrets/x", body, agent)).status).toBe(403);

    expect((await call("DELETE", "/secrets/spare")).json).toMatchObject({ name: "spare" });
    expect((await call("GET", "/secrets/spare")).json["code"]).toBe("secret_not_found");
  });

  it("refuses a create naming a secret the vault lacks, and makes nothing", async () => {
    const before = ((await call("GET", "/sandboxes")).json["sandboxes"] as unknown[]).length;
    const r = await call("POST", "/sandboxes", { template: "seed", secrets: ["github", "missing_one"] });
    expect(r.status).toBe(400);
    expect(r.json).toMatchObject({ code: "secret_unknown", secrets: ["missing_one"] });
    expect((await call("GET", "/sandboxes")).json["sandboxes"]).toHaveLength(before);
  });

  const gvisor = drivers.find((d) => d.name === "gvisor");
  it.skipIf(gvisor === undefined || gvisor.missing !== undefined)(
    "gives a gVisor sandbox the placeholder and the CA, never the value, across a sleep and a server restart",
    async () => {
      const caPem = await readFile(join(lab.home, "secrets", "egress-ca.crt"), "utf8");
      const id = await createSandbox(lab.base, { driver: "gvisor", secrets: ["github"] });
      made.push(id);
      const env = await sh(
        id,
        "echo $GITHUB; echo $SSL_CERT_FILE $NODE_EXTRA_CA_CERTS $REQUESTS_CA_BUNDLE $CURL_CA_BUNDLE",
      );
      const [placeholder, paths] = env.out.trim().split("\n");
      expect(placeholder).toMatch(PLACEHOLDER_RE);
      expect(paths).toBe(
        "/etc/bothy/ca-bundle.crt /etc/bothy/egress-ca.pem /etc/bothy/ca-bundle.crt /etc/bothy/ca-bundle.crt",
      );
      expect((await call("GET", `/sandboxes/${id}`)).json["policy"]).toMatchObject({ secrets: ["github"] });
      await expectTrusted(id, caPem);

      // The value is in no file of the guest and not in its environment.
      const fs = await sh(id, `${SEARCH_GUEST}; env | grep -cF -- "$V"`);
      expect(fs.out.trim().split("\n")).toEqual(["found=0", "0"]);

      // A sleep (gVisor: stopped on its kept disk) and a wake: same placeholder, CA again.
      expect(await waitForState(lab.base, id, "stopped", 120)).toBe("stopped");
      expect((await sh(id, "echo $GITHUB")).out.trim()).toBe(placeholder);
      await expectTrusted(id, caPem);

      // A server restart: the placeholders come from the ledger.
      await lab.restart("stop");
      expect((await sh(id, "echo $GITHUB")).out.trim()).toBe(placeholder);
      await expectTrusted(id, caPem);
      // A command's own env wins over the placeholder.
      expect((await sh(id, "GITHUB=mine sh -c 'echo $GITHUB'")).out.trim()).toBe("mine");
    },
    600_000,
  );

  /**
   * The CA is in the guest's files, and TLS in the guest trusts a leaf it signed: Node through
   * NODE_EXTRA_CA_CERTS, and through the bundle SSL_CERT_FILE names (what OpenSSL, curl and
   * Python read). The leaf and its key are the test's (made with the server's CA on the host).
   */
  async function expectTrusted(id: string, caPem: string): Promise<void> {
    const leaf = await (await EgressCa.open(lab.home)).leafFor("trust.bothy.test");
    const probe = String.raw`
const tls = require("tls"), fs = require("fs");
const { key, cert } = JSON.parse(fs.readFileSync("/tmp/leaf.json", "utf8"));
const server = tls.createServer({ key, cert }, (c) => c.end("ok"));
const attempt = (extra) => new Promise((resolve) => {
  const c = tls.connect({ host: "127.0.0.1", port: server.address().port, servername: "trust.bothy.test", ...extra });
  c.on("data", (d) => resolve(String(d)));
  c.on("error", (e) => resolve(e.code || e.message));
});
server.listen(0, "127.0.0.1", async () => {
  const viaNode = await attempt({});
  const viaBundle = await attempt({ ca: fs.readFileSync(process.env.SSL_CERT_FILE) });
  console.log("node=" + viaNode + " bundle=" + viaBundle);
  process.exit(0);
});`;
    const b64 = (text: string): string => Buffer.from(text).toString("base64");
    const r = await sh(
      id,
      [
        `echo ${b64(JSON.stringify(leaf))} | base64 -d > /tmp/leaf.json`,
        `echo ${b64(probe)} | base64 -d > /tmp/probe.js`,
        "node /tmp/probe.js",
        "cat /etc/bothy/egress-ca.pem",
        `grep -qF "$(sed -n 5p /etc/bothy/egress-ca.pem)" /etc/ssl/certs/ca-certificates.crt && echo system-has-it`,
      ].join(" && "),
    );
    const [result, ...pem] = r.out.split("\n");
    expect(result, r.out).toBe("node=ok bundle=ok");
    expect(pem.join("\n")).toBe(`${caPem}system-has-it\n`);
    // Only the certificate: the CA's key never enters a guest.
    expect((await sh(id, "grep -rl 'PRIVATE KEY' /etc/bothy /etc/ssl/certs; echo $?")).out.trim()).toBe("1");
  }

  describe.each(drivers.filter((d) => d.name === "qemu"))("$name", (d) => {
    it.skipIf(d.missing !== undefined)(
      driverTitle(d, "a QEMU sandbox started warm from its template's snapshot trusts the CA and has its placeholder"),
      async () => {
        const caPem = await readFile(join(lab.home, "secrets", "egress-ca.crt"), "utf8");
        // The first makes the template's snapshot; both are restored from it.
        const plain = await createSandbox(lab.base, { driver: "qemu" });
        made.push(plain);
        const withSecret = await createSandbox(lab.base, { driver: "qemu", secrets: ["github"] });
        made.push(withSecret);
        const started = lab.server.logs.filter((l) => l["event"] === "sandbox_created" && l["driver"] === "qemu");
        expect(lab.server.logs.some((l) => l["event"] === "qemu_base_snapshot")).toBe(true);
        expect(started.length).toBeGreaterThanOrEqual(2);
        // Restored from the snapshot (warm start is on by default), then the CA installed: the boot's last step.
        for (const l of started) expect(Object.keys(l["steps"] as object)).toContain("trust");
        for (const id of [plain, withSecret]) await expectTrusted(id, caPem);
        expect((await sh(withSecret, "echo $GITHUB")).out.trim()).toMatch(PLACEHOLDER_RE);
        expect((await sh(plain, 'echo "[$GITHUB]" $SSL_CERT_FILE')).out.trim()).toBe("[] /etc/bothy/ca-bundle.crt");
        const fs = await sh(withSecret, SEARCH_GUEST);
        expect(fs.out.trim()).toBe("found=0");
        for (const id of [plain, withSecret]) await deleteSandbox(lab.base, id);
      },
      900_000,
    );
  });

  it("leaves the value in no file of the home, the log, the events or any answer", async () => {
    for (const id of made.splice(0)) await deleteSandbox(lab.base, id).catch(() => undefined);
    // The events are in the ledger, searched with the rest of the home: while the server runs
    // (its WAL holds the latest writes), and after it stopped.
    const live = await homeFilesHolding(lab.home, [VALUE]);
    expect(live.read.some((p) => p.endsWith("ledger.sqlite-wal"))).toBe(true);
    expect(live.hits).toEqual([]);
    await lab.server.stop();
    const { read, hits } = await homeFilesHolding(lab.home, [VALUE]);
    expect(read.some((p) => p.endsWith("ledger.sqlite"))).toBe(true);
    expect(hits).toEqual([]);
    expect(JSON.stringify(lab.server.logs)).not.toContain(VALUE);
    expect(answers.join("\n")).not.toContain(VALUE);
    // Its sealed form is there (the secret exists), under the key in secrets/.
    expect(read.some((p) => p.endsWith(join("secrets", "vault.key")))).toBe(true);
    await lab.start();
  }, 300_000);
});
