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
import { judgedPath } from "../src/gateway/request-path.ts";
import type { EffectiveHostPolicy } from "@bothy/protocol";

describe("host patterns", () => {
  it("matches names below a wildcard but not its apex", () => {
    expect(hostMatches("*.example.com", "api.example.com")).toBe(true);
    expect(hostMatches("*.example.com", "a.b.example.com")).toBe(true);
    expect(hostMatches("*.example.com", "example.com")).toBe(false);
    expect(hostMatches("*.example.com", "badexample.com")).toBe(false);
    expect(hostMatches("api.example.com", "API.Example.com.")).toBe(true);
    expect(hostMatches("api.example.com", "x.api.example.com")).toBe(false);
  });

  it("matches paths as prefixes with * inside one segment", () => {
    expect(pathMatches("/repos/", "/repos/a/b")).toBe(true);
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

describe("paths as the upstream reads them (a sandbox probing a prefix rule)", () => {
  // Only /repos/me/ is allowed on this host; the rest of it is denied.
  const onlyMine: EffectiveHostPolicy = {
    rules: [{ host: "api.example.com", path: "/repos/me/", action: "allow", source: "sandbox", index: 0 }],
    default: "deny",
    tools: {},
    secrets: [],
  };
  // /admin is denied on this host; the rest is allowed.
  const notAdmin: EffectiveHostPolicy = {
    rules: [{ host: "api.example.com", path: "/admin", action: "deny", source: "tenant", index: 0 }],
    default: "allow",
    tools: {},
    secrets: [],
  };
  const judge = (p: EffectiveHostPolicy, path: string) => decide(p, { host: "api.example.com", method: "GET", path });

  it("judges the path with escapes decoded, and . , .. and // where servers read them alike", () => {
    // Resolved or not, these stay under /repos/me/ (or out of it): one reading, one decision.
    for (const path of [
      "/repos/me/x",
      "/repos/me/a/../b",
      "/repos/me/./x",
      "/repos/me/a//b",
      "/rep%6Fs/me/",
      "/repos/me/x?q=/../..",
    ])
      expect(judge(onlyMine, path), path).toEqual({ action: "allow", rule: "sandbox#0" });
    for (const path of ["/other", "/repos/you/../../other", "/repos/m%65"])
      expect(judge(onlyMine, path), path).toEqual({ action: "deny", rule: "default" });
    for (const path of ["/admin", "/%61dmin", "/admin/x/../y", "/admin/a;b"])
      expect(judge(notAdmin, path), path).toEqual({ action: "deny", rule: "tenant#0" });
    expect(judge(notAdmin, "/public")).toEqual({ action: "allow", rule: "default" });
  });

  it("refuses . , .. , // and ; that lead to another rule read one way than another", () => {
    const climbs = [
      "/repos/me/../../admin",
      "/repos/me/./../../admin/x",
      "/repos/me/..",
      "/repos/x/../me/y",
      "/repos//me/z",
    ];
    for (const path of climbs) {
      const d = judge(onlyMine, path);
      expect(d, path).toMatchObject({ action: "deny", rule: "sandbox#0" });
      expect(d.ambiguousPath, path).toMatch(/meets default, read as .* sandbox#0|meets sandbox#0, read as .* default/);
    }
    for (const path of ["/x/../admin", "//admin", "/./admin/users", "/ad;x/../admin"])
      expect(judge(notAdmin, path), path).toMatchObject({
        action: "deny",
        rule: "tenant#0",
        ambiguousPath: expect.any(String),
      });
  });

  it("refuses a path whose reading depends on the server, naming what is wrong", () => {
    const ambiguous = [
      "/repos/me/%2e%2e/%2e%2e/admin",
      "/repos/me/%2E./admin",
      "/repos/me/..%2fadmin",
      "/repos/me/..%2Fadmin",
      "/repos/me/..%5cadmin",
      "/repos/me/..\\..\\admin",
      "/repos/me/%252e%252e/admin",
      "/repos/me/..;/..;/admin",
      "/repos/me/%00/../x",
      "/repos/me/%c0%ae%c0%ae/admin",
      "/repos/me/\uff0e\uff0e/admin",
      "/repos/me//../../admin",
      "/repos/me/%zz",
      "http://api.example.com/admin",
      "*",
    ];
    for (const path of ambiguous) {
      const d = judge(onlyMine, path);
      expect(d, path).toMatchObject({ action: "deny", rule: "sandbox#0" });
      expect(d.ambiguousPath, path).toEqual(expect.any(String));
      // A deny rule is not skipped either: the request is refused, not let through by the default.
      expect(judge(notAdmin, path.replace("/repos/me", "")).action, path).toBe("deny");
    }
    expect(judgedPath("/a/%2fb")).toEqual({ ok: false, problem: "an encoded slash (%2F)" });
  });

  it("refuses ;parameters that lead to another rule where a server drops them", () => {
    // Tomcat and Spring drop `;parameters` from every segment: /admin;x/users is /admin/users to them.
    const adminDir: EffectiveHostPolicy = { ...notAdmin, rules: [{ ...notAdmin.rules[0]!, path: "/admin/" }] };
    expect(judge(adminDir, "/admin;x/users")).toMatchObject({ action: "deny", ambiguousPath: expect.any(String) });
    expect(judge(onlyMine, "/repos/me;x/y")).toMatchObject({ action: "deny", ambiguousPath: expect.any(String) });
    expect(judge(adminDir, "/users;v=2/me")).toEqual({ action: "allow", rule: "default" });
  });

  it("leaves paths alone where no rule judges them", () => {
    const hostOnly: EffectiveHostPolicy = { ...onlyMine, rules: [{ ...onlyMine.rules[0]!, path: undefined }] };
    expect(judge(hostOnly, "/a/%2f/..;/x")).toEqual({ action: "allow", rule: "sandbox#0" });
  });
});
