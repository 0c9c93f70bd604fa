import { constants } from "node:os";
import { createLogger, loadConfig, startServer, TemplateStore } from "@bothy/server";
import { templateBuild } from "./template-build.ts";

/** `bothy serve`: builds the default template on first run, then serves until SIGINT/SIGTERM. */
export async function serve(_args: string[]): Promise<number> {
  const config = loadConfig();
  const store = new TemplateStore({ sourceDir: config.templateSources, storeDir: config.templatesDir });
  if (!(await store.resolve("seed"))) {
    process.stderr.write("bothy: building the default template `seed` (first run; a few minutes)\n");
    const code = await templateBuild(["seed"]);
    if (code !== 0) return code;
  }
  // A start-up step that waits on nothing that can wake it would let Node exit 0 in silence.
  const stalled = (): void => {
    process.stderr.write(
      "bothy: start-up stalled (a step waited on nothing that could finish it); this is a bug, please report it\n",
    );
    process.exit(1);
  };
  process.once("beforeExit", stalled);
  const logger = createLogger(config);
  // Listening before start-up: a signal that arrives while it runs stops the server once it is up.
  const stop = stopRequested(logger);
  let leaseLost!: () => void;
  const lost = new Promise<"lost">((resolve) => (leaseLost = () => resolve("lost")));
  const server = await startServer(config, logger, { onLeaseLost: () => leaseLost() });
  process.off("beforeExit", stalled);
  void server.manager.warm();
  if ((await Promise.race([stop, lost])) === "lost") {
    // Its sandboxes are left as they are (a successor may hold them); the restart takes them back.
    process.stderr.write(
      "bothy: this node lost its lease in the cluster; exiting so that a restart takes its sandboxes back\n",
    );
    await server.abandon();
    return LEASE_LOST_EXIT;
  }
  await server.close();
  return 0;
}

/** EX_TEMPFAIL: a supervisor (systemd's Restart=always, Kubernetes) starts the node again. */
const LEASE_LOST_EXIT = 75;

/**
 * Resolves at the first SIGINT or SIGTERM. A clean stop removes every sandbox's host objects, so a
 * second signal must not cut it short (operators press Ctrl-C twice); the third exits at once and
 * says what that leaves behind.
 */
function stopRequested(logger: ReturnType<typeof createLogger>): Promise<void> {
  return new Promise<void>((resolve) => {
    let received = 0;
    const onSignal = (signal: NodeJS.Signals): void => {
      received++;
      if (received === 1) {
        logger.info({ event: "server_stopping", signal }, "stopping sandboxes and exiting");
        process.stderr.write(`bothy: ${signal}, stopping sandboxes and exiting\n`);
        resolve();
      } else if (received === 2) {
        logger.warn({ event: "server_stop_under_way", signal }, "the stop is already under way");
        process.stderr.write(
          `bothy: ${signal}: the stop is already under way; send it once more to exit at once, leaving sandboxes' mounts and processes for the next start to remove\n`,
        );
      } else {
        logger.error({ event: "server_stop_forced", signal }, "exiting at once, before the stop finished");
        process.stderr.write(
          `bothy: ${signal}: exiting at once; sandboxes' mounts, processes and network are left, and the next \`bothy serve\` with this BOTHY_HOME removes them\n`,
        );
        process.exit(128 + constants.signals[signal]);
      }
    };
    process.on("SIGINT", onSignal);
    process.on("SIGTERM", onSignal);
  });
}
