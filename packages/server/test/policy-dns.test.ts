/**
 * A closed sandbox's DNS, from inside it: with `internet: false` and `allow_hosts`, the names its
 * policy permits resolve (bothy's resolver answers its UDP 53, whichever resolver it names) and
 * other names are refused there, never answered by the internet's resolver. In the network lab
 * (helpers/net-topology.ts); nothing leaves this machine.
 */
import { describe, expect, it } from "vitest";
import { api } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { useNetLab } from "./helpers/net-lab.ts";
import { probe } from "./helpers/net-probe.ts";
import { NAMES, PUBLIC_DNS, PUBLIC_HTTP, TEST_NAME } from "./helpers/net-topology.ts";

const root = process.getuid?.() === 0;
const drivers = testDrivers();

describe.skipIf(!root)("DNS by the policy", () => {
  const lab = useNetLab("dns");
  const { made } = lab;

  describe.each(drivers)("$name", (d) => {
    it.skipIf(d.missing !== undefined)(
      driverTitle(d, "internet:false resolves the names allow_hosts permits and no other"),
      async () => {
        const created = await api(lab.base, "POST", "/sandboxes", {
          template: "seed",
          driver: d.name,
          memory_mib: 512,
          internet: false,
          policy: { allow_hosts: [NAMES.api] },
        });
        expect(created.status, JSON.stringify(created.json)).toBe(201);
        const id = String(created.json["sandbox_id"]);
        made.push(id);
        // The system resolver (resolv.conf names BOTHY_DNS), then a page by that name through the gateway.
        const p = await probe(lab.base, id, { permitted: { lookup: NAMES.api }, web: { get: [NAMES.api, 80] } });
        expect(p.results["permitted"], JSON.stringify(p.results)).toMatchObject({ ok: true, addrs: [PUBLIC_HTTP] });
        expect(p.results["web"], JSON.stringify(p.results["web"])).toMatchObject({ ok: true, body: "OK wan\n" });
        // Queries straight to the internet's resolver are answered by bothy all the same.
        const q = await probe(lab.base, id, {
          permittedDirect: { dns: [PUBLIC_DNS, NAMES.api] },
          other: { lookup: TEST_NAME },
          otherDirect: { dns: [PUBLIC_DNS, TEST_NAME] },
          otherName: { get: [NAMES.other, 80] },
        });
        const seen = JSON.stringify(q.results);
        expect(q.results["permittedDirect"], seen).toMatchObject({ ok: true, addrs: [PUBLIC_HTTP] });
        // Refused by bothy at once: the wan resolver would have answered TEST_NAME.
        expect(q.results["otherDirect"], seen).toMatchObject({ ok: false, err: "EREFUSED" });
        expect(q.results["other"], seen).toMatchObject({ ok: false });
        expect(q.results["otherName"], seen).toMatchObject({ ok: false });
      },
      600_000,
    );
  });
});
