import { isUtf8 } from "node:buffer";
import {
  BothyError,
  COMMAND_OUTPUT_CAP_BYTES,
  isErrorCode,
  commandRequest,
  type CommandEvent,
  type CommandRequest,
  type CommandResultBody,
} from "@bothy/protocol";
import type { RunningCommand } from "../commands/command-registry.ts";
import { summarize } from "./command-session.ts";

const SOCKET_ROUTE = "GET /sandboxes/{id}/command (WebSocket)";

/**
 * The body of `POST /sandboxes/{id}/commands`: a CommandRequest for a command that needs no
 * socket. Options that do (input, a terminal, outliving the request) are refused by name.
 */
export function parseHttpCommand(body: unknown): CommandRequest {
  const parsed = commandRequest.safeParse(body ?? {});
  if (!parsed.success)
    throw new BothyError(
      "invalid_command",
      `${summarize(parsed.error.issues)}. The body is {"cmd":"<shell line>"} with optional cwd, env, timeout_s.`,
    );
  const req = parsed.data;
  const socketOnly = [
    req.stdin ? "stdin" : undefined,
    req.background ? "background" : undefined,
    req.pty !== undefined ? "pty" : undefined,
  ].filter((o) => o !== undefined);
  if (socketOnly.length > 0)
    throw new BothyError(
      "invalid_command",
      `${socketOnly.join(", ")} ${socketOnly.length > 1 ? "need" : "needs"} a socket: use ${SOCKET_ROUTE} for this command.`,
    );
  return req;
}

/** One stream's bytes up to the cap; what comes later is dropped (exported for its unit test). */
export class CappedOutput {
  private readonly chunks: Buffer[] = [];
  private kept = 0;
  dropped = false;

  constructor(private readonly cap: number) {}

  push(event: Extract<CommandEvent, { type: "stdout" | "stderr" }>): void {
    if (this.dropped) return;
    const bytes = Buffer.from(event.data, event.encoding === "base64" ? "base64" : "utf8");
    const room = this.cap - this.kept;
    if (bytes.length > room) this.dropped = true;
    const part = bytes.length > room ? bytes.subarray(0, room) : bytes;
    this.chunks.push(part);
    this.kept += part.length;
  }

  /** Text when the bytes are UTF-8 (a character the cap cut in two is left out), else base64. */
  text(): { data: string; encoding?: "base64" } {
    let all: Buffer = Buffer.concat(this.chunks);
    if (this.dropped) all = trimCutCharacter(all);
    return isUtf8(all) ? { data: all.toString("utf8") } : { data: all.toString("base64"), encoding: "base64" };
  }
}

/** `buf` without a last UTF-8 character whose end the cap cut off, if that is all that spoils it. */
function trimCutCharacter(buf: Buffer): Buffer {
  if (isUtf8(buf)) return buf;
  for (let back = 1; back <= Math.min(3, buf.length); back++) {
    const head = buf.subarray(0, buf.length - back);
    if (isUtf8(head)) return head;
  }
  return buf;
}

/**
 * Collects a command's output and end for one HTTP answer. Output is acknowledged to the guest as
 * soon as it is copied (or dropped past the cap), so the command never waits on the client.
 * `onEnd` gets the answer, or the error that ended the command without an exit status (or kept it
 * from starting). It is called as the end arrives, before the registry's bookkeeping of the end,
 * as a socket sends `process_exited`. Answers the detach.
 */
export function collectCommand(
  command: RunningCommand,
  onEnd: (answer: CommandResultBody | BothyError) => void,
  cap: number = COMMAND_OUTPUT_CAP_BYTES,
): () => void {
  const out = { stdout: new CappedOutput(cap), stderr: new CappedOutput(cap) };
  let startError: BothyError | undefined;
  return command.attach((event, written) => {
    if (event.type === "stdout" || event.type === "stderr") out[event.type].push(event);
    else if (event.type === "error") {
      const err = new BothyError(isErrorCode(event.code) ? event.code : "internal", event.message);
      // A command that cannot start reports it, then still ends with process_exited.
      if (command.finished) onEnd(err);
      else startError = err;
    } else if (event.type === "process_exited") {
      if (startError) onEnd(startError);
      else {
        const stdout = out.stdout.text();
        const stderr = out.stderr.text();
        const { type: _type, ...exit } = event;
        onEnd({
          ...exit,
          stdout: stdout.data,
          stderr: stderr.data,
          ...(stdout.encoding ? { stdout_encoding: stdout.encoding } : {}),
          ...(stderr.encoding ? { stderr_encoding: stderr.encoding } : {}),
          ...(out.stdout.dropped || out.stderr.dropped ? { truncated: true } : {}),
        });
      }
    }
    written();
  }, false);
}
