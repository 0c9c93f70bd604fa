import { describe, expect, it } from "vitest";
import { undocumentedRoutes } from "../src/api/openapi.ts";
import { useTestServer } from "./helpers/suite.ts";
import type { TestServer } from "./helpers/test-server.ts";

describe("GET /openapi.json", () => {
  let ts: TestServer;
  useTestServer({ BOTHY_DRIVER: "gvisor" }, (s) => (ts = s));

  it("documents every route the server registers, and no route it does not", async () => {
    const res = await fetch(`${ts.url}/openapi.json`);
    expect(res.status).toBe(200);
    const doc = (await res.json()) as { openapi: string; paths: Record<string, Record<string, unknown>> };
    expect(doc.openapi).toBe("3.1.0");
    expect(ts.server.routes.length).toBeGreaterThan(20);
    expect(undocumentedRoutes(ts.server.routes, doc)).toEqual([]);
    const served = new Set(ts.server.routes.map((r) => `${r.method} ${r.url.replace(/:(\w+)/g, "{$1}")}`));
    const documented = Object.entries(doc.paths).flatMap(([path, ops]) => Object.keys(ops).map((m) => `${m} ${path}`));
    expect(documented.filter((d) => !served.has(d))).toEqual([]);
  });

  it("is generated from the protocol's schemas, and every $ref resolves", async () => {
    const doc = (await (await fetch(`${ts.url}/openapi.json`)).json()) as {
      components: { schemas: Record<string, { properties?: Record<string, unknown>; required?: string[] }> };
    };
    const { schemas } = doc.components;
    expect(schemas["Sandbox"]?.required).toEqual(
      expect.arrayContaining(["sandbox_id", "state", "template", "driver", "vcpu", "memory_mib"]),
    );
    expect(Object.keys(schemas["CreateSandboxRequest"]?.properties ?? {})).toEqual(
      expect.arrayContaining(["template", "vcpu", "memory_mib", "driver", "timeout_s"]),
    );
    // Requests are documented as written: defaulted fields are optional.
    expect(schemas["CreateSandboxRequest"]?.required ?? []).not.toContain("template");
    const refs = JSON.stringify(doc).match(/"\$ref":"[^"]+"/g) ?? [];
    expect(refs.length).toBeGreaterThan(10);
    for (const r of refs) {
      const name = /#\/components\/schemas\/(\w+)/.exec(r)?.[1];
      if (r.includes("#/components/")) expect(schemas[name ?? ""], r).toBeDefined();
    }
  });
});
