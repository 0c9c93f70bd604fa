/** A resolver on loopback for in-process gateway tests: every A query is answered with 127.0.0.1 (TTL 0). */
import { createSocket } from "node:dgram";
import { once } from "node:events";

export async function loopbackDns(
  host = "127.0.0.1",
): Promise<{ server: string; close: () => void; queries: () => number }> {
  const sock = createSocket("udp4");
  let queries = 0;
  sock.on("message", (msg, from) => {
    queries++;
    let off = 12;
    while (msg[off] !== 0) off += (msg[off] ?? 0) + 1;
    const header = Buffer.from(msg.subarray(0, 12));
    header.writeUInt16BE(0x8180, 2);
    header.writeUInt16BE(1, 6);
    const answer = Buffer.from([0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4, 127, 0, 0, 1]);
    sock.send(Buffer.concat([header, msg.subarray(12, off + 5), answer]), from.port, from.address);
  });
  sock.bind(0, host);
  await once(sock, "listening");
  return { server: `${host}:${sock.address().port}`, close: () => sock.close(), queries: () => queries };
}
