/**
 * `allow_out` from the side of a tenant trying to open what it must not: another tenant's sandbox,
 * the sandbox pool, the host, cloud metadata (a host in the lab's `lan` namespace answers on
 * 169.254.169.254). The real `bothy serve` runs in the lab (helpers/net-topology.ts) with
 * BOTHY_ALLOW_OUT_PERMIT naming the lab's `lan` block only. Nothing here leaves this machine.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { renderSandboxAdd } from "../src/network/nft-ruleset.ts";
import { hostTag, ifaceName, nftTable } from "../src/util/host-names.ts";
import { api, runCommand } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { useNetLab } from "./helpers/net-lab.ts";
import { ipv4Of, probe, type Outcome } from "./helpers/net-probe.ts";
import { HOST_LAN_ADDR, HOST_PORT, PRIVATE_HOST, PRIVATE_HOST_2, sh } from "./helpers/net-topology.ts";

const root = process.getuid?.() === 0;
const drivers = testDrivers();
const LAN_BLOCK = "10.200.0.0/24";
const METADATA = "169.254.169.254";
const POOL = "10.179.0.0/16";
const DEFAULT_SCOPES = ["sandboxes:read", "sandboxes:write", "files", "corpus", "conversations"];

function refused(o: Outcome | undefined, what: string): void {
  expect(o?.ok, `${what} should be refused: ${JSON.stringify(o)}`).toBe(false);
  expect(o?.err, `${what} should be refused by the filter, not time out: ${JSON.stringify(o)}`).not.toBe("timeout");
}

describe.skipIf(!root)("allow_out cannot open other sandboxes, the host or metadata", () => {
  const lab = useNetLab("allowout", () => ({ BOTHY_ALLOW_OUT_PERMIT: LAN_BLOCK }));
  const { topo, made } = lab;
  /** Tenant a's key as any tenant gets it, tenant a's key with `network:private`, tenant b's. */
  const keys = { narrow: "", wide: "", b: "" };

  const as = (key: string) => ({ authorization: `Bearer ${key}` });
  const mint = async (body: Record<string, unknown>): Promise<string> => {
    const res = await api(lab.base, "POST", "/keys", body);
    expect(res.status, JSON.stringify(res.json)).toBe(201);
    return String(res.json["key"]);
  };

  beforeAll(async () => {
    // The metadata stand-in: the `lan` fixture answers on every local address, 169.254.169.254 too.
    await sh("ip", ["-n", topo.lan, "addr", "add", `${METADATA}/32`, "dev", "lo"]);
    await topo.inHost("ip", ["route", "add", `${METADATA}/32`, "via", PRIVATE_HOST]);
    for (const tenant of ["a", "b"]) expect((await api(lab.base, "POST", "/tenants", { tenant })).status).toBe(201);
    keys.narrow = await mint({ tenant: "a", name: "narrow" });
    keys.wide = await mint({ tenant: "a", name: "wide", scopes: [...DEFAULT_SCOPES, "network:private"] });
    keys.b = await mint({ tenant: "b", name: "b" });
  });

  it("lets only a key that holds network:private mint it", async () => {
    const manager = await mint({ tenant: "a", name: "manager", scopes: ["keys:manage", "sandboxes:write"] });
    const res = await api(lab.base, "POST", "/keys", { scopes: ["network:private"] }, as(manager));
    expect([res.status, res.json["code"], res.json["scope"]]).toEqual([403, "scope_missing", "network:private"]);
  });

  describe.each(drivers)("$name", (d) => {
    it.skipIf(d.missing !== undefined)(
      driverTitle(
        d,
        "tenant a's allow_out naming tenant b's sandbox, the pool, the host or metadata is refused or never reaches it",
      ),
      async () => {
        const create = async (key: string, body: Record<string, unknown>, driver = d.name) => {
          const res = await api(
            lab.base,
            "POST",
            "/sandboxes",
            { template: "seed", driver, memory_mib: 512, ...body },
            as(key),
          );
          if (res.status === 201) made.push(String(res.json["sandbox_id"]));
          return res;
        };
        // Tenant b's sandbox, with a server on a port (a code interpreter would be one). Only a's
        // own chain stands between a and b, so b is the cheaper gVisor sandbox where there is one:
        // a VM boot under emulation would add nothing.
        const b = await create(keys.b, {}, drivers.some((x) => x.name === "gvisor") ? "gvisor" : d.name);
        expect(b.status, JSON.stringify(b.json)).toBe(201);
        const bId = String(b.json["sandbox_id"]);
        await runCommand(
          lab.base.replace(/^http/, "ws"),
          bId,
          { cmd: "node -e \"require('net').createServer((s) => s.end('b')).listen(8080)\"", background: true },
          { onEvent: (ev, ws) => ev.type === "started" && ws.close() },
        );
        let self = await probe(lab.base, bId, { own: { tcp: ["127.0.0.1", 8080] } });
        for (let i = 0; i < 20 && !self.results["own"]?.ok; i++)
          self = await probe(lab.base, bId, { own: { tcp: ["127.0.0.1", 8080] } });
        expect(self.results["own"]?.ok).toBe(true);
        const bAddr = ipv4Of(self);

        // A key as every tenant gets it: nothing private, nothing of the pool.
        const attempts: Array<[string, string[], string, string | undefined]> = [
          [keys.narrow, [bAddr], "allow_out_not_permitted", undefined],
          [keys.narrow, [POOL], "allow_out_not_permitted", undefined],
          [keys.narrow, [METADATA], "scope_missing", "network:private"],
          [keys.narrow, [PRIVATE_HOST], "scope_missing", "network:private"],
          // With the scope: still never the pool or loopback, and nothing outside the permit.
          [keys.wide, [bAddr], "allow_out_not_permitted", undefined],
          [keys.wide, ["10.0.0.0/8"], "allow_out_not_permitted", undefined],
          [keys.wide, ["127.0.0.1"], "allow_out_not_permitted", undefined],
          [keys.wide, [METADATA], "allow_out_not_permitted", undefined],
          [keys.wide, ["169.254.0.0/16"], "allow_out_not_permitted", undefined],
        ];
        for (const [key, allowOut, code, scope] of attempts) {
          const res = await create(key, { internet: false, allow_out: allowOut });
          const what = `allow_out ${allowOut.join(",")} with the ${key === keys.wide ? "wide" : "narrow"} key`;
          expect(res.status, `${what}: ${JSON.stringify(res.json)}`).toBe(403);
          expect(res.type).toContain("application/problem+json");
          expect(res.json, what).toMatchObject({ code, ...(scope ? { scope } : {}) });
          expect(String(res.json["detail"]), what).toMatch(
            /allow_out .* (Remove the entry|Name only public|Ask the operator)/,
          );
        }

        // Inside the permit, with the scope: the named block opens, the host on it stays shut, and
        // tenant b and metadata stay out of reach.
        const a = await create(keys.wide, { internet: false, allow_out: [LAN_BLOCK] });
        expect(a.status, JSON.stringify(a.json)).toBe(201);
        const aId = String(a.json["sandbox_id"]);
        const p = await probe(lab.base, aId, {
          lan: { get: [PRIVATE_HOST, 80] },
          lan2: { tcp: [PRIVATE_HOST_2, 80] },
          host: { tcp: [HOST_LAN_ADDR, HOST_PORT] },
          b: { tcp: [bAddr, 8080] },
          metadata: { tcp: [METADATA, 80] },
        });
        expect(p.results["lan"], JSON.stringify(p.results["lan"])).toMatchObject({ ok: true, body: "OK lan\n" });
        expect(p.results["lan2"]?.ok).toBe(true);
        for (const k of ["host", "b", "metadata"]) refused(p.results[k], k);

        // A policy naming tenant b's address, as one stored before create judged allow_out: the
        // ruleset the server renders for it puts the refusal of the pool before its accept. It is
        // applied to a's own chain; metadata opening shows the new chain is the one in force.
        const aAddr = ipv4Of(p);
        const tag = hostTag(lab.home);
        const script = renderSandboxAdd({
          table: nftTable(tag),
          sandboxId: aId,
          iface: ifaceName(tag, aId, d.name === "qemu" ? "tap" : "veth"),
          guest: aAddr,
          policy: { internet: false, allowOut: [`${bAddr}/32`, POOL, `${METADATA}/32`], denyOut: [] },
        });
        await sh("nsenter", [`--net=${topo.netnsPath}`, "--", "nft", "-f", "-"], script);
        // Several connects (each from its own port): not one may get through.
        const q = await probe(lab.base, aId, {
          b1: { tcp: [bAddr, 8080] },
          b2: { tcp: [bAddr, 8080] },
          b3: { get: [bAddr, 8080] },
          metadata: { get: [METADATA, 80] },
        });
        expect(q.results["metadata"], JSON.stringify(q.results["metadata"])).toMatchObject({ ok: true });
        for (const k of ["b1", "b2", "b3"])
          refused(q.results[k], `tenant b's sandbox under a stored allow_out naming it (${k})`);
      },
      600_000,
    );
  });
});
