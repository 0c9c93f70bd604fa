import { readFileSync } from "node:fs";
import { connect, type Socket } from "node:net";
import { MAX_LISTED_PORTS, OUTPUT_CHUNK_BYTES, OUTPUT_WINDOW_BYTES } from "@bothy/protocol";
import type { Channel } from "./channel.ts";

/** The state column of /proc/net/tcp{,6} for a listening socket. */
const TCP_LISTEN = "0A";
/** How long a connection to a guest port may take to open (loopback: refused at once, or accepted). */
const CONNECT_TIMEOUT_MS = 10_000;

export interface ListeningSocket {
  port: number;
  address: string;
}

/** /proc/net/tcp writes an IPv4 address as one little-endian 32-bit hex word. */
function ipv4(hex: string): string {
  return [3, 2, 1, 0].map((i) => parseInt(hex.slice(i * 2, i * 2 + 2), 16)).join(".");
}

/** /proc/net/tcp6 writes an IPv6 address as four little-endian 32-bit hex words. */
function ipv6(hex: string): string {
  const bytes: string[] = [];
  for (let word = 0; word < 4; word++)
    for (const b of [3, 2, 1, 0]) bytes.push(hex.slice(word * 8 + b * 2, word * 8 + b * 2 + 2));
  const groups: string[] = [];
  for (let i = 0; i < 16; i += 2) groups.push(`${bytes[i]}${bytes[i + 1]}`);
  // The URL parser writes the address in its canonical short form.
  return new URL(`http://[${groups.join(":")}]/`).hostname.slice(1, -1);
}

/** The listening sockets in one /proc/net/tcp (or, with `v6`, tcp6) table. */
export function parseListening(table: string, v6: boolean): ListeningSocket[] {
  const found: ListeningSocket[] = [];
  for (const line of table.split("\n").slice(1)) {
    const fields = line.trim().split(/\s+/);
    if (fields[3] !== TCP_LISTEN) continue;
    const [hexAddress, hexPort] = (fields[1] ?? "").split(":");
    if (hexAddress === undefined || hexPort === undefined) continue;
    found.push({ port: parseInt(hexPort, 16), address: v6 ? ipv6(hexAddress) : ipv4(hexAddress) });
  }
  return found;
}

/**
 * The TCP sockets listening in this guest, from the kernel's (or gVisor's) socket tables. Read
 * synchronously (small files): an asynchronous read would start libuv's thread pool, dear under
 * gVisor's ptrace, and the E2B code interpreter's proxy asks this before each of its requests.
 */
export async function listeningPorts(): Promise<ListeningSocket[]> {
  const found = new Map<string, ListeningSocket>();
  for (const [file, v6] of [
    ["/proc/net/tcp", false],
    ["/proc/net/tcp6", true],
  ] as const) {
    let table: string;
    try {
      table = readFileSync(file, "utf8");
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") continue; // no IPv6 in this guest
      throw err;
    }
    for (const socket of parseListening(table, v6)) found.set(`${socket.address}|${socket.port}`, socket);
  }
  return [...found.values()]
    .sort((a, b) => a.port - b.port || a.address.localeCompare(b.address))
    .slice(0, MAX_LISTED_PORTS);
}

/**
 * One TCP connection from the host to a port on this guest's loopback. The guest's bytes go out
 * under a credit window (the socket is paused while a window is unacknowledged or the channel is
 * congested), the host's are acknowledged once written to the socket, so neither side buffers
 * more than a window whatever the other's pace.
 */
export class TcpTunnel {
  private socket: Socket | undefined;
  private opened = false;
  private ended = false;
  private inflight = 0;
  private readonly stopDrainWatch: () => void;

  constructor(
    private readonly id: number,
    port: number,
    private readonly channel: Channel,
    private readonly onEnd: (id: number) => void,
  ) {
    this.stopDrainWatch = channel.onDrain(() => this.flow());
    this.open(port, ["127.0.0.1", "::1"]);
  }

  /**
   * Tries each loopback address in turn: a server may listen on only one of them. A refusal on one
   * address is the answer when a later one fails otherwise (a sandbox whose network has no IPv6
   * cannot even try ::1): nothing listens on the port.
   */
  private open(port: number, hosts: string[], refused = false): void {
    const [host, ...rest] = hosts;
    if (host === undefined) return;
    const socket = connect({ host, port, allowHalfOpen: true });
    this.socket = socket;
    socket.setTimeout(CONNECT_TIMEOUT_MS, () => socket.destroy(new Error(`connecting to port ${port} timed out`)));
    socket.once("connect", () => {
      socket.setTimeout(0);
      if (this.ended) return void socket.destroy();
      this.opened = true;
      this.channel.send({ t: "tcp_opened", id: this.id });
      socket.on("data", (chunk: Buffer) => this.forward(chunk));
      socket.on("end", () => this.channel.send({ t: "tcp_data", id: this.id, eof: true }));
    });
    socket.on("error", (err: NodeJS.ErrnoException) => {
      if (this.opened || this.ended) return; // the close below reports it
      if (err.code === "ECONNREFUSED" && rest.length > 0) return this.open(port, rest, true);
      this.finish();
      this.channel.send({
        t: "error",
        id: this.id,
        code: refused || err.code === "ECONNREFUSED" ? "refused" : "io_error",
        message: `port ${port}: ${err.message}`,
      });
    });
    socket.on("close", (hadError) => {
      if (!this.opened || this.ended) return;
      this.finish();
      this.channel.send({
        t: "tcp_closed",
        id: this.id,
        ...(hadError ? { error: "the connection inside the sandbox was reset" } : {}),
      });
    });
  }

  /** Bytes from the host; acknowledged once the socket has taken them. */
  write(data: Buffer, eof: boolean): void {
    const socket = this.socket;
    if (!socket || !this.opened || this.ended || socket.destroyed) return;
    if (data.length > 0) {
      const bytes = data.length;
      socket.write(data, (err) => {
        if (!err) this.channel.send({ t: "tcp_ack", id: this.id, bytes });
      });
    }
    if (eof) socket.end();
  }

  credit(bytes: number): void {
    this.inflight = Math.max(0, this.inflight - bytes);
    this.flow();
  }

  /** The host gave up on it (or is gone): reset the connection, report nothing more. */
  destroy(): void {
    if (this.ended) return;
    this.finish();
    this.socket?.destroy();
  }

  private forward(chunk: Buffer): void {
    for (let off = 0; off < chunk.length; off += OUTPUT_CHUNK_BYTES) {
      const part = chunk.subarray(off, off + OUTPUT_CHUNK_BYTES);
      this.inflight += part.length;
      this.channel.send({ t: "tcp_data", id: this.id, eof: false }, part);
    }
    this.flow();
  }

  private flow(): void {
    const socket = this.socket;
    if (!socket || !this.opened || this.ended) return;
    if (this.inflight >= OUTPUT_WINDOW_BYTES || this.channel.isCongested) socket.pause();
    else socket.resume();
  }

  private finish(): void {
    this.ended = true;
    this.stopDrainWatch();
    this.onEnd(this.id);
  }
}
