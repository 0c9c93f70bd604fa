import { BothyError, type ErrorCode } from "@bothy/protocol";
import type { AgentClient } from "./agent-client.ts";

/**
 * Runs a short host-side command in the guest (not a user's command): its exit code and the tail
 * of its output. Past `timeoutMs` it fails with `timeoutCode` (a boot step's by default).
 */
export function execQuiet(
  agent: AgentClient,
  cmd: string,
  timeoutMs: number,
  what: string,
  timeoutCode: ErrorCode = "create_failed",
): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve, reject) => {
    let output = "";
    const timer = setTimeout(
      () => reject(new BothyError(timeoutCode, `${what} took over ${timeoutMs} ms.`)),
      timeoutMs,
    );
    agent.exec(
      { cmd, cwd: "/" },
      {
        onStarted: () => undefined,
        onOutput: (_fd, data, consumed) => {
          output = (output + data.toString("utf8")).slice(-2000);
          consumed();
        },
        onExited: (code) => {
          clearTimeout(timer);
          resolve({ code, output });
        },
        onError: (err) => {
          clearTimeout(timer);
          reject(err);
        },
      },
    );
  });
}
