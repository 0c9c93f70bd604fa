import { describe, expect, it } from "vitest";
import { z } from "zod";
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

  it("documents each route with the zod schemas it declares: summary, query, body and answers", async () => {
    const doc = (await (await fetch(`${ts.url}/openapi.json`)).json()) as OpenApiDoc;
    const resolve = (s: JsonSchema | undefined): JsonSchema | undefined =>
      s?.$ref ? doc.components.schemas[s.$ref.split("/").pop() ?? ""] : s;
    const wrong: string[] = [];
    const routes = ts.server.routes.filter((r) => !r.url.startsWith("/e2b") && r.url !== "/files");
    expect(routes.length).toBeGreaterThan(60);
    for (const r of routes) {
      const where = `${r.method.toUpperCase()} ${r.url}`;
      const op = doc.paths[r.url.replace(/:(\w+)/g, "{$1}")]?.[r.method];
      const schema = (r.schema ?? {}) as Record<string, unknown>;
      if (!op || !schema["summary"]) {
        wrong.push(`${where}: no operation, or the route declares no schema with a summary`);
        continue;
      }
      if (op.summary !== schema["summary"]) wrong.push(`${where}: summary differs`);
      const query = schema["querystring"];
      if (query instanceof z.ZodObject)
        for (const name of Object.keys(query.shape))
          if (!op.parameters?.some((p) => p.in === "query" && p.name === name))
            wrong.push(`${where}: ?${name} missing`);
      const body = schema["body"];
      if (body instanceof z.ZodType) {
        const documented = resolve(op.requestBody?.content["application/json"]?.schema);
        const declared = z.toJSONSchema(body, { io: "input", unrepresentable: "any" }) as JsonSchema;
        if (!documented) wrong.push(`${where}: body missing`);
        else if (
          JSON.stringify(Object.keys(documented.properties ?? {})) !==
          JSON.stringify(Object.keys(declared.properties ?? {}))
        )
          wrong.push(`${where}: body properties differ`);
      }
      for (const status of Object.keys((schema["response"] as object | undefined) ?? {}))
        if (!op.responses[status]) wrong.push(`${where}: answer ${status} missing`);
      // Every operation documents its errors; problem+json unless the route says otherwise (/mcp).
      if (!op.responses["default"]?.content?.["application/problem+json"]) wrong.push(`${where}: errors missing`);
    }
    expect(wrong).toEqual([]);
  });
});

interface JsonSchema {
  $ref?: string;
  properties?: Record<string, unknown>;
}
interface OpenApiDoc {
  paths: Record<
    string,
    Record<
      string,
      {
        summary?: string;
        parameters?: Array<{ name: string; in: string }>;
        requestBody?: { content: Record<string, { schema?: JsonSchema }> };
        responses: Record<string, { content?: Record<string, unknown> }>;
      }
    >
  >;
  components: { schemas: Record<string, JsonSchema> };
}
