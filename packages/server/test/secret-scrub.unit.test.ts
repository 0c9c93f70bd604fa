import { describe, expect, it } from "vitest";
import { echoNeedles, StreamMatcher } from "../src/gateway/secret-scrub.ts";
import { placeholdersIn, splitByHost, swapHeaders } from "../src/gateway/secret-swap.ts";
import type { SecretBinding } from "../src/gateway/contracts.ts";
import { recoverable } from "./helpers/echo-leaks.ts";

const VALUE = "ghp_Real+Value/with space&=";
const PH = "bothy_ph_abcdefghijklmnopqrstuvwxyz234567";

/** Runs `text` through a matcher cut at the given offsets. */
function scrubSplit(text: string, cuts: number[]): { out: string; found: string[] } {
  const m = new StreamMatcher(echoNeedles("github", VALUE, PH));
  const bytes = Buffer.from(text);
  const parts: Buffer[] = [];
  const found: string[] = [];
  let from = 0;
  for (const cut of [...cuts, bytes.length]) {
    const r = m.push(bytes.subarray(from, cut));
    parts.push(r.out);
    found.push(...r.found);
    from = cut;
  }
  parts.push(m.end());
  return { out: Buffer.concat(parts).toString(), found };
}

describe("scrubbing echoed values", () => {
  const forms = {
    raw: VALUE,
    base64: Buffer.from(VALUE).toString("base64"),
    base64url: Buffer.from(VALUE).toString("base64url"),
    url: encodeURIComponent(VALUE),
    form: encodeURIComponent(VALUE).replace(/%20/g, "+"),
  };

  for (const [form, encoded] of Object.entries(forms)) {
    it(`replaces the ${form} form wherever the chunks are cut`, () => {
      const text = `{"a":"${encoded}","b":"x${encoded}y"}`;
      for (let cut = 0; cut <= text.length; cut++) {
        for (const second of [cut, Math.min(text.length, cut + 3)]) {
          const { out, found } = scrubSplit(text, [cut, second]);
          expect(out).toBe(`{"a":"${PH}","b":"x${PH}y"}`);
          expect(found).toEqual(["github", "github"]);
        }
      }
    });
  }

  it("passes other bytes as they are, one byte per chunk included", () => {
    const text = "nothing secret here, only ghp_Real+Valu";
    const cuts = Array.from({ length: text.length }, (_, i) => i);
    expect(scrubSplit(text, cuts).out).toBe(text);
  });
});

/** Runs `text` through a matcher for `value`, cut into chunks of `size` bytes. */
function scrubChunks(value: string, text: string, size: number): { out: string; found: string[] } {
  const m = new StreamMatcher(echoNeedles("secret", value, PH));
  const bytes = Buffer.from(text);
  const parts: Buffer[] = [];
  const found: string[] = [];
  for (let from = 0; from < bytes.length; from += size) {
    const r = m.push(bytes.subarray(from, from + size));
    parts.push(r.out);
    found.push(...r.found);
  }
  parts.push(m.end());
  return { out: Buffer.concat(parts).toString(), found };
}

describe("echoes of the header as sent, base64-encoded (the upstream's reply as the sandbox reads it)", () => {
  // Lengths 27, 23 and 22 (0, 2 and 1 modulo 3) put the value's end at each of the three places within a 3-byte group.
  const values = [VALUE, "sk_live_stripe_value_42", "xoxb-123456789-abcdefg"];

  for (const value of values)
    it(`leaves nothing of a ${Buffer.byteLength(value)}-byte value in base64 of Bearer, token and Basic forms`, () => {
      const sent = [
        `Bearer ${value}`,
        `token ${value}`,
        `${value}`,
        `x-access-token:${value}`,
        `Authorization: token ${value}`,
        `{"auth":"Bearer ${value}","n":1}`,
      ];
      for (const header of sent)
        for (const encoded of [
          Buffer.from(header).toString("base64"),
          Buffer.from(header).toString("base64").replace(/=+$/, ""),
          Buffer.from(header).toString("base64url"),
        ]) {
          const reply = `{"echo":"${encoded}","also":"Basic ${encoded}"}`;
          for (const size of [1, 3, 7, 64, reply.length]) {
            const { out, found } = scrubChunks(value, reply, size);
            expect(recoverable(out, value, PH), `${header} as ${encoded}, chunks of ${size}`).toEqual([]);
            expect(found.length).toBeGreaterThanOrEqual(2);
          }
        }
    });

  it("leaves the gateway's own Basic credentials, echoed as they were sent, unreadable", () => {
    // The sandbox sends Basic base64(user:<placeholder>); the gateway sends base64(user:<value>) on.
    // Users of 15, 2 and 3 bytes start the value at each place within a 3-byte group.
    for (const user of ["x-access-token", "u", "ab"]) {
      const header = `Basic ${Buffer.from(`${user}:${VALUE}`).toString("base64")}`;
      const { out } = scrubChunks(VALUE, `{"headers":{"Authorization":"${header}"}}`, 5);
      expect(recoverable(out, VALUE, PH), user).toEqual([]);
      expect(out).toContain(PH);
    }
  });

  it("takes exactly the characters that carry the value's bits, at any offset", () => {
    for (const value of values) {
      const n = Buffer.byteLength(value);
      for (let before = 0; before < 6; before++)
        for (let after = 0; after < 4; after++) {
          const encoded = Buffer.from(`${"p".repeat(before)}${value}${"s".repeat(after)}`).toString("base64");
          const out = scrubChunks(value, encoded, 2).out;
          const at = out.indexOf(PH);
          const head = out.slice(0, at);
          const tail = out.slice(at + PH.length);
          expect(encoded.startsWith(head) && encoded.endsWith(tail)).toBe(true);
          // Nothing that touches the value's bits is left; nothing before them is taken.
          expect(head.length).toBe(Math.floor((8 * before) / 6));
          expect(encoded.length - tail.length).toBeGreaterThanOrEqual(Math.ceil((8 * (before + n)) / 6));
          expect(encoded.length - tail.length).toBeLessThanOrEqual(Math.ceil((8 * (before + n)) / 6) + 2);
        }
    }
  });

  it("replaces the value's JSON-escaped and lower-case percent-encoded forms", () => {
    const slashed = JSON.stringify(VALUE).slice(1, -1).replace(/\//g, "\\/");
    const lower = encodeURIComponent(VALUE).replace(/%[0-9A-F]{2}/g, (h) => h.toLowerCase());
    for (const form of [slashed, lower]) expect(scrubChunks(VALUE, `[${form}]`, 4).out).toBe(`[${PH}]`);
  });
});

describe("placeholders", () => {
  const github: SecretBinding = {
    name: "github",
    env: "GITHUB",
    placeholder: PH,
    hosts: ["api.github.com"],
    inject: null,
  };
  const stripe: SecretBinding = {
    name: "stripe",
    env: "STRIPE",
    placeholder: "bothy_ph_stripestripestripestripestripe22",
    hosts: ["*.stripe.com"],
    inject: { header: "Authorization", format: "Bearer {value}" },
  };
  const values: Record<string, string> = { github: "ghp_1", stripe: "sk_2" };
  const valueOf = (b: SecretBinding): string => values[b.name] ?? "";

  it("splits bindings by host", () => {
    const { bound, unbound } = splitByHost("api.stripe.com", [github, stripe]);
    expect(bound.map((b) => b.name)).toEqual(["stripe"]);
    expect(unbound.map((b) => b.name)).toEqual(["github"]);
  });

  it("swaps a placeholder in headers, inside Basic credentials too, and injects", () => {
    const basic = `Basic ${Buffer.from(`x-access-token:${PH}`).toString("base64")}`;
    const { headers, used } = swapHeaders(
      { authorization: `token ${PH}`, "x-other": [PH, "plain"], "proxy-authorization": basic },
      [github],
      valueOf,
    );
    expect(headers.authorization).toBe("token ghp_1");
    expect(headers["x-other"]).toEqual(["ghp_1", "plain"]);
    expect(headers["proxy-authorization"]).toBe(`Basic ${Buffer.from("x-access-token:ghp_1").toString("base64")}`);
    expect(used).toEqual(["github"]);
    const injected = swapHeaders({ accept: "*/*" }, [stripe], valueOf);
    expect(injected.headers.authorization).toBe("Bearer sk_2");
    expect(injected.used).toEqual(["stripe"]);
  });

  it("finds an unbound placeholder in the URL, a header, a header name or Basic credentials", () => {
    expect(placeholdersIn([github], `/x?token=${PH}`, {})).toEqual([github]);
    expect(placeholdersIn([github], "/", { cookie: `a=${PH}` })).toEqual([github]);
    expect(placeholdersIn([github], "/", { [`x-${PH}`]: "1" })).toEqual([github]);
    const basic = `Basic ${Buffer.from(`u:${PH}`).toString("base64")}`;
    expect(placeholdersIn([github], "/", { authorization: basic })).toEqual([github]);
    expect(placeholdersIn([github], "/", { authorization: "Bearer other" })).toEqual([]);
  });
});
