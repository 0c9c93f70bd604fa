import { describe, expect, it } from "vitest";
import { BothyError } from "@bothy/protocol";
import { PATH_FORM_CSP, toClient, toGuest, withoutBothyCookies } from "../src/api/port-headers.ts";
import { refuseCrossOrigin, sameOrigin } from "../src/api/port-origin.ts";

const KEY = `bothy_${"ab".repeat(32)}`;

describe("port proxy: headers into the guest", () => {
  it("drops bothy keys, E2B tokens and bothy's cookies; keeps the app's own", () => {
    const out = toGuest({
      authorization: `Bearer ${KEY}`,
      "x-api-key": KEY,
      "x-access-token": "envd-token",
      "e2b-traffic-access-token": "traffic-token",
      cookie: `theme=dark; bothy_link=t.s; __Host-bothy_session=x; BOTHY_other=y; app=1`,
      "x-probe": "kept",
    });
    expect(out).toEqual({ cookie: "theme=dark; app=1", "x-probe": "kept" });
  });

  it("drops an Authorization that holds a bothy key in any shape, keeps the app's own", () => {
    expect(toGuest({ authorization: `bearer   ${KEY}` })).toEqual({});
    expect(toGuest({ authorization: `Basic x, Bearer ${KEY.toUpperCase()}` })).toEqual({});
    expect(toGuest({ authorization: "Bearer app-token" })).toEqual({ authorization: "Bearer app-token" });
    expect(toGuest({ "x-api-key": "the-app's-key" })).toEqual({ "x-api-key": "the-app's-key" });
  });

  it("drops a Cookie header that held only bothy's cookies", () => {
    expect(toGuest({ cookie: "bothy_link=t.s" })).toEqual({});
    expect(withoutBothyCookies(" bothy_link=a ;  __Secure-bothy_x=b")).toBeUndefined();
    expect(withoutBothyCookies("notbothy_link=a")).toBe("notbothy_link=a");
  });
});

describe("port proxy: the app's headers back to the client", () => {
  const guest = {
    "content-type": "text/html",
    "set-cookie": ["sid=1; Path=/; Domain=preview.example.com; HttpOnly", "bothy_link=forged; Path=/", "plain=2"],
    "clear-site-data": '"cookies"',
    "content-security-policy": "default-src 'self'",
  };

  it("path form: an opaque origin (CSP sandbox without allow-same-origin), nosniff, no cookie set", () => {
    const out = toClient(guest, "path");
    expect(out["content-security-policy"]).toEqual([PATH_FORM_CSP, "default-src 'self'"]);
    expect(PATH_FORM_CSP).toMatch(/^sandbox /);
    expect(PATH_FORM_CSP).toContain("allow-scripts");
    expect(PATH_FORM_CSP).not.toContain("allow-same-origin");
    expect(PATH_FORM_CSP).not.toContain("allow-top-navigation");
    expect(out["x-content-type-options"]).toBe("nosniff");
    expect(out["set-cookie"]).toBeUndefined();
    expect(out["clear-site-data"]).toBeUndefined();
    expect(out["content-type"]).toBe("text/html");
  });

  it("preview form: cookies host-only, none of bothy's names, no Clear-Site-Data, no CSP added", () => {
    const out = toClient(guest, "preview");
    expect(out["set-cookie"]).toEqual(["sid=1; Path=/; HttpOnly", "plain=2"]);
    expect(out["clear-site-data"]).toBeUndefined();
    expect(out["content-security-policy"]).toBe("default-src 'self'");
    expect(out["x-content-type-options"]).toBeUndefined();
    expect(toClient({ "set-cookie": ["__Host-bothy_s=1; Path=/"] }, "preview")["set-cookie"]).toBeUndefined();
  });
});

describe("port proxy: Origin of requests that came in on a cookie", () => {
  const A = "8000-sbx_aaaaaaaaaaaaaaaaaaaa.preview.test";
  const B = "8000-sbx_bbbbbbbbbbbbbbbbbbbb.preview.test";

  it("compares an Origin with the Host the request was sent to", () => {
    expect(sameOrigin(`http://${A}:8080`, `${A}:8080`)).toBe(true);
    expect(sameOrigin(`https://${A.toUpperCase()}`, A)).toBe(true);
    expect(sameOrigin(`https://${A}`, `${A}:443`)).toBe(true);
    expect(sameOrigin(`http://${B}:8080`, `${A}:8080`)).toBe(false);
    expect(sameOrigin(`http://${A}:8081`, `${A}:8080`)).toBe(false);
    expect(sameOrigin("null", `${A}:8080`)).toBe(false);
    expect(sameOrigin("not a url", A)).toBe(false);
    expect(sameOrigin(`http://${A}`, undefined)).toBe(false);
    expect(sameOrigin(`http://${A}`, `x@${A}`)).toBe(false);
    expect(sameOrigin(`http://${A}`, `${A}/path`)).toBe(false);
  });

  const refused = (request: Parameters<typeof refuseCrossOrigin>[0], ambient = true): string | undefined => {
    try {
      refuseCrossOrigin(request, ambient);
      return undefined;
    } catch (err) {
      return (err as BothyError).code;
    }
  };

  it("refuses WebSockets and every method from another origin (or null), on a cookie only", () => {
    const from = (origin: string | undefined, method: string, ws = false) => ({
      method,
      ws,
      headers: { host: `${A}:8080`, ...(origin === undefined ? {} : { origin }) },
    });
    for (const method of ["GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE"])
      expect(refused(from(`http://${B}:8080`, method))).toBe("origin_refused");
    expect(refused(from(`http://${B}:8080`, "GET", true))).toBe("origin_refused");
    expect(refused(from("null", "GET", true))).toBe("origin_refused");
    // Its own origin, no Origin at all (not a browser), a read, or a credential of its own: passes.
    expect(refused(from(`http://${A}:8080`, "POST"))).toBeUndefined();
    expect(refused(from(`http://${A}:8080`, "GET", true))).toBeUndefined();
    expect(refused(from(undefined, "POST"))).toBeUndefined();
    expect(refused(from(undefined, "GET", true))).toBeUndefined();
    expect(refused(from(`http://${B}:8080`, "POST"), false)).toBeUndefined();
    const err = (() => {
      try {
        refuseCrossOrigin(from(`http://${B}:8080`, "GET", true), true);
      } catch (e) {
        return e as BothyError;
      }
      return undefined;
    })();
    expect(err?.status).toBe(403);
    expect(err?.message).toMatch(/API key/);
  });
});
