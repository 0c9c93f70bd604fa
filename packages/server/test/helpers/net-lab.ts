import { mkdtemp, rm } from "node:fs/promises";
import { afterAll, beforeAll } from "vitest";
import { api } from "./client.ts";
import { NetTopology } from "./net-topology.ts";
import type { ServeProcess } from "./serve-process.ts";

/**
 * The network lab (net-topology.ts) and the real `bothy serve` of one throw-away home in its
 * `host` namespace, with gVisor as the default driver: what the network tests share.
 */
export class NetLab {
  readonly topo: NetTopology;
  /** Sandboxes the tests made, deleted at the end (one the test deleted itself is fine). */
  readonly made: string[] = [];
  home = "";
  /** The running server's URL (each start listens on a new port). */
  base = "";
  private current: ServeProcess | undefined;

  /** `env` is asked at each start: it may use the lab's files (the test CA is made with the lab). */
  constructor(
    private readonly name: string,
    private readonly env: (topo: NetTopology) => Record<string, string>,
    topology: ConstructorParameters<typeof NetTopology>[0] = {},
  ) {
    this.topo = new NetTopology(topology);
  }

  /** The server started last. */
  get server(): ServeProcess {
    if (!this.current) throw new Error("the network lab's server has not been started");
    return this.current;
  }

  async open(): Promise<void> {
    this.home = await mkdtemp(`/tmp/bothy-${this.name}-`);
    await this.topo.create();
    await this.start();
  }

  /** Starts a server on the lab's home and waits until it listens. */
  async start(): Promise<void> {
    this.current = this.topo.serveInHost(this.home, { BOTHY_DRIVER: "gvisor", ...this.env(this.topo) });
    this.base = await this.current.url;
  }

  /** Ends the server, cleanly (`stop`) or as a crash (`kill`), and starts the next one on the same home. */
  async restart(how: "stop" | "kill"): Promise<void> {
    await (how === "stop" ? this.current?.stop() : this.current?.kill());
    await this.start();
  }

  /** Deletes what the tests made, stops the server, removes the lab and the home. */
  async close(): Promise<void> {
    try {
      for (const id of this.made) await api(this.base, "DELETE", `/sandboxes/${id}`).catch(() => undefined);
      await this.current?.stop();
    } finally {
      await this.topo.destroy();
      if (this.home) await rm(this.home, { recursive: true, force: true });
    }
  }
}

/**
 * For the enclosing describe: a network lab opened before its first test and closed after its
 * last. `name` names the home (/tmp/bothy-NAME-…); `env` adds to or overrides the server's;
 * `topology` is passed to the lab's NetTopology.
 */
export function useNetLab(
  name: string,
  env: (topo: NetTopology) => Record<string, string> = () => ({}),
  topology: ConstructorParameters<typeof NetTopology>[0] = {},
): NetLab {
  const lab = new NetLab(name, env, topology);
  beforeAll(() => lab.open());
  afterAll(() => lab.close());
  return lab;
}
