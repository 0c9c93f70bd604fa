import type { FastifyInstance } from "fastify";
import { z } from "zod";
import { SANDBOX_ID_RE } from "@bothy/protocol";
import { viewerPage } from "../api/desktop-routes.ts";
import type { LinkTokens } from "../auth/link-tokens.ts";
import type { DesktopStreams } from "./desktop-stream.ts";
import { E2bHttpError, parseE2b } from "./e2b-errors.ts";

/** How long the link a stream page is given lasts (a reload of the stream URL makes a new one). */
const PAGE_LINK_TTL_S = 3600;

const pageQuery = z.object({
  password: z.string().max(64).optional(),
  view_only: z.enum(["true", "false"]).optional(),
  autoconnect: z.string().optional(),
  resize: z.string().optional(),
});

/**
 * The page of `@e2b/desktop`'s stream URL (`/vnc.html` on the stream's preview host, rewritten
 * here by DesktopStreams): with the stream's password, bothy's viewer with a desktop link made for
 * it under the key that started the stream (control unless `view_only=true`). Public: the
 * password is the credential; a wrong or missing one is 401 and says how to get a working URL.
 */
export function streamPageRoutes(e2b: FastifyInstance, streams: DesktopStreams, links: LinkTokens): void {
  e2b.get<{ Params: { id: string } }>("/desktop-stream/:id/vnc.html", async (request, reply) => {
    const { id } = request.params;
    const query = parseE2b(pageQuery, request.query, "GET /vnc.html");
    const binding = SANDBOX_ID_RE.test(id) ? streams.verify(id, query.password) : undefined;
    const control = query.view_only !== "true";
    const exp = Math.floor(Date.now() / 1000) + PAGE_LINK_TTL_S;
    const link = { sid: id, what: "desktop" as const, ...(control ? { control: true } : {}), exp };
    const token = binding === undefined ? undefined : links.signAs(link, binding);
    // The link holds only while the key that started the stream is current and may still do it.
    if (token === undefined || (await links.verify(token)) === undefined)
      throw new E2bHttpError(
        401,
        "This desktop stream needs its password, and the key that started it must still be current: open the URL stream.getUrl({ authKey: stream.getAuthKey() }) gives after stream.start({ requireAuth: true }).",
      );
    return reply
      .type("text/html; charset=utf-8")
      .header("cache-control", "no-store")
      .header("referrer-policy", "no-referrer")
      .send(viewerPage(id, control, undefined, token));
  });
}
