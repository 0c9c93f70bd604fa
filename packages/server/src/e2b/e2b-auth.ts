import type { FastifyInstance, FastifyRequest } from "fastify";

/**
 * Who calls E2B's control plane: the one place the surface decides it, so bothy's API keys plug
 * in here (the SDK sends its `E2B_API_KEY` as `X-API-Key` on every control-plane call, and never
 * on envd calls, which carry the sandbox's access token instead: `access-token.ts`).
 *
 * Until bothy has API keys every caller is the one default owner, as on bothy's own API; the key
 * is not checked (the SDK refuses to run without one, so it is always there).
 */
export interface E2bCaller {
  owner: string;
}

const callers = new WeakMap<FastifyRequest, E2bCaller>();

export function controlPlaneAuth(app: FastifyInstance): void {
  app.addHook("onRequest", async (request) => {
    callers.set(request, { owner: "default" });
  });
}

/** The caller the auth hook admitted (for a route that needs to know whose sandboxes to show). */
export function callerOf(request: FastifyRequest): E2bCaller {
  return callers.get(request) ?? { owner: "default" };
}
