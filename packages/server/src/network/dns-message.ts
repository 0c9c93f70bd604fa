/**
 * The little of the DNS wire format (RFC 1035) the policy resolver needs: read a query's one
 * question, write an answer with A records or just a response code. Anything else is not parsed.
 */

export const QTYPE_A = 1;
const QCLASS_IN = 1;
const HEADER = 12;
/** A query bigger than this is no query a stub resolver sends. */
const MAX_QUERY_BYTES = 512;
const MAX_NAME = 253;

export const RCODE = { noError: 0, formErr: 1, servFail: 2, nxDomain: 3, notImp: 4, refused: 5 } as const;
export type Rcode = (typeof RCODE)[keyof typeof RCODE];

export interface DnsQuery {
  id: number;
  /** The client's RD bit, echoed back. */
  recursionDesired: boolean;
  /** Lower-case, without the final dot. */
  name: string;
  type: number;
  class: number;
  /** The question's bytes as sent (name, type, class), echoed in the answer. */
  question: Buffer;
}

/**
 * The query in `msg`, or undefined for what is no standard query with exactly one question (a
 * response, another opcode, a compressed, oversized or non-hostname name). Records after the
 * question (EDNS) are ignored.
 */
export function parseQuery(msg: Buffer): DnsQuery | undefined {
  if (msg.length < HEADER + 5 || msg.length > MAX_QUERY_BYTES) return undefined;
  const flags = msg.readUInt16BE(2);
  const qr = flags >> 15;
  const opcode = (flags >> 11) & 0xf;
  if (qr !== 0 || opcode !== 0 || msg.readUInt16BE(4) !== 1 || msg.readUInt16BE(6) !== 0) return undefined;
  const labels: string[] = [];
  let off = HEADER;
  for (;;) {
    const len = msg[off];
    if (len === undefined || len > 63) return undefined; // 0xc0 and up: a pointer, never in a query's first name
    off += 1;
    if (len === 0) break;
    if (off + len > msg.length) return undefined;
    const label = msg.subarray(off, off + len).toString("latin1");
    if (!/^[A-Za-z0-9_-]+$/.test(label)) return undefined;
    labels.push(label.toLowerCase());
    off += len;
  }
  if (off + 4 > msg.length) return undefined;
  const name = labels.join(".");
  if (name.length === 0 || name.length > MAX_NAME) return undefined;
  return {
    id: msg.readUInt16BE(0),
    recursionDesired: (flags & 0x0100) !== 0,
    name,
    type: msg.readUInt16BE(off),
    class: msg.readUInt16BE(off + 2),
    question: Buffer.from(msg.subarray(HEADER, off + 4)),
  };
}

export const isInternetClass = (q: DnsQuery): boolean => q.class === QCLASS_IN;

/** The answer to `q`: `rcode`, and for NOERROR the given IPv4 addresses as A records. */
export function answer(q: DnsQuery, rcode: Rcode, addresses: readonly string[] = [], ttl = 0): Buffer {
  const records = rcode === RCODE.noError ? addresses : [];
  const header = Buffer.alloc(HEADER);
  header.writeUInt16BE(q.id, 0);
  // QR, RD as asked, RA, the response code.
  header.writeUInt16BE(0x8000 | (q.recursionDesired ? 0x0100 : 0) | 0x0080 | rcode, 2);
  header.writeUInt16BE(1, 4);
  header.writeUInt16BE(records.length, 6);
  const rrs = records.map((a) => {
    const rr = Buffer.alloc(16);
    rr.writeUInt16BE(0xc000 | HEADER, 0); // the name: a pointer to the question's
    rr.writeUInt16BE(QTYPE_A, 2);
    rr.writeUInt16BE(QCLASS_IN, 4);
    rr.writeUInt32BE(ttl, 6);
    rr.writeUInt16BE(4, 10);
    a.split(".").forEach((octet, i) => rr.writeUInt8(Number(octet), 12 + i));
    return rr;
  });
  return Buffer.concat([header, q.question, ...rrs]);
}

/** FORMERR for a message whose header could be read but not its question. */
export function formatError(msg: Buffer): Buffer | undefined {
  if (msg.length < HEADER || (msg.readUInt16BE(2) & 0x8000) !== 0) return undefined;
  const header = Buffer.alloc(HEADER);
  header.writeUInt16BE(msg.readUInt16BE(0), 0);
  header.writeUInt16BE(0x8000 | RCODE.formErr, 2);
  return header;
}
