/**
 * How the host reaches a port inside a sandbox. Where the sandbox has a network, the host dials
 * the sandbox's own address (from its allocation in network/host-network.ts, never from the
 * request): a kernel socket, so bytes move at the speed of the link and backpressure is TCP's own.
 * Where that connect fails (a server bound to the sandbox's 127.0.0.1 only, as the code
 * interpreter's is, answers it with a reset) and where the sandbox has no network, the connection
 * goes over the guest channel (`AgentClient.openTcp`) to 127.0.0.1 inside, as before: every port
 * that worked over the channel still works.
 *
 * Plain HTTP requests keep their direct connections alive per sandbox run and port (port-pool.ts):
 * `upstream` hands out an idle one when it can, else dials as `open` does.
 *
 * The host's own connection is the only one the network rules let through (nft-ruleset.ts: replies
 * to the host's connections, from the interface's own address); a sandbox still reaches neither the
 * host nor another sandbox.
 */
import { connect, type Socket } from "node:net";
import type { Duplex } from "node:stream";
import { BothyError } from "@bothy/protocol";
import type { AgentClient } from "../agent/agent-client.ts";
import { type PortPool, PortPools } from "./port-pool.ts";

/** Why a connection took the path it did: the direct path, or the channel and the reason for it. */
export const PORT_ROUTES = ["direct", "no_network", "refused", "unreachable"] as const;
export type PortRoute = (typeof PORT_ROUTES)[number];

/** What the dialer needs of the manager: a running sandbox's agent (it throws for any other). */
export interface AgentSource {
  agent(id: string): Promise<AgentClient>;
}

/** What the dialer needs of the host's networking: a sandbox's own address, if it has one. */
export interface GuestAddresses {
  guestAddress(sandboxId: string): string | undefined;
}

/**
 * Where one HTTP request goes: through a sandbox's pool (an idle kept-alive socket, or `dialed`, a
 * new direct one the pool keeps after the response), or over a channel stream of its own.
 */
export type Upstream = { pool: PortPool; dialed?: Socket } | { tunnel: Duplex };

/**
 * How long a direct connect may take before the channel is used instead: a guest that drops the
 * connect (its own firewall) is not refused, and would otherwise hold the request for minutes.
 */
const DIRECT_CONNECT_MS = 5_000;

export class PortDialer {
  private readonly counts = new Map<PortRoute, number>(PORT_ROUTES.map((r) => [r, 0]));
  private readonly pools = new PortPools();

  constructor(
    private readonly agents: AgentSource,
    /** Absent: this server gives sandboxes no network (BOTHY_NETWORK=off); every port goes over the channel. */
    private readonly network: GuestAddresses | undefined,
  ) {}

  /**
   * A connection to `port` in running sandbox `id`, socket-like either way. It ends when the
   * sandbox stops running (its agent closes), whichever path it took. Fails as `openTcp` does
   * (`port_not_listening`, `sandbox_not_running`, …) when neither path connects.
   */
  async open(id: string, port: number): Promise<Duplex> {
    const agent = await this.agents.agent(id);
    const address = this.network?.guestAddress(id);
    if (address === undefined) {
      this.count("no_network");
      return agent.openTcp(port);
    }
    const dialed = await dial(address, port);
    if (typeof dialed === "string") {
      this.count(dialed);
      return agent.openTcp(port);
    }
    this.count("direct");
    // The sandbox's link goes with it: no reset would ever come, so the socket is ended here.
    const off = agent.onClose(() => dialed.destroy());
    dialed.once("close", off);
    return dialed;
  }

  /**
   * For one HTTP request to `port` in running sandbox `id`: an idle pooled connection where the
   * sandbox has a network and one waits; else a new connection as `open` makes (a direct one joins
   * the pool after its response). `fresh`: never an idle one (a retry after a reused socket failed).
   */
  async upstream(id: string, port: number, fresh = false): Promise<Upstream> {
    const agent = await this.agents.agent(id);
    const address = this.network?.guestAddress(id);
    if (address === undefined) {
      this.count("no_network");
      return { tunnel: await agent.openTcp(port) };
    }
    const pool = this.pools.get(agent, address, port);
    if (!fresh && pool.hasIdle()) return { pool };
    const dialed = await dial(address, port);
    if (typeof dialed === "string") {
      this.count(dialed);
      return { tunnel: await agent.openTcp(port) };
    }
    if (pool.isClosed) {
      // The sandbox stopped during the connect: its run's pool is gone, and so is this socket.
      dialed.destroy();
      throw new BothyError("sandbox_not_running", `Sandbox ${id} stopped while its port ${port} was being opened.`);
    }
    this.count("direct");
    return { pool, dialed };
  }

  /** Sockets the pools hold open (metrics: bothy_port_pool_sockets). */
  pooledSockets(): number {
    return this.pools.size();
  }

  /** Ends every pooled connection (the server is stopping). */
  closeAll(): void {
    this.pools.closeAll();
  }

  /** Connections opened so far, by route (metrics: bothy_port_connections_total). */
  routes(): Record<PortRoute, number> {
    return Object.fromEntries(this.counts) as Record<PortRoute, number>;
  }

  private count(route: PortRoute): void {
    this.counts.set(route, (this.counts.get(route) ?? 0) + 1);
  }
}

/** A connected socket, or why not: refused (nothing listens on the address), or any other failure. */
function dial(host: string, port: number): Promise<Socket | "refused" | "unreachable"> {
  return new Promise((resolve) => {
    const socket = connect({ host, port, noDelay: true });
    const timer = setTimeout(() => fail("unreachable"), DIRECT_CONNECT_MS);
    function fail(why: "refused" | "unreachable"): void {
      clearTimeout(timer);
      socket.removeAllListeners("connect");
      socket.destroy();
      resolve(why);
    }
    socket.once("error", (err: NodeJS.ErrnoException) => fail(err.code === "ECONNREFUSED" ? "refused" : "unreachable"));
    socket.once("connect", () => {
      clearTimeout(timer);
      socket.removeAllListeners("error");
      // An error before the caller listens must not be thrown: the socket is destroyed by it, and
      // the caller sees that as its close.
      socket.on("error", () => undefined);
      resolve(socket);
    });
  });
}
