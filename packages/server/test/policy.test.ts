/**
 * Host and tool policies on a real server: a tenant's default (`/policy`), a sandbox's own on
 * create, the effective policy on `GET /sandboxes/{id}` (tenant rules first), kept across a
 * restart. Host rules need the egress gateway and the network (network.test.ts's lab); here the
 * network is off, so they are refused and tool rules are what applies.
 */
import { describe, expect, it } from "vitest";
import { api, deleteSandbox } from "./helpers/client.ts";
import { useTestServer } from "./helpers/suite.ts";
import type { TestServer } from "./helpers/test-server.ts";

describe("host and tool policies", () => {
  let ts: TestServer;
  useTestServer({ BOTHY_DRIVER: "gvisor" }, (s) => (ts = s));

  it("keeps a tenant's default policy, validated, and needs scope policy to set it", async () => {
    expect((await api(ts.url, "GET", "/policy")).json).toEqual({ tenant: "default", policy: null });
    const bad = await api(ts.url, "PUT", "/policy", { tools: { "Send File": "ask" } });
    expect(bad.status).toBe(400);
    expect(bad.json["code"]).toBe("invalid_request");
    const set = await api(ts.url, "PUT", "/policy", { tools: { send_file: "ask" } });
    expect(set.status).toBe(200);
    expect(set.json).toEqual({ tenant: "default", policy: { tools: { send_file: "ask" } } });

    const minted = await api(ts.url, "POST", "/keys", { name: "agent", scopes: ["sandboxes:read", "sandboxes:write"] });
    const agent = { authorization: `Bearer ${String(minted.json["key"])}` };
    expect((await api(ts.url, "GET", "/policy", undefined, agent)).json["policy"]).toEqual({
      tools: { send_file: "ask" },
    });
    const refused = await api(ts.url, "PUT", "/policy", { tools: {} }, agent);
    expect(refused.status).toBe(403);
    expect((await api(ts.url, "GET", "/policy?tenant=nobody")).json["code"]).toBe("tenant_not_found");
  });

  it("shows a sandbox's effective policy with its tenant's rules first", async () => {
    const created = await api(ts.url, "POST", "/sandboxes", {
      template: "seed",
      policy: { tools: { send_file: "allow", run_command: "deny" } },
    });
    expect(created.status).toBe(201);
    const id = String(created.json["sandbox_id"]);
    try {
      const expected = {
        rules: [],
        default: "allow",
        tools: { send_file: "ask", run_command: "deny" },
        secrets: [],
      };
      expect(created.json["policy"]).toEqual(expected);
      expect((await api(ts.url, "GET", `/sandboxes/${id}`)).json["policy"]).toEqual(expected);

      // Host rules and secrets need the network (and the gateway); nothing is made when refused.
      const before = (await api(ts.url, "GET", "/sandboxes")).json["sandboxes"] as unknown[];
      for (const body of [{ policy: { allow_hosts: ["api.example.com"] } }, { secrets: ["github"] }]) {
        const r = await api(ts.url, "POST", "/sandboxes", { template: "seed", ...body });
        expect(r.status, JSON.stringify(r.json)).toBe(501);
        expect(r.json["code"]).toBe("not_supported");
      }
      expect((await api(ts.url, "GET", "/sandboxes")).json["sandboxes"]).toHaveLength(before.length);

      await api(ts.url, "DELETE", "/policy");
      expect((await api(ts.url, "GET", `/sandboxes/${id}`)).json["policy"]).toMatchObject({
        tools: { send_file: "allow", run_command: "deny" },
      });
    } finally {
      await deleteSandbox(ts.url, id);
    }
    const plain = await api(ts.url, "POST", "/sandboxes", { template: "seed" });
    expect(plain.json["policy"]).toBeNull();
    await deleteSandbox(ts.url, String(plain.json["sandbox_id"]));
  });
});
