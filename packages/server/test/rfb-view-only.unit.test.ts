import { describe, expect, it } from "vitest";
import { viewOnlyRfb } from "../src/api/rfb-view-only.ts";

const hex = (s: string): Buffer => Buffer.from(s.replace(/\s/g, ""), "hex");
const handshake = Buffer.concat([Buffer.from("RFB 003.008\n"), hex("01"), hex("01")]);
const setEncodings = hex("02 00 0002 00000007 ffffff21");
const updateRequest = hex("03 01 0000 0000 0500 0320");
const key = hex("04 01 0000 00000061");
const pointer = hex("05 01 0064 0064");
const extendedCut = hex("06 000000 fffffff8 1f000001 00000000"); // noVNC's clipboard capabilities
const cut = Buffer.concat([hex("06 000000 00000003"), Buffer.from("abc")]);
const setDesktopSize = hex("fb 00 0500 0320 01 00 00000000 0000 0000 0500 0320 00000000");
const fence = hex("f8 000000 00000001 02 abcd");

describe("view-only RFB filter", () => {
  it("passes the handshake and picture requests and drops input, whole or split anyhow", () => {
    const stream = Buffer.concat([
      handshake,
      setEncodings,
      key,
      updateRequest,
      extendedCut,
      pointer,
      cut,
      setDesktopSize,
      fence,
      updateRequest,
    ]);
    const expected = Buffer.concat([handshake, setEncodings, updateRequest, fence, updateRequest]);
    for (const step of [stream.length, 1, 3, 7]) {
      const filter = viewOnlyRfb();
      const out: Buffer[] = [];
      for (let i = 0; i < stream.length; i += step) out.push(filter(stream.subarray(i, i + step))!);
      expect(Buffer.concat(out).toString("hex")).toBe(expected.toString("hex"));
    }
  });

  it("refuses what it cannot follow: another security type, an unknown message", () => {
    expect(viewOnlyRfb()(Buffer.concat([Buffer.from("RFB 003.008\n"), hex("02")]))).toBeNull();
    expect(viewOnlyRfb()(Buffer.concat([handshake, hex("ff 00 0000")]))).toBeNull();
    expect(viewOnlyRfb()(Buffer.from("HTTP/1.1 200\r\n"))).toBeNull();
  });

  it("skips a ClientCutText announcing 2 GiB as it streams past, holding none of it", () => {
    for (const length of ["7fffffff", "80000000"]) {
      // 0x7fffffff: plain text of 2 GiB - 1; 0x80000000: the extended clipboard's 2 GiB.
      const filter = viewOnlyRfb();
      expect(filter(Buffer.concat([handshake, hex(`06 000000 ${length}`)]))?.toString("hex")).toBe(
        handshake.toString("hex"),
      );
      const size = Math.abs(Buffer.from(length, "hex").readInt32BE(0));
      const mib = Buffer.alloc(1024 * 1024, 0x61);
      let left = size;
      for (; left > mib.length; left -= mib.length) {
        expect(filter(mib)?.length).toBe(0);
        expect(filter.held).toBe(0);
      }
      // Its last bytes and a picture request in one chunk: the request passes.
      expect(filter(Buffer.concat([mib.subarray(0, left), updateRequest]))?.toString("hex")).toBe(
        updateRequest.toString("hex"),
      );
      expect(filter.held).toBe(0);
    }
  });

  it("holds a message it passes only until whole", () => {
    const filter = viewOnlyRfb();
    filter(handshake);
    expect(filter(setEncodings.subarray(0, 5))?.length).toBe(0);
    expect(filter.held).toBe(5);
    expect(filter(setEncodings.subarray(5))?.toString("hex")).toBe(setEncodings.toString("hex"));
    expect(filter.held).toBe(0);
  });
});
