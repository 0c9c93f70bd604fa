import { Sandbox } from "@bothy/sdk";
import { CONNECTION_FLAGS, connection, JSON_FLAG, parse, UsageError } from "../args/parse.ts";
import type { Command } from "../command.ts";
import { exitStatus } from "./exec.ts";

const USAGE = `usage: bothy logs ID [-f] [--since SEQ] [--json]
       bothy logs ID CMD_ID

With a sandbox id: its events (created, command exits, deleted, failed), oldest first; -f keeps
following new ones. With a command id too: that command's output as the server kept it
(the last 1 MiB by default), then live until it exits; the exit status is the command's.

  -f, --follow    wait for new events (Ctrl-C to stop)
  --since SEQ     only events after sequence number SEQ
  --json          one JSON event a line
`;

export const logsCommand: Command = {
  name: "logs",
  summary: "a sandbox's events, or a command's output",
  usage: USAGE,
  async run(args) {
    const { values, positionals } = parse(
      args,
      { ...CONNECTION_FLAGS, ...JSON_FLAG, follow: { type: "boolean", short: "f" }, since: { type: "string" } },
      { min: 1, max: 2, names: "sandbox ID" },
    );
    if (values.help) {
      process.stdout.write(USAGE);
      return 0;
    }
    const sandbox = await Sandbox.connect(positionals[0] ?? "", connection(values));
    const commandId = positionals[1];
    if (commandId !== undefined) {
      const handle = await sandbox.commands.connect(commandId, {
        onOutput: (bytes, stream) => (stream === "stdout" ? process.stdout : process.stderr).write(bytes),
        throwOnError: false,
      });
      if (handle.droppedBytes > 0)
        process.stderr.write(`bothy logs: ${handle.droppedBytes} bytes of older output were dropped\n`);
      const r = await handle.wait();
      return exitStatus(r.exitCode, r.signal);
    }
    const since = values.since === undefined ? 0 : Number(values.since);
    if (!Number.isInteger(since) || since < 0)
      throw new UsageError(`--since takes an event sequence number, got "${values.since}"`);
    const controller = new AbortController();
    const stop = (): void => controller.abort();
    process.once("SIGINT", stop);
    try {
      for await (const ev of sandbox.events({ since, follow: values.follow === true, signal: controller.signal })) {
        if (values.json) process.stdout.write(`${JSON.stringify(ev)}\n`);
        else process.stdout.write(`${ev.created_at}  ${ev.seq}  ${ev.type}${summary(ev.data)}\n`);
      }
    } catch (err) {
      if (!controller.signal.aborted) throw err;
    } finally {
      process.off("SIGINT", stop);
    }
    return 0;
  },
};

/** The fields worth a glance on one line: command id and exit, or why a sandbox failed. */
function summary(data: Record<string, unknown>): string {
  const keys = ["command_id", "cmd", "exit_code", "signal", "timed_out", "reason", "error"];
  const parts = keys
    .filter((k) => data[k] !== undefined && data[k] !== null && data[k] !== false)
    .map((k) => `${k}=${JSON.stringify(data[k])}`);
  return parts.length ? `  ${parts.join(" ")}` : "";
}
