/**
 * Placement of creates across nodes (cluster/placement.ts) and the signature of forwarded requests
 * (cluster/cluster-secret.ts), without a cluster: which nodes may take a create, that the emptier
 * of the weighed ones gets it, that one Idempotency-Key chooses the same node wherever it is seen,
 * and, from the side of someone who can reach a node but lacks the cluster's secret, that a forged,
 * stale, replayed or re-aimed signature is refused.
 */
import { describe, expect, it } from "vitest";
import { ClusterSecret } from "../src/cluster/cluster-secret.ts";
import { place, type PlacementNeed } from "../src/cluster/placement.ts";
import type { NodeLoad } from "../src/ledger/placement-rows.ts";

function node(id: string, over: Partial<NodeLoad> = {}): NodeLoad {
  return {
    id,
    url: `http://${id}:8080`,
    drivers: ["gvisor"],
    templates: ["seed"],
    vcpu: 8,
    memory_mib: 16384,
    slots: 10,
    draining: false,
    lapsed: false,
    used_slots: 0,
    used_vcpu: 0,
    used_memory_mib: 0,
    ...over,
  };
}

const NEED: PlacementNeed = { driver: undefined, template: "seed", vcpu: 1, memoryMib: 512, key: undefined };

describe("placement", () => {
  it("never chooses a drained, lapsed or full node, nor one without the driver", () => {
    const nodes = [
      node("drained", { draining: true }),
      node("lapsed", { lapsed: true }),
      node("full", { used_slots: 10 }),
      node("qemu-only", { drivers: ["qemu"] }),
      node("ok", { used_memory_mib: 15000, used_vcpu: 7 }),
    ];
    for (let i = 0; i < 20; i++) expect(place(nodes, { ...NEED, driver: "gvisor" })?.id).toBe("ok");
    expect(place(nodes.slice(0, 4), { ...NEED, driver: "gvisor" })).toBeUndefined();
  });

  it("prefers nodes that hold the template built, else any that can build it", () => {
    const nodes = [node("a", { templates: [] }), node("b", { templates: ["desktop"], used_memory_mib: 9000 })];
    expect(place(nodes, { ...NEED, template: "desktop" })?.id).toBe("b");
    expect(place(nodes, { ...NEED, template: "fullstack" })).toBeDefined();
  });

  it("gives the create to the emptiest of the nodes it weighs", () => {
    const nodes = [
      node("busy", { used_memory_mib: 12000, used_vcpu: 6 }),
      node("idle"),
      node("half", { used_vcpu: 4 }),
    ];
    // With three candidates weighed out of three, every draw weighs all.
    for (let i = 0; i < 20; i++) expect(place(nodes, NEED)?.id).toBe("idle");
  });

  it("sends one Idempotency-Key to the same node wherever it is seen, and keys spread", () => {
    const nodes = ["a", "b", "c"].map((id) => node(id));
    const shuffled = [nodes[2], nodes[0], nodes[1]].filter((n): n is NodeLoad => n !== undefined);
    const seen = new Set<string>();
    for (let k = 0; k < 30; k++) {
      const need = { ...NEED, key: `key-${k}` };
      const chosen = place(nodes, need)?.id;
      expect(place(shuffled, need, () => 0.99)?.id).toBe(chosen);
      if (chosen) seen.add(chosen);
    }
    expect(seen.size).toBe(3);
  });
});

describe("forwarded requests' signature", () => {
  const secret = ClusterSecret.fromString("a-cluster-secret-of-thirty-two-or-more-characters");
  const now = 1_800_000_000_000;

  it("verifies once for the method and URL it was made for", () => {
    const header = secret.sign("node-a", "GET", "/sandboxes/x", now);
    expect(secret.verify(header, "GET", "/sandboxes/x", now + 10)).toEqual({ ok: true, from: "node-a" });
    expect(secret.verify(header, "GET", "/sandboxes/x", now + 20)).toMatchObject({ ok: false, why: /seen before/ });
  });

  it("refuses it for another method or URL, from another secret, out of its time, or malformed", () => {
    const fresh = (): ClusterSecret => ClusterSecret.fromString("a-cluster-secret-of-thirty-two-or-more-characters");
    const header = secret.sign("node-a", "GET", "/sandboxes/x", now);
    expect(fresh().verify(header, "DELETE", "/sandboxes/x", now).ok).toBe(false);
    expect(fresh().verify(header, "GET", "/sandboxes/y", now).ok).toBe(false);
    expect(fresh().verify(header, "GET", "/sandboxes/x", now + 31_000)).toMatchObject({ ok: false, why: /too old/ });
    const other = ClusterSecret.fromString("another-secret-of-thirty-two-or-more-characters!");
    expect(other.verify(header, "GET", "/sandboxes/x", now)).toMatchObject({ ok: false, why: /signature/ });
    // The node named in the header is signed too: another name with the same signature fails.
    expect(fresh().verify(header.replace("node-a", "node-b"), "GET", "/sandboxes/x", now).ok).toBe(false);
    for (const bad of ["", "v1", "v2;a;1;2;3", `v1;a;${now};zz;${"0".repeat(64)}`])
      expect(fresh().verify(bad, "GET", "/sandboxes/x", now)).toMatchObject({ ok: false, why: /form/ });
  });
});
