/**
 * Kept-alive connections from the port proxy to one port of one sandbox over its network, so a
 * page's requests after the first skip the TCP handshake through the sandbox's network stack.
 *
 * What makes reuse safe:
 * - A pool belongs to one run of one sandbox: it is keyed by the sandbox's agent connection
 *   (a new one after every boot or wake) and the port, and is destroyed, its idle and busy sockets
 *   alike, when that connection closes (stop, sleep, delete, failure). A socket is never handed to
 *   a request for another sandbox, another port or a later run, even one that gets the same address.
 * - Only a connection whose response arrived whole goes back to the pool (Node's client frees a
 *   socket after a complete response only); the proxy destroys the request, and with it the
 *   socket, when its client goes away before that.
 * - Every client of the pool reaches the same app, which decides every answer anyway: a guest that
 *   answers out of turn on a pooled connection can only mislead clients of its own port.
 *
 * Bounded: at most MAX_IDLE idle sockets per sandbox and port, each closed after IDLE_MS (or
 * sooner when the app's Keep-Alive header says so); busy sockets are one per request in flight,
 * as without a pool.
 */
import { Agent, type RequestOptions } from "node:http";
import type { Socket } from "node:net";
import type { Duplex } from "node:stream";
import { BothyError } from "@bothy/protocol";
import type { AgentClient } from "../agent/agent-client.ts";

/** Idle sockets kept per sandbox and port: a browser opens about six connections per origin. */
const MAX_IDLE = 8;
/** How long an idle socket is kept: below the 5 s keep-alive timeout Node's servers default to, so the app seldom closes one as it is reused. */
const IDLE_MS = 4_000;
/** The request option that carries a socket the dialer connected for that request. */
const DIALED = Symbol("bothy.portPool.dialed");

/** The socket dialed for one request; `taken` once the agent used it (the agent copies the options, not this). */
interface DialedSlot {
  socket: Socket;
  taken: boolean;
}
type DialedOptions = RequestOptions & { [DIALED]?: DialedSlot };

/** One sandbox's port: an http.Agent whose new connections are the ones the dialer made. */
export class PortPool {
  readonly agent: Agent;
  private readonly name: string;
  private closed = false;

  constructor(
    readonly address: string,
    readonly port: number,
  ) {
    this.agent = new Agent({ keepAlive: true, maxFreeSockets: MAX_IDLE, timeout: IDLE_MS, scheduling: "lifo" });
    // The dialer connects (and falls back to the guest channel) before a request is made; the agent
    // only ever takes that socket. A request without one fails rather than dial on its own.
    this.agent.createConnection = (options: DialedOptions, done?: (err: Error | null, stream: Duplex) => void) => {
      const slot = options[DIALED];
      if (slot === undefined || slot.taken || this.closed) {
        // Node's agent takes (err) alone on failure; the type asks for a stream too.
        done?.(
          new BothyError("sandbox_not_running", "The sandbox's port connections were closed; retry."),
          null as never,
        );
        return undefined;
      }
      slot.taken = true;
      return slot.socket;
    };
    this.name = this.agent.getName({ host: address, port });
  }

  /** Whether an idle connection waits: a request made now takes it instead of a new one. */
  hasIdle(): boolean {
    return !this.closed && (this.agent.freeSockets[this.name]?.length ?? 0) > 0;
  }

  get isClosed(): boolean {
    return this.closed;
  }

  /**
   * Options for `http.request` through this pool: an idle socket if one waits, else `dialed`
   * (which the caller must destroy if `unused` says the agent took an idle one after all).
   */
  requestOptions(dialed: Socket | undefined): { options: RequestOptions; unused: () => boolean } {
    const options: DialedOptions = { agent: this.agent, host: this.address, port: this.port };
    if (dialed !== undefined) {
      const slot: DialedSlot = { socket: dialed, taken: false };
      options[DIALED] = slot;
      // Read right after http.request returns: the agent has taken an idle socket or this one by then.
      return { options, unused: () => !slot.taken };
    }
    return { options, unused: () => false };
  }

  /** Sockets open now, idle and busy. */
  size(): number {
    const count = (sets: NodeJS.ReadOnlyDict<unknown[]>): number =>
      Object.values(sets).reduce((n, list) => n + (list?.length ?? 0), 0);
    return count(this.agent.freeSockets) + count(this.agent.sockets);
  }

  destroy(): void {
    this.closed = true;
    this.agent.destroy();
  }
}

/** Every sandbox's pools, each run's dropped when its agent connection closes. */
export class PortPools {
  private readonly byRun = new Map<AgentClient, Map<number, PortPool>>();

  /** The pool for `port` of the sandbox run behind `client`, at `address` (its allocation's). */
  get(client: AgentClient, address: string, port: number): PortPool {
    let ports = this.byRun.get(client);
    if (ports === undefined) {
      ports = new Map();
      this.byRun.set(client, ports);
      // Runs at once if the connection is already closed: no pool outlives its run.
      client.onClose(() => this.drop(client));
      if (!this.byRun.has(client))
        throw new BothyError("sandbox_not_running", "The sandbox stopped while its port was being opened; retry.");
    }
    let pool = ports.get(port);
    if (pool === undefined || pool.isClosed || pool.address !== address) {
      pool?.destroy();
      pool = new PortPool(address, port);
      ports.set(port, pool);
    }
    return pool;
  }

  /** Sockets open in every pool (metrics: bothy_port_pool_sockets). */
  size(): number {
    let n = 0;
    for (const ports of this.byRun.values()) for (const pool of ports.values()) n += pool.size();
    return n;
  }

  /** Ends every pooled connection (the server is stopping). */
  closeAll(): void {
    for (const client of [...this.byRun.keys()]) this.drop(client);
  }

  private drop(client: AgentClient): void {
    const ports = this.byRun.get(client);
    this.byRun.delete(client);
    for (const pool of ports?.values() ?? []) pool.destroy();
  }
}
