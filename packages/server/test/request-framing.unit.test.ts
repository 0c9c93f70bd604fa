/**
 * request-framing.ts on its own: the framing each request gets upstream, the headers that say it,
 * and the body meter that stops bytes which do not fit (the parsers in front of it should never
 * let such bytes through; this is the gateway's own check).
 */
import type { IncomingMessage } from "node:http";
import { Readable } from "node:stream";
import { describe, expect, it } from "vitest";
import {
  FramedBody,
  framedHeaders,
  FramingError,
  requestFraming,
  type Framing,
} from "../src/gateway/request-framing.ts";

const h1 = (method: string, url: string, headers: Record<string, string> = {}): IncomingMessage =>
  ({ method, url, headers, httpVersionMajor: 1 }) as unknown as IncomingMessage;

async function through(framing: Framing, chunks: string[]): Promise<string> {
  let out = "";
  const body = Readable.from(chunks.map((c) => Buffer.from(c))).pipe(new FramedBody(framing));
  for await (const c of body) out += String(c);
  return out;
}

describe("request framing", () => {
  it("frames by what was parsed, and pools only ordinary requests", () => {
    expect(requestFraming(h1("GET", "/"))).toEqual({ ok: true, framing: { kind: "none" }, pooled: true });
    expect(requestFraming(h1("GET", "/", { "content-length": "0" }))).toMatchObject({ framing: { kind: "none" } });
    expect(requestFraming(h1("POST", "/", { "content-length": "12" }))).toEqual({
      ok: true,
      framing: { kind: "length", length: 12 },
      pooled: true,
    });
    expect(requestFraming(h1("DELETE", "/", { "content-length": "12" }))).toMatchObject({ pooled: false });
    expect(requestFraming(h1("POST", "/", { "transfer-encoding": "chunked" }))).toEqual({
      ok: true,
      framing: { kind: "chunked" },
      pooled: false,
    });
    expect(requestFraming(h1("OPTIONS", "*"))).toMatchObject({ ok: true });
  });

  it("refuses what it cannot frame, with a problem that says what to send instead", () => {
    const refused = [
      h1("GET", "/", { "transfer-encoding": "chunked" }),
      h1("HEAD", "/", { "content-length": "3" }),
      h1("TRACE", "/", { "content-length": "3" }),
      h1("POST", "/", { "transfer-encoding": "gzip, chunked" }),
      h1("POST", "/", { "transfer-encoding": "chunked", "content-length": "3" }),
      h1("POST", "/", { "content-length": "3, 3" }),
      h1("GET", "http://other.example/"),
      h1("GET", "other.example:80"),
    ];
    for (const req of refused) {
      const v = requestFraming(req);
      expect(v.ok, JSON.stringify(req.headers)).toBe(false);
      if (!v.ok) expect(v.error.code).toBe("malformed_request");
    }
    const connect = requestFraming(h1("CONNECT", "other.example:443"));
    expect(connect.ok === false && connect.error.code).toBe("method_not_allowed");
  });

  it("sets the gateway's own length headers and drops the client's", () => {
    const client = { "content-length": "5", "transfer-encoding": "chunked", expect: "100-continue", accept: "x" };
    expect(framedHeaders(client, { kind: "none" }, true)).toEqual({ accept: "x" });
    expect(framedHeaders(client, { kind: "length", length: 7 }, true)).toEqual({ accept: "x", "content-length": "7" });
    expect(framedHeaders(client, { kind: "chunked" }, false)).toEqual({
      accept: "x",
      "transfer-encoding": "chunked",
      connection: "close",
    });
  });

  it("passes a body that fits and fails one that does not, before the extra bytes pass", async () => {
    expect(await through({ kind: "length", length: 6 }, ["abc", "def"])).toBe("abcdef");
    expect(await through({ kind: "chunked" }, ["abc", "def"])).toBe("abcdef");
    expect(await through({ kind: "none" }, [])).toBe("");
    for (const [framing, chunks] of [
      [{ kind: "length", length: 4 }, ["abc", "def"]],
      [{ kind: "length", length: 8 }, ["abc", "def"]],
      [{ kind: "none" }, ["x"]],
    ] as Array<[Framing, string[]]>) {
      let passed = "";
      const err = await (async () => {
        try {
          const body = Readable.from(chunks.map((c) => Buffer.from(c))).pipe(new FramedBody(framing));
          for await (const c of body) passed += String(c);
        } catch (e) {
          return e;
        }
        return undefined;
      })();
      expect(err).toBeInstanceOf(FramingError);
      expect((err as FramingError).error.code).toBe("malformed_request");
      expect(passed.length).toBeLessThanOrEqual(framing.kind === "length" ? framing.length : 0);
    }
  });
});
