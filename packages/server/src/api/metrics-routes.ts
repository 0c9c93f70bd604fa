import type { FastifyInstance } from "fastify";
import type { Gauges, Metrics } from "../metrics/metrics.ts";

/** `GET /metrics` in the Prometheus text format. */
export function metricsRoutes(app: FastifyInstance, metrics: Metrics, gauges: () => Gauges): void {
  app.get("/metrics", async (_request, reply) =>
    reply.type("text/plain; version=0.0.4; charset=utf-8").send(metrics.render(gauges())),
  );
}
