import { readFileSync } from "node:fs";
import type { IncomingMessage } from "node:http";
import { mkdir } from "node:fs/promises";
import { isIP } from "node:net";
import { join } from "node:path";
import websocket from "@fastify/websocket";
import Fastify, { type FastifyBaseLogger, type FastifyInstance, type FastifyRequest } from "fastify";
import { pino, type Logger as PinoLogger } from "pino";
import { BothyError } from "@bothy/protocol";
import { agentToolRoutes } from "./api/agent-tool-routes.ts";
import { approvalRoutes } from "./api/approval-routes.ts";
import { nodeRoutes } from "./api/node-routes.ts";
import { policyRoutes } from "./api/policy-routes.ts";
import { secretRoutes } from "./api/secret-routes.ts";
import { EgressCa } from "./gateway/egress-ca.ts";
import { Vault } from "./gateway/vault.ts";
import { secretTerminator } from "./gateway/tls-terminator.ts";
import { auditRoutes } from "./api/audit-routes.ts";
import { authRoutes } from "./api/auth-routes.ts";
import { authHooks, KeyConnections } from "./auth/auth-hooks.ts";
import { hostAllowed } from "./auth/host-check.ts";
import { KeyBindings } from "./auth/key-bindings.ts";
import { LinkTokens, linkGrant, redactToken } from "./auth/link-tokens.ts";
import { KeyRing } from "./auth/key-ring.ts";
import { Quotas } from "./auth/quotas.ts";
import { commandRoutes } from "./api/command-routes.ts";
import { eventRoutes } from "./api/event-routes.ts";
import { fileRoutes } from "./api/file-routes.ts";
import { lifecycleRoutes } from "./api/lifecycle-routes.ts";
import { metricsRoutes } from "./api/metrics-routes.ts";
import { openapiRoutes, recordRoutes, registerOpenapi, type RouteRecord } from "./api/openapi.ts";
import { portRoutes, previewHostRewrite } from "./api/port-routes.ts";
import { desktopRoutes } from "./api/desktop-routes.ts";
import { tunnelRoutes } from "./api/tunnel-routes.ts";
import { DesktopService } from "./desktop/desktop-service.ts";
import { DesktopStreams } from "./e2b/desktop-stream.ts";
import { answerClientError, answerExpectation, sendProblem } from "./api/problem.ts";
import { sandboxRoutes } from "./api/sandbox-routes.ts";
import { volumeRoutes } from "./api/volume-routes.ts";
import { snapshotRoutes } from "./api/snapshot-routes.ts";
import { SnapshotService } from "./snapshots/snapshot-service.ts";
import { VolumeMounts } from "./volumes/volume-mounts.ts";
import { VolumeService } from "./volumes/volume-service.ts";
import { checkWebSocketHandshakes } from "./api/websocket-handshake.ts";
import { countInFlight } from "./api/in-flight.ts";
import { uiRoutes } from "./api/ui-routes.ts";
import { uiSessionRoutes } from "./api/ui-session-routes.ts";
import { UiLinks } from "./auth/ui-links.ts";
import { sessionAuth } from "./auth/session-auth.ts";
import { UiSessions } from "./auth/ui-sessions.ts";
import { CommandRegistry } from "./commands/command-registry.ts";
import { EventBus } from "./events/event-bus.ts";
import { pruneEvents } from "./events/event-retention.ts";
import { EventStreams } from "./events/event-streams.ts";
import { RelayMeter } from "./api/relay-meter.ts";
import { PortDialer } from "./api/port-dialer.ts";
import { toPublicEvent } from "./events/public-events.ts";
import { EVENT_LEVELS, ServerEvents, type ServerEventListener } from "./events/server-events.ts";
import { WebhookSender } from "./events/webhook.ts";
import type { Config } from "./config.ts";
import { createDrivers } from "./drivers/driver-registry.ts";
import { e2bRoutes } from "./e2b/e2b-routes.ts";
import { AccessTokens } from "./e2b/access-token.ts";
import { e2bPortRewrite, e2bPortTrafficOf } from "./e2b/port-rewrite.ts";
import { TemplateStore } from "./images/template-store.ts";
import { openStore, type LedgerStore } from "./ledger/store.ts";
import { Metrics } from "./metrics/metrics.ts";
import { DisconnectWatch } from "./sandboxes/disconnect-watch.ts";
import { SandboxManager, type TemplateSource } from "./sandboxes/sandbox-manager.ts";
import { onSandboxFinal } from "./sandboxes/sandbox-final.ts";
import { IdleSleep } from "./sandboxes/idle-sleep.ts";
import { UsageMeter } from "./metering/usage-meter.ts";
import { usageRoutes } from "./api/usage-routes.ts";
import { Sweeper } from "./sandboxes/sweeper.ts";
import { nodeOffer, startClusterNode } from "./cluster/cluster-node.ts";
import { eventRetentionJob, usageJob } from "./cluster/leader-jobs.ts";
import { ClusterSecret } from "./cluster/cluster-secret.ts";
import { RequestRouter, routeAcrossNodes } from "./cluster/request-router.ts";
import { EgressProxy } from "./gateway/egress-proxy.ts";
import { gatewayLookup } from "./gateway/gateway-lookup.ts";
import { PolicyResolver } from "./network/policy-resolver.ts";
import { ApprovalBroker } from "./gateway/approvals.ts";

export interface BothyServer {
  app: FastifyInstance;
  manager: SandboxManager;
  ledger: LedgerStore;
  events: EventBus;
  /** Holds what an `ask` rule stops until a person decides (the egress proxy and the agent tools ask it). */
  approvals: ApprovalBroker;
  templates: TemplateStore;
  /** The address it listens on, e.g. http://127.0.0.1:8080 */
  url: string;
  /** Every route it serves, as registered (for the OpenAPI completeness test). */
  routes: readonly RouteRecord[];
  close(): Promise<void>;
  /**
   * Stops serving without touching a sandbox: for a node whose lease passed on (its sandboxes' VMs
   * may be a successor's now). What it held in memory is dropped with the process; the node's next
   * start takes its sandboxes back (start-up recovery attaches to those still running).
   */
  abandon(): Promise<void>;
}

export interface StartOptions {
  /** Where templates come from (default: the template store under the config's directories). */
  templates?: TemplateSource;
  /** Subscribes to the server's events from the first one on (start-up reconcile included). */
  onEvent?: ServerEventListener;
  /**
   * Called once this node of a cluster has lost its lease (it lapsed, or a successor took it): the
   * server already refuses every request and runs nothing periodic; the caller should `abandon` it
   * and exit, so that a restart takes the sandboxes back (`bothy serve` does).
   */
  onLeaseLost?: () => void;
}

/** Whether a listen address is loopback only (the one place plain HTTP and BOTHY_AUTH=none are allowed). */
export function isLoopbackHost(host: string): boolean {
  if (host === "localhost" || host === "::1" || host === "[::1]") return true;
  return isIP(host) === 4 && host.startsWith("127.");
}

/** Refuses configurations that would expose the API without TLS or without keys. */
function checkExposure(config: Config): void {
  if (isLoopbackHost(config.host)) return;
  if (config.auth.mode === "none")
    throw new Error(
      `BOTHY_AUTH=none is allowed only on loopback, and BOTHY_HOST is ${config.host}; remove BOTHY_AUTH or bind 127.0.0.1.`,
    );
  if (!config.tls && !config.insecureHttp)
    throw new Error(
      `BOTHY_HOST ${config.host} is not loopback: set BOTHY_TLS_CERT and BOTHY_TLS_KEY so the server speaks HTTPS, or BOTHY_INSECURE_HTTP=1 if a TLS proxy (e.g. Caddy) sits in front.`,
    );
}

export function createLogger(config: Config, destination?: NodeJS.WritableStream): PinoLogger {
  return pino({ level: config.logLevel, base: { service: "bothy" } }, destination ?? process.stdout);
}

/** URL rewrites before routing: E2B's port header, then E2B desktop streams and preview host names (when configured). */
function rewriteUrl(previewDomain: string | undefined, streams: DesktopStreams): (req: IncomingMessage) => string {
  const preview = previewDomain === undefined ? undefined : previewHostRewrite(previewDomain);
  const stream = previewDomain === undefined ? undefined : streams.rewrite(previewDomain);
  return (req) => e2bPortRewrite(req) ?? stream?.(req) ?? preview?.(req) ?? req.url ?? "/";
}

/** Builds and starts the server: ledger, driver preflight, reconcile, routes, listen. */
export async function startServer(
  config: Config,
  logger: PinoLogger = createLogger(config),
  options: StartOptions = {},
): Promise<BothyServer> {
  checkExposure(config);
  const tls = config.tls && { cert: readFileSync(config.tls.cert), key: readFileSync(config.tls.key) };
  await mkdir(config.home, { recursive: true, mode: 0o700 });
  // Read first: a missing or short cluster secret stops the start before anything is made.
  const clusterSecret =
    config.cluster?.secretFile === undefined ? undefined : await ClusterSecret.load(config.cluster.secretFile);
  // The server's typed events: logged at their level, counted by the metrics, and the ones
  // clients care about published as public events (below, once the registry exists).
  const serverEvents = new ServerEvents();
  const metrics = new Metrics();
  serverEvents.subscribe((ev) => logger[EVENT_LEVELS[ev.event]](ev, ev.event));
  serverEvents.subscribe((ev) => metrics.observe(ev));
  if (options.onEvent) serverEvents.subscribe(options.onEvent);
  const log = serverEvents.emit;
  const store = new TemplateStore({ sourceDir: config.templateSources, storeDir: config.templatesDir });
  const ledger = await openStore({ databaseUrl: config.databaseUrl, sqlitePath: join(config.home, "ledger.sqlite") });
  // The egress gateway listens before the network's rules are made: they redirect to its ports.
  const proxy = config.network.enabled ? new EgressProxy({ dns: config.network.dns, log }) : undefined;
  // Gateway sandboxes' DNS is answered by their policy (network/policy-resolver.ts).
  const resolver = config.network.enabled ? new PolicyResolver({ dns: config.network.dns }) : undefined;
  const gatewayPorts = proxy && resolver && { ...(await proxy.listen()), dns: await resolver.listen() };
  const drivers = await createDrivers(config, log, gatewayPorts).catch(async (err: unknown) => {
    await proxy?.close();
    await resolver?.close();
    throw err;
  });
  // Several machines: this node's lease in the shared PostgreSQL, taken before anything of its
  // sandboxes is touched (cluster/cluster-node.ts): start-up recovery then takes back the sandboxes
  // of the node's last holding, and the manager's writes for them are fenced by the epoch it holds.
  const cluster =
    config.cluster &&
    (await startClusterNode(config.cluster, config.home, await nodeOffer(config, drivers, store), ledger, logger));
  const sandboxLedger = cluster?.ledger ?? ledger;
  // Any node answers for any sandbox: requests about another node's go there, signed with the
  // cluster's secret, and creates go where placement puts them (cluster/request-router.ts).
  const router = cluster && clusterSecret ? new RequestRouter(cluster.node.id, clusterSecret, ledger) : undefined;
  if (cluster && !clusterSecret)
    logger.warn(
      { event: "cluster_routing_off" },
      "BOTHY_CLUSTER_SECRET_FILE is not set: this node forwards no request to another node and places every create here; set it (the same file on every node) so any node answers for any sandbox",
    );
  const managerConfig: Config =
    cluster && config.cluster ? { ...config, cluster: { ...config.cluster, nodeId: cluster.node.id } } : config;
  const events = new EventBus(ledger, (err) =>
    log("ledger_read_failed", { what: "the cluster's event feed", error: (err as Error).message }),
  );
  // Nobody waits for these: one the ledger refused is logged (its subscribers never see it).
  const publish = (...args: Parameters<EventBus["publish"]>): void =>
    void events
      .publish(...args)
      .catch((err: unknown) =>
        log("ledger_write_failed", { what: `event ${args[0]}`, sandbox_id: args[1], error: (err as Error).message }),
      );
  const webhook = config.webhook && new WebhookSender({ ...config.webhook, attempts: 6, timeoutMs: 10_000, log });
  if (webhook) events.subscribe((ev) => webhook.send(ev));
  const registry = new CommandRegistry(ledger, {
    replayBytes: config.commandReplayBytes,
    keepFinished: 50,
    log,
    onExited: (info) => {
      publish("command.exited", info.sandbox_id, info);
      // Idle sleep counts from the end of the last command; a pool's refill waits for a claim's first.
      manager.commandEnded(info.sandbox_id);
    },
  });
  serverEvents.subscribe((ev) => {
    const published = toPublicEvent(ev);
    if (published) publish(published.type, published.sandboxId, published.data, published.tenant);
  });
  onSandboxFinal(serverEvents, (id) => registry.forget(id));
  // The secrets vault and the CA guests trust for the egress gateway; both keys stay in $BOTHY_HOME/secrets.
  const vault = await Vault.open(config.home, ledger.secrets, config.vaultKeyFile);
  // On a database several nodes share, the keys each must hold alike come from the one vault key.
  const clusterKey = (purpose: string): Buffer | undefined =>
    ledger.dialect === "postgres" ? vault.derive(purpose) : undefined;
  const egressCa = await EgressCa.open(config.home);
  const quotas = new Quotas(ledger, config);
  const volumes = new VolumeService(ledger, quotas, new VolumeMounts(join(config.home, "volumes"), log), log);
  await mkdir(volumes.mounts.dir, { recursive: true, mode: 0o700 });
  const manager = new SandboxManager(
    managerConfig,
    sandboxLedger,
    drivers,
    options.templates ?? store,
    log,
    { vault, caPem: egressCa.caPem },
    volumes,
  );
  const approvals = new ApprovalBroker({
    rows: ledger.approvals,
    timeoutMs: config.approvals.timeoutMs,
    log,
    ...(cluster && {
      cluster: { nodeId: cluster.node.id, listen: ledger.listen },
    }),
  });
  await approvals.recover();
  if (resolver && drivers.network) resolver.attach(gatewayLookup(drivers.network, ledger, manager.policies));
  if (proxy && drivers.network)
    proxy.attach(gatewayLookup(drivers.network, ledger, manager.policies), {
      gate: approvals,
      terminate: secretTerminator({
        vault,
        leaves: egressCa,
        report: (sandboxId, { kind, ...use }) => log(kind, { sandbox_id: sandboxId, ...use }),
      }),
    });
  const snapshots = new SnapshotService({
    ledger,
    manager,
    quotas,
    templates: options.templates ?? store,
    home: config.home,
    limits: config.limits,
    log,
  });
  await manager.reconcile();
  // After reconcile: the sandboxes taken over have their layers mounted, which keeps them. The
  // template layers snapshots lie over are kept too (a forced rebuild replaces a build's layer).
  const removeOrphanLayers = async (by: "startup" | "sweeper"): Promise<void> => {
    const layers = await store.removeOrphanLayers(undefined, () => snapshots.templateLayers());
    if (layers.length > 0) log("layers_removed", { layers, by });
    await snapshots.removeOrphans(by);
  };
  await removeOrphanLayers("startup").catch((err: unknown) => log("sweep_failed", { error: (err as Error).message }));
  // After the take-overs re-held their volumes' mounts: the rest are leftovers.
  await volumes.removeOrphans("start-up", () => manager.ownedIds());
  const sweeper = new Sweeper(
    manager,
    sandboxLedger,
    drivers,
    config.lifecycle.sweepIntervalMs,
    log,
    cluster && (() => cluster.node.surelyHeld()),
  );
  sweeper.addStep(() => removeOrphanLayers("sweeper"));
  const watch = new DisconnectWatch(manager, ledger, log);
  const idle = new IdleSleep(manager, registry, watch, config.lifecycle.idleTimeoutMs, log);
  sweeper.addStep(() => idle.pass());
  sweeper.addStep(() => volumes.removeOrphans("sweeper", () => manager.ownedIds()));
  const meter = new UsageMeter(
    ledger,
    events,
    {
      ...config.metering,
      budgetOf: (t) => quotas.budgetOf(t),
      ...(cluster ? { running: () => ledger.nodes.seenSandboxes() } : {}),
    },
    log,
  );
  // What the whole cluster must do once runs on its leader only (cluster/leader-jobs.ts).
  if (cluster) {
    cluster.leader.register(usageJob(meter, config.metering.intervalMs));
    cluster.leader.register(eventRetentionJob(ledger, config.eventRetention, log, config.lifecycle.sweepIntervalMs));
  } else
    sweeper.addStep(async () => {
      await pruneEvents(ledger.events, config.eventRetention, log);
    });
  const ring = await KeyRing.open(config.home, ledger, clusterKey("api key pepper"));
  const bootstrapKey = await ring.bootstrap(config.home, config.auth.adminKey);
  if (bootstrapKey)
    logger.info(
      { event: "admin_key_created", key_id: bootstrapKey, file: join(config.home, "admin.key") },
      "first start: an admin key for the default tenant was written to $BOTHY_HOME/admin.key",
    );
  const connections = new KeyConnections();
  connections.follow(ledger, ring);

  const startedAt = Date.now();
  const logProblem = (err: BothyError): void => {
    metrics.error(err.code);
    // A bug or a failed boot is an error; a 5xx that names an expected condition (a port nobody
    // listens on, a guest past its deadline, a stop under way) is worth a warning only.
    if (err.code === "internal" || err.code === "create_failed")
      logger.error({ event: "request_error", code: err.code, err: err.cause ?? err }, err.message);
    else if (err.status >= 500)
      logger.warn(
        { event: "request_error", code: err.code, ...(err.cause === undefined ? {} : { err: err.cause }) },
        err.message,
      );
  };
  const routeNotFound = (request: FastifyRequest): BothyError =>
    new BothyError(
      "route_not_found",
      `No route ${request.method} ${request.url.split("?")[0]}; see the README or /openapi.json for the API.`,
    );
  // @e2b/desktop's live views, which the URL rewrite serves on their preview hosts.
  const streams = new DesktopStreams();
  // Every answer is problem+json, also those Fastify and Node's HTTP parser give before a route runs.
  const app = Fastify({
    // A link's token in a URL never reaches the log (Fastify logs request URLs at info).
    loggerInstance: logger.child(
      {},
      {
        level: "warn",
        serializers: {
          req: (req: { method?: string; url?: string }) => ({ method: req.method, url: redactToken(req.url ?? "") }),
        },
      },
    ) as FastifyBaseLogger,
    bodyLimit: config.bodyLimitBytes,
    // A request while closing gets `shutting_down` from the hook below, not Fastify's own 503.
    return503OnClosing: false,
    forceCloseConnections: true,
    frameworkErrors: (err, request, reply) => sendProblem(reply, request, err, logProblem),
    clientErrorHandler: (err, socket) => answerClientError(err, socket, logProblem),
    // Node answers a missing Host with a bare 400; the hook below answers it as problem+json.
    http: { requireHostHeader: false },
    rewriteUrl: rewriteUrl(config.previewDomain, streams),
    ...(tls ? { https: tls } : {}),
  }) as unknown as FastifyInstance;
  app.server.on("checkExpectation", (req, res) => answerExpectation(req, res, logProblem));
  // JSON only: a text body would otherwise reach validation as a string and get a vaguer error.
  app.removeContentTypeParser("text/plain");
  await app.register(websocket, { options: { maxPayload: 2 * 1024 * 1024 } });
  await registerOpenapi(app);
  const routes = recordRoutes(app);
  checkWebSocketHandshakes(app, routes);

  // A cluster node's requests in flight, counted from the first hook on (abandon, below).
  const inFlight = cluster && countInFlight(app);
  let stopping = false;
  let leaseLost = false;
  app.addHook("preClose", async () => {
    stopping = true;
  });
  const hostNames = { bindHost: config.host, previewDomain: config.previewDomain };
  // Refusals that hold for every route, before its own checks.
  app.addHook("onRequest", async (request) => {
    if (leaseLost)
      throw new BothyError(
        "lease_lost",
        "This node lost its lease in the cluster (it was cut off from the database or paused past it): it serves nothing until it restarts and takes its sandboxes back. Retry shortly.",
      );
    if (stopping) throw new BothyError("shutting_down", "The server is stopping; retry once it is back.");
    const host = request.headers.host;
    if (request.raw.httpVersion === "1.1" && host === undefined)
      throw new BothyError("malformed_request", "An HTTP/1.1 request needs a Host header (RFC 9112); send one.");
    // Without keys, a web page must not be able to act through a name it made resolve here (host-check.ts).
    if (config.auth.mode === "none" && host !== undefined && !hostAllowed(host, hostNames))
      throw new BothyError(
        "host_not_allowed",
        `This server runs without API keys (BOTHY_AUTH=none) and answers only to localhost, loopback addresses, BOTHY_HOST and BOTHY_PREVIEW_DOMAIN, not to Host ${JSON.stringify(host.slice(0, 100))}; open it by one of those names (such as localhost or 127.0.0.1), or run it with API keys.`,
      );
  });
  // Several machines: a request for another node's sandbox, and a create placed on another node, go
  // there before this node authenticates it (the owner does; cluster/request-router.ts).
  if (router) routeAcrossNodes(app, router);
  const bindings = new KeyBindings(ring, ledger, config.auth.mode);
  const e2bTokens = await AccessTokens.load(config.home, bindings, clusterKey("envd token key"));
  const links = await LinkTokens.load(config.home, bindings, clusterKey("link key"));
  const viaLink = linkGrant(links);
  const sessions = new UiSessions(ledger, ring);
  const uiLinks = new UiLinks(ledger, ring);
  const secureCookies = config.tls !== undefined || config.insecureHttp;
  authHooks(app, {
    ring,
    ledger,
    mode: config.auth.mode,
    connections,
    session: sessionAuth(sessions, { previewDomain: config.previewDomain }),
    sandboxGrant: async (request, url) => {
      const link = await viaLink(request, url);
      if (link) return link;
      if (!url.startsWith("/sandboxes/:id/ports/")) return undefined;
      const id = e2bPortTrafficOf(request.raw);
      const header = (name: string): string | undefined => {
        const value = request.headers[name];
        return Array.isArray(value) ? value[0] : value;
      };
      return id !== undefined &&
        (await e2bTokens.verifyTraffic(id, header("e2b-traffic-access-token"), header("x-access-token")))
        ? { sandbox: id, scopes: ["sandboxes:write"] }
        : undefined;
    },
  });
  // A request no route takes can still fail earlier on its body or content type; it gets the 404.
  app.setErrorHandler((err, request, reply) =>
    sendProblem(reply, request, request.is404 ? routeNotFound(request) : err, logProblem),
  );
  app.setNotFoundHandler((request, reply) => sendProblem(reply, request, routeNotFound(request), logProblem));

  sandboxRoutes(app, { manager, ledger, quotas }, startedAt);
  volumeRoutes(app, volumes);
  snapshotRoutes(app, snapshots);
  authRoutes(app, { ring, ledger, quotas, connections });
  policyRoutes(app, { policies: manager.policies, ledger });
  secretRoutes(app, { vault, ledger });

  lifecycleRoutes(app, manager);
  const eventStreams = new EventStreams();
  const relays = new RelayMeter();
  const dialer = new PortDialer(manager, drivers.network);
  metricsRoutes(app, metrics, async () => ({
    sandboxes: await ledger.countByStateAndDriver(),
    drivers: drivers.all().map((d) => d.name),
    eventStreams: eventStreams.gauges(),
    relays: relays.gauges(),
    portRoutes: dialer.routes(),
    portPoolSockets: dialer.pooledSockets(),
  }));
  commandRoutes(app, manager, registry, watch, serverEvents);
  eventRoutes(app, events, eventStreams);
  auditRoutes(app, { events, ledger });
  await fileRoutes(app, manager);
  await portRoutes(
    app,
    manager,
    {
      tokens: links,
      previewDomain: config.previewDomain,
      secureCookies,
    },
    relays,
    dialer,
  );
  const desktop = new DesktopService(manager);
  await desktopRoutes(app, manager, desktop, links, relays);
  tunnelRoutes(app, manager, relays, dialer);
  await agentToolRoutes(app, config, logger, ring, { approvals, policies: manager.policies });
  usageRoutes(app, meter, ledger);
  approvalRoutes(app, approvals);
  nodeRoutes(app, ledger);
  await e2bRoutes(app, {
    tokens: e2bTokens,
    config,
    manager,
    registry,
    serverEvents,
    logProblem,
    ledger,
    quotas,
    vault,
    desktop,
    streams,
    links,
    volumes,
    snapshots,
  });
  uiSessionRoutes(app, { ring, sessions, links: uiLinks, previewDomain: config.previewDomain, secureCookies });
  uiRoutes(app);
  openapiRoutes(app);

  const address = await app.listen({ host: config.host, port: config.port });
  logger.info({ event: "listening", address }, `bothy listening on ${address}`);
  sweeper.start();
  if (!cluster) meter.start();
  // A lease lost is a crash as far as the sandboxes go: nothing of them is touched (a successor may
  // hold them now), and the node's next start recovers them as after any crash.
  cluster?.node.once("lost", () => {
    leaseLost = true;
    // The node's lease first, so no later heartbeat takes it again in this process.
    void Promise.allSettled([cluster.node.stop(), cluster.leader.stop(), sweeper.stop()]).then(() =>
      options.onLeaseLost?.(),
    );
  });

  let closing: Promise<void> | undefined;
  let abandoning: Promise<void> | undefined;
  return {
    app,
    manager,
    ledger,
    events,
    approvals,
    templates: store,
    url: address,
    routes,
    close: () => {
      closing ??= (async () => {
        watch.close();
        // Held requests and tool calls are answered (cancelled, retryable) before connections close.
        approvals.stop();
        await sweeper.stop();
        // In a cluster the leader meters (its job stops with the leader's lease, below).
        if (!cluster) await meter.stop();
        await proxy?.close();
        await resolver?.close();
        relays.closeAll();
        dialer.closeAll();
        await app.close();
        await manager.close();
        await drivers.close();
        await registry.close();
        webhook?.close();
        events.close();
        await cluster?.stop();
        await ledger.close();
      })();
      return closing;
    },
    abandon: () => {
      abandoning ??= (async () => {
        leaseLost = true;
        watch.close();
        approvals.stop();
        await Promise.allSettled([sweeper.stop(), cluster?.stop()]);
        // Requests it had begun get their answer (refused: every write is fenced) rather than a reset.
        await inFlight?.drained(5000);
        await proxy?.close();
        await resolver?.close();
        relays.closeAll();
        dialer.closeAll();
        await app.close();
        webhook?.close();
        await ledger.close();
      })();
      return abandoning;
    },
  };
}
