// The native front's frame reader and header classifier (native/frames.c), run as the built
// binary `frames-check` on streams of real, mutated, oversized and truncated frames, against a
// model of the Node agent's channel (codec.ts FrameDecoder, JSON.parse, the resync hunt) and the
// host schemas' zod parse: the same frame boundaries and framing errors, and a native reading
// only where zod reads the same frame the same way.
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import {
  encodeFrame,
  hostFrame,
  MAX_HEADER_BYTES,
  MAX_PAYLOAD_BYTES,
  PROTOCOL_GENERATION,
  RESYNC_END,
  resyncPreamble,
} from "@bothy/protocol";

const CHECK = fileURLToPath(new URL("../dist/frames-check", import.meta.url));

interface Checked {
  headerLen: number;
  payloadLen: number;
  /** Read natively (the front answers it), or left to the agent. */
  kind: "other" | "hello_ack" | "resync" | "limits";
  id: number;
  value: number;
  t: string;
}
type Line = Checked | "error" | { end: number };

function runCheck(stream: Buffer, seed: number): Promise<Line[]> {
  return new Promise((resolve, reject) => {
    const child = spawn(CHECK, [String(seed)], { stdio: ["pipe", "pipe", "inherit"] });
    const out: Buffer[] = [];
    child.stdout.on("data", (c: Buffer) => out.push(c));
    child.once("error", reject);
    child.once("close", (code, signal) => {
      if (code !== 0) return reject(new Error(`frames-check ended with ${signal ?? code}`));
      resolve(
        Buffer.concat(out)
          .toString("utf8")
          .split("\n")
          .filter(Boolean)
          .map((line): Line => {
            if (line === "error") return "error";
            const parts = line.split(" ");
            if (parts[0] === "end") return { end: Number(parts[1]) };
            const [, h, p, kind, id, value, ...t] = parts;
            return {
              headerLen: Number(h),
              payloadLen: Number(p),
              kind: kind as Checked["kind"],
              id: Number(id),
              value: Number(value),
              t: t.join(" "),
            };
          }),
      );
    });
    child.stdin.on("error", () => undefined);
    child.stdin.end(stream);
  });
}

type Modelled = { headerLen: number; payloadLen: number; header: unknown } | "error" | { end: number };

/** The Node agent's reading of a stream, frame by frame: a framing error hunts for RESYNC_END. */
function model(stream: Buffer): Modelled[] {
  const lines: Modelled[] = [];
  let buf = stream;
  let hunting = false;
  for (;;) {
    if (hunting) {
      const at = buf.indexOf(RESYNC_END);
      if (at < 0) {
        buf = buf.subarray(Math.max(0, buf.length - RESYNC_END.length + 1));
        break;
      }
      buf = buf.subarray(at + RESYNC_END.length);
      hunting = false;
    }
    if (buf.length < 8) break;
    const headerLen = buf.readUInt32BE(0);
    const payloadLen = buf.readUInt32BE(4);
    if (headerLen === 0 || headerLen > MAX_HEADER_BYTES || payloadLen > MAX_PAYLOAD_BYTES) {
      lines.push("error");
      hunting = true;
      continue;
    }
    if (buf.length < 8 + headerLen + payloadLen) break;
    const text = buf.subarray(8, 8 + headerLen).toString("utf8");
    buf = buf.subarray(8 + headerLen + payloadLen);
    try {
      lines.push({ headerLen, payloadLen, header: JSON.parse(text) as unknown });
    } catch {
      lines.push("error");
      hunting = true;
    }
  }
  lines.push({ end: buf.length });
  return lines;
}

/** A frame with a raw header (not necessarily JSON) and a payload of `payload` bytes. */
function rawFrame(header: string | Buffer, payload = 0): Buffer {
  const head = typeof header === "string" ? Buffer.from(header, "utf8") : header;
  const prefix = Buffer.alloc(8);
  prefix.writeUInt32BE(head.length, 0);
  prefix.writeUInt32BE(payload, 4);
  return Buffer.concat([prefix, head, Buffer.alloc(payload, 0x61)]);
}

/** mulberry32: a small seeded generator, so a failure names the seed that reproduces it. */
function random(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Headers as the host sends them (JSON.stringify of its frames): the native ones must be read natively. */
const CANONICAL: { header: object; native: boolean }[] = [
  { header: { t: "hello_ack", gen: PROTOCOL_GENERATION }, native: true },
  { header: { t: "resync" }, native: true },
  { header: { t: "limits", id: 1, max_processes: 1024 }, native: true },
  { header: { t: "limits", id: 2 ** 31 - 1, max_processes: 4_194_304 }, native: true },
  { header: { t: "limits", id: 3, max_processes: 64, root_bytes: 10 ** 9 }, native: false },
  {
    header: { t: "exec", id: 4, cmd: 'echo "a\\b" \u00e9', cwd: "/root", env: { A: "b" }, stdin: true },
    native: false,
  },
  { header: { t: "exec", id: 5, cmd: "true", pty: { cols: 80, rows: 24 } }, native: false },
  { header: { t: "credit", id: 4, bytes: 131072 }, native: false },
  { header: { t: "stdin", id: 4, eof: true }, native: false },
  { header: { t: "signal", id: 4, signal: "SIGKILL" }, native: false },
  { header: { t: "file_read", id: 6, path: "/etc/hostname" }, native: false },
  { header: { t: "tcp_open", id: 7, port: 8080 }, native: false },
];

/** Headers an attacker (or a broken host) might send: none may be read natively with other values than zod's. */
const FORGED = [
  '{"t":"limits","id":1,"max_processes":5,"id":2}',
  '{"t":"limits","\\u0069d":3,"max_processes":5}',
  '{"t":"limits","id":1,"max_processes":5,"x":{"id":9}}',
  '{"t":"limits","id":"7","max_processes":5}',
  '{"t":"limits","id":1.0,"max_processes":5}',
  '{"t":"limits","id":1e0,"max_processes":5}',
  '{"t":"limits","id":2147483648,"max_processes":5}',
  '{"t":"limits","id":0,"max_processes":5}',
  '{"t":"limits","id":-1,"max_processes":5}',
  '{"t":"limits","id":1,"max_processes":0}',
  '{"t":"limits","id":1,"max_processes":4194305}',
  '{"t":"limits","id":1,"max_processes":5,"max_processes":9}',
  '{"t":"lim\\u0069ts","id":1,"max_processes":5}',
  '{"t":"limits","t":"resync","id":1,"max_processes":5}',
  '{"t":"exec","id":3,"cmd":"\\"id\\":5"}',
  '{"t":"exec","cmd":"x","id":8,"id":"9"}',
  '{"t":"hello_ack","gen":2.5}',
  '{"t":"hello_ack","gen":null}',
  '{"t":"hello_ack"}',
  '{"t":"resync","id":1}',
  '{"t":"resync","__proto__":{}}',
  '[{"t":"resync"}]',
  '"resync"',
  ' { "t" : "limits" , "id" : 12 , "max_processes" : 34 } ',
  '{"t":"limits","id":1234567890123456,"max_processes":34}',
];

const MUTATION_BYTES = '{}[]",:\\ 0123456789.eE+-utlnfar\t\n\r\u0000\u001f\u007f';

function mutate(header: string, rnd: () => number): Buffer {
  const bytes = [...Buffer.from(header, "utf8")];
  const edits = 1 + Math.floor(rnd() * 3);
  for (let e = 0; e < edits; e++) {
    const at = Math.floor(rnd() * (bytes.length + 1));
    const byte =
      rnd() < 0.8 ? MUTATION_BYTES.charCodeAt(Math.floor(rnd() * MUTATION_BYTES.length)) : Math.floor(rnd() * 256);
    const op = rnd();
    if (op < 0.4) bytes.splice(at, 0, byte);
    else if (op < 0.7) bytes.splice(at, 1);
    else bytes[Math.min(at, bytes.length - 1)] = byte;
  }
  return Buffer.from(bytes.length > 0 ? bytes : [0x7b]);
}

/** A stream of `n` frames: canonical, forged, mutated, oversized prefixes, junk and resync preambles. */
function stream(seed: number, n: number): Buffer {
  const rnd = random(seed);
  const parts: Buffer[] = [];
  const all = [...CANONICAL.map((c) => JSON.stringify(c.header)), ...FORGED];
  for (let i = 0; i < n; i++) {
    const pick = rnd();
    const base = all[Math.floor(rnd() * all.length)] ?? "{}";
    const payload = rnd() < 0.1 ? Math.floor(rnd() * 70_000) : 0;
    if (pick < 0.45) parts.push(rawFrame(base, payload));
    else if (pick < 0.85) parts.push(rawFrame(mutate(base, rnd), payload));
    else if (pick < 0.9) {
      // A prefix out of range: header 0, header or payload one past its bound, or any junk.
      const prefix = Buffer.alloc(8);
      const choice = Math.floor(rnd() * 4);
      prefix.writeUInt32BE(choice === 0 ? 0 : choice === 1 ? MAX_HEADER_BYTES + 1 : 10, 0);
      prefix.writeUInt32BE(choice === 2 ? MAX_PAYLOAD_BYTES + 1 : choice === 3 ? Math.floor(rnd() * 2 ** 32) : 0, 4);
      parts.push(prefix, Buffer.from("junk"));
    } else if (pick < 0.95) parts.push(RESYNC_END);
    else parts.push(Buffer.from([...Array(1 + Math.floor(rnd() * 40))].map(() => Math.floor(rnd() * 256))));
    // Often back in step, so that what follows a framing error is judged too, not hunted past.
    if (rnd() < 0.4) parts.push(RESYNC_END);
  }
  return Buffer.concat(parts);
}

/** Compares the binary's lines to the model's, and each native reading to zod's. */
function compare(lines: Line[], modelled: Modelled[], canonical?: boolean[]): void {
  expect(lines.length).toBe(modelled.length);
  let frameIndex = 0;
  lines.forEach((line, i) => {
    const want = modelled[i];
    if (want === "error" || line === "error" || "end" in line || (want !== undefined && "end" in want)) {
      expect(line).toEqual(want);
      return;
    }
    if (want === undefined) throw new Error("more lines than the model");
    expect([line.headerLen, line.payloadLen]).toEqual([want.headerLen, want.payloadLen]);
    const header = want.header as Record<string, unknown> | null;
    const isObject = typeof header === "object" && header !== null && !Array.isArray(header);
    // An id or t the binary read is the one JSON.parse reads (the last of repeated keys).
    if (line.id !== 0) expect(isObject && header["id"]).toBe(line.id);
    if (line.t !== "") expect(isObject && header["t"]).toBe(line.t);
    if (line.kind !== "other") {
      const parsed = hostFrame.safeParse(header);
      expect(parsed.success, `natively read ${JSON.stringify(header)}, which zod refuses`).toBe(true);
      const frame = parsed.data;
      expect(frame?.t).toBe(line.kind);
      if (frame?.t === "hello_ack") expect(frame.gen).toBe(line.value);
      if (frame?.t === "limits") {
        expect([frame.id, frame.max_processes, frame.root_bytes]).toEqual([line.id, line.value, undefined]);
      }
    }
    if (canonical?.[frameIndex] === true) expect(line.kind).not.toBe("other");
    frameIndex++;
  });
}

describe("the native front's frames (frames-check)", () => {
  it("reads the host's own frames as the agent does, the native ones natively", async () => {
    expect(existsSync(CHECK), "run `npm run build -w @bothy/guest` first").toBe(true);
    const frames = CANONICAL.map((c) => encodeFrame(c.header, Buffer.from("payload")));
    const s = Buffer.concat(frames);
    compare(
      await runCheck(s, 1),
      model(s),
      CANONICAL.map((c) => c.native),
    );
    const lines = (await runCheck(s, 2)).filter((l): l is Checked => typeof l === "object" && !("end" in l));
    expect(lines.map((l) => [l.kind, l.id])).toEqual(
      CANONICAL.map((c) => {
        const h = c.header as { t: string; id?: number };
        return [c.native ? h.t : "other", h.id ?? 0];
      }),
    );
    expect(lines.find((l) => l.kind === "limits")?.value).toBe(1024);
  });

  it("never reads a forged id or value other than zod would", async () => {
    const s = Buffer.concat(FORGED.map((h) => rawFrame(h)));
    const lines = await runCheck(s, 3);
    compare(lines, model(s));
    // Only the one with JSON whitespace, which zod reads as the same limits, is read natively.
    expect(lines.map((l) => (typeof l === "object" && "kind" in l ? l.kind : l))).toEqual([
      ...FORGED.map((h) => (h.startsWith(" ") ? "limits" : "other")),
      { end: 0 },
    ]);
  });

  it("agrees with the agent on random, mutated and oversized frames, split anywhere", async () => {
    for (const seed of [11, 12, 13, 14, 15, 16]) {
      const s = stream(seed, 400);
      try {
        compare(await runCheck(s, seed), model(s));
      } catch (err) {
        throw new Error(`seed ${seed}: ${(err as Error).message}`);
      }
    }
  });

  it("stops at a truncated frame, keeps at most one frame, and finds the stream again after a resync preamble", async () => {
    const first = encodeFrame({ t: "limits", id: 9, max_processes: 7 });
    const whole = Buffer.concat([
      first,
      encodeFrame({ t: "stdin", id: 4, eof: false }, Buffer.alloc(MAX_PAYLOAD_BYTES, 1)),
    ]);
    for (const cut of [0, 1, 7, 8, 20, first.length + 9, whole.length - 1]) {
      const s = whole.subarray(0, cut);
      const lines = await runCheck(s, cut);
      compare(lines, model(s));
      // What is left unread is the cut frame's part: never more than one frame's bounds.
      expect(lines.at(-1)).toEqual({ end: cut >= first.length ? cut - first.length : cut });
    }
    // The largest frame the bounds allow passes; one byte more is a framing error, and the
    // preamble a new host sends brings the reader back in step.
    const biggest = rawFrame(
      `{"t":"credit","id":1,"bytes":1,"pad":"${"x".repeat(MAX_HEADER_BYTES - 40)}"}`,
      MAX_PAYLOAD_BYTES,
    );
    expect(biggest.readUInt32BE(0)).toBe(MAX_HEADER_BYTES);
    const s = Buffer.concat([
      biggest,
      rawFrame("{}", MAX_PAYLOAD_BYTES + 1),
      Buffer.from("anything at all"),
      resyncPreamble(),
      encodeFrame({ t: "resync" }),
    ]);
    const lines = await runCheck(s, 5);
    compare(lines, model(s));
    expect(lines.map((l) => (typeof l === "string" ? l : "end" in l ? "end" : l.kind))).toEqual([
      "other",
      "error",
      "resync",
      "end",
    ]);
  });

  it("judges deep nesting and every JSON edge as JSON.parse does", async () => {
    const headers = [
      `{"t":"x","a":${"[".repeat(30_000)}${"]".repeat(30_000)}}`,
      `{"t":"x","a":${"[".repeat(30_000)}${"]".repeat(29_999)}}`,
      '{"a":"\\ud800\\udc00\\uD800"}',
      '{"a":"\\x"}',
      '{"a":"\\u12g4"}',
      '{"a":1.}',
      '{"a":.5}',
      '{"a":-}',
      '{"a":1e}',
      '{"a":1e+5,"b":-0,"c":0.25E-2}',
      '{"a":01}',
      '{"t":"limits","id":000012,"max_processes":34}',
      '{"a":nul}',
      '{"a":[1,]}',
      '{"a":1,}',
      '{"a":"tab\there"}',
      '{"a":"\u007f"}',
    ];
    const frames = [
      ...headers.map((h) => rawFrame(h)),
      rawFrame(Buffer.from([0xef, 0xbb, 0xbf, 0x7b, 0x7d])), // a byte order mark: JSON.parse refuses it
      rawFrame(Buffer.from([0x7b, 0x22, 0x61, 0x22, 0x3a, 0x22, 0xe2, 0x22, 0x7d])), // a broken UTF-8 sequence before the quote
      rawFrame(Buffer.from([0x7b, 0x22, 0x61, 0x22, 0x3a, 0x22, 0xff, 0xfe, 0x22, 0x7d])),
    ];
    // Each followed by the resync marker, so that every one is judged (after a framing error the
    // reader hunts for it; after a frame the marker is a framing error of its own, found at once).
    const s = Buffer.concat([...frames.flatMap((f) => [f, RESYNC_END]), rawFrame('{"t":"resync"}')]);
    const lines = await runCheck(s, 7);
    compare(lines, model(s));
    // Valid: the balanced nesting, the escapes, the numbers, DEL, the two broken UTF-8 strings and the last.
    expect(lines.filter((l) => l === "error")).toHaveLength(frames.length);
    expect(lines.filter((l) => typeof l === "object" && "kind" in l)).toHaveLength(7);
  });
});
