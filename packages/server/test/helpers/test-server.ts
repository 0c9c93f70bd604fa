import { mkdtemp, readFile, rm } from "node:fs/promises";
import { createWriteStream } from "node:fs";
import { join } from "node:path";
import { loadConfig, startServer, createLogger, type BothyServer, type Config } from "../../src/index.ts";
import { testKernelDir, testTemplatesDir } from "../../../../test/paths.ts";
import type { TemplateSource } from "../../src/sandboxes/sandbox-manager.ts";
import type { ServerEvent } from "../../src/events/server-events.ts";
import { hostLeaks, type HostLeaks } from "./host-state.ts";

export interface TestServer {
  server: BothyServer;
  url: string;
  wsUrl: string;
  home: string;
  logPath: string;
  /** Every event the server emitted so far, start-up included. */
  events: ServerEvent[];
  config: Config;
  /** The admin key of its `default` tenant (the one test/auth-setup.ts has every client send). */
  apiKey: string;
  /** Stops the server and removes its home; reports what the host still holds of it. */
  stop(): Promise<HostLeaks>;
}

/**
 * A real bothy server on loopback with a throw-away BOTHY_HOME, real runsc and real SQLite.
 * Templates come from the shared test cache so they are built only once per machine.
 */
export async function startTestServer(
  env: Record<string, string> = {},
  templates?: TemplateSource,
): Promise<TestServer> {
  const home = await mkdtemp("/tmp/bothy-test-");
  const config = loadConfig({
    ...process.env,
    BOTHY_HOME: home,
    BOTHY_TEMPLATES_DIR: testTemplatesDir(),
    BOTHY_KERNEL_DIR: testKernelDir(),
    BOTHY_PORT: "0",
    BOTHY_HOST: "127.0.0.1",
    BOTHY_POOL_SIZE: "0",
    BOTHY_LOG_LEVEL: "info",
    // The network battery (network.test.ts) turns it on inside namespaces it builds itself.
    BOTHY_NETWORK: "off",
    ...env,
  });
  const logPath = join(home, "server.log");
  const events: ServerEvent[] = [];
  const server = await startServer(config, createLogger(config, createWriteStream(logPath)), {
    ...(templates ? { templates } : {}),
    onEvent: (ev) => events.push(ev),
  });
  return {
    server,
    url: server.url,
    wsUrl: server.url.replace(/^http/, "ws"),
    home,
    logPath,
    events,
    config,
    apiKey: (await readFile(join(home, "admin.key"), "utf8")).trim(),
    stop: async () => {
      await server.close();
      const leaks = await hostLeaks(home);
      await rm(home, { recursive: true, force: true });
      return leaks;
    },
  };
}
