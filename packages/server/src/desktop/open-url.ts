/**
 * Opens a URL in the desktop's Chromium as a new tab, through its DevTools HTTP endpoint
 * (`PUT /json/new?URL`) reached over the guest channel: nothing is run by a shell, so the URL
 * cannot become a command, and the browser already on the screen shows it.
 */
import { request as httpRequest } from "node:http";
import type { Socket } from "node:net";
import { BothyError } from "@bothy/protocol";
import type { TcpStream } from "../agent/tcp-stream.ts";

/** What may be opened: web pages and the sandbox's own files; other schemes could start programs. */
const OPENABLE = /^(https?:\/\/|file:\/\/\/)/i;
const MAX_URL_CHARS = 8192;
const ANSWER_LIMIT = 64 * 1024;

/** A URL or an absolute path in the sandbox, as a URL Chromium opens; refuses anything else. */
export function openableUrl(target: string): string {
  if (target.length > MAX_URL_CHARS)
    throw new BothyError("invalid_request", `The URL is ${target.length} characters; at most ${MAX_URL_CHARS}.`);
  if (target.startsWith("/")) return `file://${encodeURI(target)}`;
  if (OPENABLE.test(target)) return target;
  throw new BothyError(
    "invalid_request",
    `bothy's desktop opens http(s) and file:/// URLs and absolute paths in the sandbox, not ${JSON.stringify(target.slice(0, 60))}.`,
  );
}

/** One PUT to Chromium's DevTools endpoint inside the sandbox. */
export function openInChromium(tunnel: TcpStream, cdpPort: number, url: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      {
        method: "PUT",
        path: `/json/new?${encodeURIComponent(url)}`,
        headers: { host: `localhost:${cdpPort}` },
        createConnection: () => tunnel as unknown as Socket,
      },
      (res) => {
        let size = 0;
        res.on("data", (chunk: Buffer) => {
          size += chunk.length;
          if (size > ANSWER_LIMIT) req.destroy(new Error("answer too large"));
        });
        res.on("end", () => {
          if (res.statusCode === 200) resolve();
          else
            reject(
              new BothyError("desktop_failed", `Chromium did not open the URL (DevTools answered ${res.statusCode}).`),
            );
        });
        res.on("error", reject);
      },
    );
    req.on("error", (err) =>
      reject(
        new BothyError("desktop_failed", `Chromium's DevTools port did not answer: ${err.message}`, { cause: err }),
      ),
    );
    req.on("close", () => tunnel.destroy());
    req.end();
  });
}
