/**
 * A body relayed through the port proxy as it comes: a response from a sandbox's app to its
 * client, a request's body from the client to the app.
 *
 * `pipe` pauses its source whenever a write returns false, and a socket's write returns false for
 * any chunk larger than its 16 KiB high-water mark, however fast the kernel took it. Node reads
 * 64 KiB at a time, so a piped body was paused and resumed after every chunk: one chunk per turn
 * of the event loop, with a read stop and start on the upstream socket each (bench/ports --steps:
 * 763 pauses for 764 chunks of a 50 MB download). Here the upstream is paused only once the bytes
 * waiting for the client pass RELAY_HIGH_WATER, and resumed when they have drained: a client that
 * does not read still holds back the app inside (TCP's windows do the rest), and what waits here
 * for one message stays below RELAY_HIGH_WATER and a chunk.
 */
import type { OutgoingMessage } from "node:http";
import type { Readable } from "node:stream";

/** Bytes a message may hold for its reader before the body's source is paused. */
export const RELAY_HIGH_WATER = 256 * 1024;

/** Relays `from` into `to` and ends it; an error of `from` destroys `to`. */
export function relayBody(from: Readable, to: OutgoingMessage): void {
  from.on("data", (chunk: Buffer) => {
    to.write(chunk);
    if (to.writableLength >= RELAY_HIGH_WATER) from.pause();
  });
  // Emitted once a write that returned false has drained, so a pause above is always followed by one.
  to.on("drain", () => from.resume());
  from.once("end", () => to.end());
  from.once("error", () => to.destroy());
}
