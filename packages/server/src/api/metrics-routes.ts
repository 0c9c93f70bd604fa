import type { FastifyInstance } from "fastify";
import type { Gauges, Metrics } from "../metrics/metrics.ts";
import { media } from "./route-schema.ts";

const metricsDoc = {
  tags: ["server"],
  summary: "Prometheus metrics",
  response: { 200: media("text/plain", "Prometheus text format") },
};

/** `GET /metrics` in the Prometheus text format. */
export function metricsRoutes(app: FastifyInstance, metrics: Metrics, gauges: () => Promise<Gauges>): void {
  app.get("/metrics", { schema: metricsDoc }, async (_request, reply) =>
    reply.type(metrics.contentType).send(await metrics.render(await gauges())),
  );
}
