import type { FastifyInstance } from "fastify";

/**
 * Counts the HTTP requests being served, so a server that must stop serving at once (a cluster
 * node that lost its lease) can let those it began finish with their answer, not a reset, before
 * it closes: `drained` resolves once none is left, or after `ms` (a WebSocket, which never ends
 * as a request, does not hold it up longer).
 */
export function countInFlight(app: FastifyInstance): { drained(ms: number): Promise<void> } {
  let serving = 0;
  const idle = new Set<() => void>();
  const done = (): void => {
    serving = Math.max(0, serving - 1);
    if (serving === 0) for (const resolve of idle) resolve();
  };
  app.addHook("onRequest", async () => {
    serving++;
  });
  app.addHook("onResponse", async () => done());
  app.addHook("onRequestAbort", async (_request) => done());
  return {
    drained: (ms) =>
      new Promise<void>((resolve) => {
        if (serving === 0) return resolve();
        const timer = setTimeout(finish, ms);
        function finish(): void {
          clearTimeout(timer);
          idle.delete(finish);
          resolve();
        }
        idle.add(finish);
      }),
  };
}
