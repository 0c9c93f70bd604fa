import { describe, expect, it } from "vitest";
import { CappedOutput, parseHttpCommand } from "../src/api/command-http.ts";

const chunk = (data: string, encoding?: "base64") => ({
  type: "stdout" as const,
  command_id: "cmd_x",
  data,
  ...(encoding ? { encoding } : {}),
});

describe("the HTTP command route's output and body", () => {
  it("keeps output up to the cap, and leaves out a character the cap cut in two", () => {
    const out = new CappedOutput(5);
    out.push(chunk("abcé")); // 5 bytes: fits
    expect([out.text(), out.dropped]).toEqual([{ data: "abcé" }, false]);
    out.push(chunk("z"));
    expect([out.text(), out.dropped]).toEqual([{ data: "abcé" }, true]);
    const cut = new CappedOutput(4);
    cut.push(chunk("abcé")); // é's second byte is past the cap
    expect([cut.text(), cut.dropped]).toEqual([{ data: "abc" }, true]);
  });

  it("answers bytes that are not UTF-8 as base64, across chunks", () => {
    const out = new CappedOutput(100);
    out.push(chunk("a"));
    out.push(chunk(Buffer.from([0xff]).toString("base64"), "base64"));
    expect(out.text()).toEqual({ data: Buffer.from([0x61, 0xff]).toString("base64"), encoding: "base64" });
  });

  it("refuses the options that need a socket, naming them and the WebSocket route", () => {
    expect(parseHttpCommand({ cmd: "true", timeout_s: 5 })).toEqual({ cmd: "true", timeout_s: 5 });
    expect(() => parseHttpCommand({ cmd: "cat", stdin: true, pty: true })).toThrow(
      "stdin, pty need a socket: use GET /sandboxes/{id}/command (WebSocket) for this command.",
    );
    expect(() => parseHttpCommand({ cmd: "true", stdin: false })).not.toThrow();
    expect(() => parseHttpCommand(undefined)).toThrow(/cmd: /);
  });
});
