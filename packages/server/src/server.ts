import { mkdir } from "node:fs/promises";
import { join } from "node:path";
import websocket from "@fastify/websocket";
import Fastify, { type FastifyBaseLogger, type FastifyInstance } from "fastify";
import { pino, type Logger as PinoLogger } from "pino";
import { BothyError } from "@bothy/protocol";
import { agentToolRoutes } from "./api/agent-tool-routes.ts";
import { commandRoutes } from "./api/command-routes.ts";
import { eventRoutes } from "./api/event-routes.ts";
import { fileRoutes } from "./api/file-routes.ts";
import { lifecycleRoutes } from "./api/lifecycle-routes.ts";
import { metricsRoutes } from "./api/metrics-routes.ts";
import { openapiRoutes, recordRoutes, type RouteRecord } from "./api/openapi.ts";
import { sendProblem } from "./api/problem.ts";
import { sandboxRoutes } from "./api/sandbox-routes.ts";
import { CommandRegistry } from "./commands/command-registry.ts";
import { EventBus } from "./events/event-bus.ts";
import { WebhookSender } from "./events/webhook.ts";
import type { Config } from "./config.ts";
import { createDrivers } from "./drivers/driver-registry.ts";
import { TemplateStore } from "./images/template-store.ts";
import { Ledger } from "./ledger/ledger.ts";
import { Metrics } from "./metrics/metrics.ts";
import { DisconnectWatch } from "./sandboxes/disconnect-watch.ts";
import { SandboxManager, type Logger, type TemplateSource } from "./sandboxes/sandbox-manager.ts";
import { IdleSleep } from "./sandboxes/idle-sleep.ts";
import { UsageMeter } from "./metering/usage-meter.ts";
import { usageRoutes } from "./api/usage-routes.ts";
import { Sweeper } from "./sandboxes/sweeper.ts";

export interface BothyServer {
  app: FastifyInstance;
  manager: SandboxManager;
  ledger: Ledger;
  events: EventBus;
  templates: TemplateStore;
  /** The address it listens on, e.g. http://127.0.0.1:8080 */
  url: string;
  /** Every route it serves, as registered (for the OpenAPI completeness test). */
  routes: readonly RouteRecord[];
  close(): Promise<void>;
}

export function createLogger(config: Config, destination?: NodeJS.WritableStream): PinoLogger {
  return pino({ level: config.logLevel, base: { service: "bothy" } }, destination ?? process.stdout);
}

/** Builds and starts the server: ledger, driver preflight, reconcile, routes, listen. */
export async function startServer(
  config: Config,
  logger: PinoLogger = createLogger(config),
  templates?: TemplateSource,
): Promise<BothyServer> {
  await mkdir(config.home, { recursive: true, mode: 0o700 });
  // Every logged event also feeds the metrics' counters.
  const metrics = new Metrics();
  const log: Logger = (event, fields) => {
    metrics.observe(event, fields);
    logger.info({ event, ...fields }, event);
  };
  const store = new TemplateStore({ sourceDir: config.templateSources, storeDir: config.templatesDir });
  const ledger = new Ledger(join(config.home, "ledger.sqlite"));
  const drivers = await createDrivers(config, log);
  const events = new EventBus(ledger);
  const webhook = config.webhook && new WebhookSender({ ...config.webhook, attempts: 6, timeoutMs: 10_000, log });
  if (webhook) events.subscribe((ev) => webhook.send(ev));
  const registry = new CommandRegistry(ledger, {
    replayBytes: config.commandReplayBytes,
    keepFinished: 50,
    log,
    onExited: (info) => {
      events.publish("command.exited", info.sandbox_id, info);
      // Idle sleep counts from the end of the last command.
      manager.touch(info.sandbox_id);
    },
  });
  // The manager reports lifecycle steps through this hook: logged, and the ones clients care
  // about become events.
  const lifecycle: Logger = (event, fields) => {
    log(event, fields);
    const id = typeof fields["sandbox_id"] === "string" ? fields["sandbox_id"] : null;
    if (event === "sandbox_created") events.publish("sandbox.created", id, fields);
    else if (event === "sandbox_deleted") {
      if (id) registry.forget(id);
      events.publish("sandbox.deleted", id, fields);
    } else if (event === "sandbox_lost") events.publish("sandbox.failed", id, { ...fields, reason: event });
    else if (event === "sandbox_died" || event === "sandbox_slept")
      events.publish("sandbox.stopped", id, { ...fields, reason: event });
    else if (event === "sandbox_woken") events.publish("sandbox.woken", id, fields);
  };
  const manager = new SandboxManager(config, ledger, drivers, templates ?? store, lifecycle);
  await manager.reconcile();
  const sweeper = new Sweeper(manager, ledger, drivers, config.lifecycle.sweepIntervalMs, lifecycle);
  const watch = new DisconnectWatch(manager, ledger, lifecycle);
  const idle = new IdleSleep(manager, registry, watch, config.lifecycle.idleTimeoutMs, lifecycle);
  sweeper.addStep(() => idle.pass());
  const meter = new UsageMeter(ledger, events, config.metering, (event, fields) =>
    logger.warn({ event, ...fields }, event),
  );

  const startedAt = Date.now();
  const app = Fastify({
    loggerInstance: logger.child({}, { level: "warn" }) as FastifyBaseLogger,
    bodyLimit: config.bodyLimitBytes,
    return503OnClosing: true,
    forceCloseConnections: true,
  });
  // JSON only: a text body would otherwise reach validation as a string and get a vaguer error.
  app.removeContentTypeParser("text/plain");
  await app.register(websocket, { options: { maxPayload: 2 * 1024 * 1024 } });
  const routes = recordRoutes(app);

  const logProblem = (err: BothyError): void => {
    metrics.error(err.code);
    if (err.status >= 500) logger.error({ event: "request_error", code: err.code, err: err.cause ?? err }, err.message);
  };
  app.setErrorHandler((err, request, reply) => sendProblem(reply, request, err, logProblem));
  app.setNotFoundHandler((request, reply) =>
    sendProblem(
      reply,
      request,
      new BothyError(
        "route_not_found",
        `No route ${request.method} ${request.url.split("?")[0]}; see the README for the API.`,
      ),
      logProblem,
    ),
  );

  sandboxRoutes(app, manager, startedAt);

  lifecycleRoutes(app, manager);
  metricsRoutes(app, metrics, () => ({
    sandboxes: ledger.countByStateAndDriver(),
    drivers: drivers.all().map((d) => d.name),
  }));
  commandRoutes(app, manager, registry, watch);
  eventRoutes(app, events);
  await fileRoutes(app, manager);
  await agentToolRoutes(app, config, logger);
  usageRoutes(app, meter, ledger);
  openapiRoutes(app);

  const address = await app.listen({ host: config.host, port: config.port });
  logger.info({ event: "listening", address }, `bothy listening on ${address}`);
  sweeper.start();
  meter.start();

  let closing: Promise<void> | undefined;
  return {
    app,
    manager,
    ledger,
    events,
    templates: store,
    url: address,
    routes,
    close: () => {
      closing ??= (async () => {
        watch.close();
        await sweeper.stop();
        meter.stop();
        await app.close();
        await manager.close();
        await drivers.close();
        webhook?.close();
        ledger.close();
      })();
      return closing;
    },
  };
}
