/**
 * Reads the server name (SNI) from the first TLS record of a connection, a ClientHello, without
 * consuming it: the gateway peeks these bytes, judges the host, then replays them upstream (or to
 * the terminator). Only what is needed is parsed; anything malformed is `invalid`.
 */

/** The first record's state: more bytes needed, not a ClientHello, or its SNI (null when it names none). */
export type ClientHelloPeek =
  | { kind: "incomplete" }
  | { kind: "invalid"; reason: string }
  | { kind: "hello"; sni: string | null; recordLength: number };

/** The largest first record accepted (a TLS record is at most 16 KiB plus some). */
export const MAX_HELLO_BYTES = 16 * 1024 + 5;

const HANDSHAKE = 22;
const CLIENT_HELLO = 1;
const EXT_SERVER_NAME = 0;
const NAME_HOST = 0;

export function peekClientHello(buf: Buffer): ClientHelloPeek {
  if (buf.length < 5) return { kind: "incomplete" };
  if (buf[0] !== HANDSHAKE) return { kind: "invalid", reason: "not a TLS handshake" };
  if (buf[1] !== 3) return { kind: "invalid", reason: "not TLS" };
  const length = buf.readUInt16BE(3);
  if (length + 5 > MAX_HELLO_BYTES) return { kind: "invalid", reason: "record too large" };
  if (buf.length < 5 + length) return { kind: "incomplete" };
  const body = buf.subarray(5, 5 + length);
  try {
    return { kind: "hello", sni: serverName(body), recordLength: 5 + length };
  } catch (err) {
    return { kind: "invalid", reason: (err as Error).message };
  }
}

/** A bounds-checked cursor: reading past the end throws. */
class Reader {
  private off = 0;
  constructor(private readonly b: Buffer) {}
  get left(): number {
    return this.b.length - this.off;
  }
  u8(): number {
    this.need(1);
    return this.b[this.off++]!;
  }
  u16(): number {
    this.need(2);
    const v = this.b.readUInt16BE(this.off);
    this.off += 2;
    return v;
  }
  u24(): number {
    return (this.u8() << 16) | this.u16();
  }
  bytes(n: number): Buffer {
    this.need(n);
    const v = this.b.subarray(this.off, this.off + n);
    this.off += n;
    return v;
  }
  private need(n: number): void {
    if (this.off + n > this.b.length) throw new Error("truncated ClientHello");
  }
}

function serverName(record: Buffer): string | null {
  const r = new Reader(record);
  if (r.u8() !== CLIENT_HELLO) throw new Error("not a ClientHello");
  // The hello must fit in this first record (it does for every client seen; a split one is refused).
  const hello = new Reader(r.bytes(r.u24()));
  hello.bytes(2 + 32); // version, random
  hello.bytes(hello.u8()); // session id
  hello.bytes(hello.u16()); // cipher suites
  hello.bytes(hello.u8()); // compression methods
  if (hello.left === 0) return null;
  const exts = new Reader(hello.bytes(hello.u16()));
  while (exts.left > 0) {
    const type = exts.u16();
    const data = new Reader(exts.bytes(exts.u16()));
    if (type !== EXT_SERVER_NAME) continue;
    const list = new Reader(data.bytes(data.u16()));
    while (list.left > 0) {
      const nameType = list.u8();
      const name = list.bytes(list.u16());
      if (nameType !== NAME_HOST) continue;
      const host = name.toString("latin1");
      if (!/^[A-Za-z0-9.-]{1,253}$/.test(host)) throw new Error("a server name that is not a host name");
      return host.toLowerCase().replace(/\.$/, "");
    }
  }
  return null;
}
