import { describe, expect, it } from "vitest";
import { echoNeedles, StreamMatcher } from "../src/gateway/secret-scrub.ts";
import { placeholdersIn, splitByHost, swapHeaders } from "../src/gateway/secret-swap.ts";
import type { SecretBinding } from "../src/gateway/contracts.ts";

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
