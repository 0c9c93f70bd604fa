import { Duplex } from "node:stream";
import { describe, expect, it } from "vitest";
import { callHelper, checkedInput, checkedShot } from "../src/desktop/helper-answer.ts";

/** The first 24 bytes of a PNG of the given size: its signature and IHDR's width and height. */
function pngHead(width: number, height: number, extra = 0): Buffer {
  const head = Buffer.alloc(24 + extra);
  Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]).copy(head);
  head.writeUInt32BE(13, 8);
  head.write("IHDR", 12, "latin1");
  head.writeUInt32BE(width, 16);
  head.writeUInt32BE(height, 20);
  return head;
}

const line = (report: object): Buffer => Buffer.from(`${JSON.stringify(report)}\n`);

/**
 * The helper's server inside the sandbox, played by the test: once the request line arrives it
 * writes `chunks` and, unless told not to, closes. Sandbox code can kill the real helper and bind
 * its port, so these answers are what an attacker could send.
 */
function sandboxSays(chunks: Buffer[], close = true): Duplex & { request: Promise<string> } {
  let heard: (line: string) => void = () => undefined;
  const stream = new Duplex({
    read: () => undefined,
    write(data: Buffer, _encoding, callback) {
      heard(data.toString("utf8"));
      for (const c of chunks) stream.push(c);
      if (close) stream.push(null);
      callback();
    },
  });
  return Object.assign(stream, { request: new Promise<string>((resolve) => (heard = resolve)) });
}

const shotOf = async (stream: Duplex, maxBody = 1 << 20, timeoutMs = 5000) =>
  checkedShot(await callHelper(stream, { do: "shot" }, maxBody, timeoutMs));

describe("callHelper: the desktop helper inside the sandbox is not trusted", () => {
  it("sends one request line and takes a PNG that arrives in pieces, cut at any byte", async () => {
    const png = pngHead(1280, 800, 100);
    const whole = Buffer.concat([line({ ok: true, width: 1280, height: 800, bytes: png.length }), png]);
    const stream = sandboxSays([whole.subarray(0, 5), whole.subarray(5, 60), whole.subarray(60)]);
    const shot = await shotOf(stream);
    expect(await stream.request).toBe('{"do":"shot"}\n');
    expect(shot.ok && [shot.width, shot.height, shot.png.equals(png)]).toEqual([1280, 800, true]);
  });

  it("refuses a body over the bound before reading it, and closes the stream", async () => {
    const stream = sandboxSays([line({ ok: true, width: 1, height: 1, bytes: 2 << 20 })], false);
    await expect(shotOf(stream)).rejects.toThrow(/over 1048576/);
    expect(stream.destroyed).toBe(true);
  });

  it("refuses an endless first line, a line that is not a report, and a PNG of another size", async () => {
    await expect(shotOf(sandboxSays([Buffer.alloc(4096, 0x41)], false))).rejects.toThrow(/first kilobyte/);
    await expect(shotOf(sandboxSays([line({ ok: true, bytes: -1 })]))).rejects.toThrow(/not a screenshot report/);
    const png = pngHead(10, 10);
    const lie = [line({ ok: true, width: 1280, height: 800, bytes: png.length }), png];
    await expect(shotOf(sandboxSays(lie))).rejects.toThrow(/not the image its report names/);
  });

  it("refuses a body cut short, and gives up on a helper that never finishes", async () => {
    const short = [line({ ok: true, width: 10, height: 10, bytes: 100 }), pngHead(10, 10)];
    await expect(shotOf(sandboxSays(short))).rejects.toThrow(/closed before the whole body/);
    const stuck = sandboxSays([line({ ok: true, width: 10, height: 10, bytes: 100 })], false);
    await expect(shotOf(stuck, 1 << 20, 50)).rejects.toThrow(/did not answer within/);
    expect(stuck.destroyed).toBe(true);
  });

  it("passes the helper's own failures on, for screenshots and input", async () => {
    expect(await shotOf(sandboxSays([line({ ok: false, error: "not_started" })]))).toEqual({
      ok: false,
      error: "not_started",
    });
    const input = sandboxSays([line({ ok: false, error: "failed", message: "xdotool exited" })]);
    const answer = checkedInput(await callHelper(input, { do: "input", lines: ["mousemove 1 1"] }, 0, 5000));
    expect(answer).toEqual({ ok: false, error: "failed", message: "xdotool exited" });
    expect(await input.request).toBe('{"do":"input","lines":["mousemove 1 1"]}\n');
  });
});
