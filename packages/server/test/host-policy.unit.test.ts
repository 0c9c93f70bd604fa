import { describe, expect, it } from "vitest";
import {
  decide,
  decideTool,
  effectivePolicy,
  hostMatches,
  needsRequestView,
  parseHostPolicy,
  pathMatches,
} from "../src/gateway/host-policy.ts";

describe("host patterns", () => {
  it("matches names below a wildcard but not its apex", () => {
    expect(hostMatches("*.example.com", "api.example.com")).toBe(true);
    expect(hostMatches("*.example.com", "a.b.example.com")).toBe(true);
    expect(hostMatches("*.example.com", "example.com")).toBe(false);
    expect(hostMatches("*.example.com", "badexample.com")).toBe(false);
    expect(hostMatches("api.example.com", "API.Example.com.")).toBe(true);
    expect(hostMatches("api.example.com", "x.api.example.com")).toBe(false);
  });

  it("matches paths as prefixes with * inside one segment, ignoring the query", () => {
    expect(pathMatches("/repos/", "/repos/a/b?x=1")).toBe(true);
    expect(pathMatches("/repos/*/issues", "/repos/bothy/issues/3")).toBe(true);
    expect(pathMatches("/repos/*/issues", "/repos/a/b/issues")).toBe(false);
    expect(pathMatches("/a.b", "/aXb")).toBe(false);
  });

  it("refuses a malformed pattern", () => {
    expect(() => parseHostPolicy({ allow_hosts: ["exa mple.com"] })).toThrow();
    expect(() => parseHostPolicy({ allow_hosts: ["a.*.com"] })).toThrow();
    expect(parseHostPolicy({ allow_hosts: ["API.Example.com."] }).allow_hosts).toEqual(["api.example.com"]);
  });
});

describe("effective policy", () => {
  const tenant = parseHostPolicy({ rules: [{ host: "*.github.com", methods: ["POST"], action: "ask" }] });

  it("is absent when nothing is said", () => {
    expect(effectivePolicy(undefined, undefined)).toBeUndefined();
    expect(effectivePolicy(parseHostPolicy({}), parseHostPolicy({}))).toBeUndefined();
  });

  it("puts the tenant's rules first, then rules, deny_hosts, allow_hosts; allow_hosts implies deny", () => {
    const p = effectivePolicy(
      tenant,
      parseHostPolicy({ allow_hosts: ["api.github.com", "*.npmjs.org"], deny_hosts: ["evil.npmjs.org"] }),
    )!;
    expect(p.default).toBe("deny");
    expect(decide(p, { host: "api.github.com", method: "POST", path: "/x" })).toEqual({
      action: "ask",
      rule: "tenant#0",
    });
    expect(decide(p, { host: "api.github.com", method: "GET", path: "/x" })).toEqual({
      action: "allow",
      rule: "sandbox#1",
    });
    // HTTPS passed through: the method is unseen, so the method rule is skipped.
    expect(decide(p, { host: "api.github.com", method: null, path: null }).action).toBe("allow");
    expect(decide(p, { host: "evil.npmjs.org", method: "GET", path: "/" })).toEqual({
      action: "deny",
      rule: "sandbox#0",
    });
    expect(decide(p, { host: "npmjs.org", method: "GET", path: "/" })).toEqual({ action: "deny", rule: "default" });
    expect(needsRequestView(p, "api.github.com")).toBe(true);
    expect(needsRequestView(p, "registry.npmjs.org")).toBe(false);
  });

  it("lets the tenant's tool rules win and allows unnamed tools", () => {
    const p = effectivePolicy(
      parseHostPolicy({ tools: { send_file: "ask" } }),
      parseHostPolicy({ tools: { send_file: "allow", run: "deny" } }),
    );
    expect(decideTool(p, "send_file")).toEqual({ action: "ask", rule: "tools.send_file" });
    expect(decideTool(p, "run").action).toBe("deny");
    expect(decideTool(p, "read_file")).toEqual({ action: "allow", rule: "default" });
    expect(decideTool(undefined, "send_file").action).toBe("allow");
  });
});
