import { hostFrame, PROTOCOL_GENERATION, type GuestFrame, type RawFrame } from "@bothy/protocol";
import { agentEnv } from "./agent-env.ts";
import { Channel } from "./channel.ts";
import { Command } from "./exec.ts";
import {
  AtomicWrite,
  FileRead,
  fileOpError,
  listDir,
  makeDir,
  removePath,
  renamePath,
  resolveGuestPath,
  statPath,
} from "./files.ts";
import { runBootHooks } from "./boot-hooks.ts";
import { applyIdentity } from "./identity.ts";
import { applyLimits } from "./limits.ts";
import { mountVolumes } from "./volumes.ts";
import { listeningPorts, TcpTunnel } from "./ports.ts";
import { Spawner } from "./spawner.ts";
import { VirtioPort } from "./virtio-port.ts";

const AGENT_VERSION = "bothy-agent/0.1.0";
/** The host may not be listening yet (QEMU drops writes without a peer): repeat hello until answered. */
const HELLO_REPEAT_MS = 200;

let childEnv: NodeJS.ProcessEnv = {};
const commands = new Map<number, Command>();
const writes = new Map<number, AtomicWrite>();
const reads = new Map<number, FileRead>();
const tunnels = new Map<number, TcpTunnel>();
let acked = false;
/** Commands start through the resident helper once it is up (see spawner.ts); through Node until then. */
let spawner: Spawner | undefined;
let channel: Channel;

/**
 * Starts the agent, once per process: from main.ts, or in gVisor when the agent's startup snapshot
 * is deserialized (snapshot-main.ts). Everything that depends on the process (its environment,
 * stdio, the helper, timers) is made here, never while the modules load.
 */
export function startAgent(): void {
  // With the stdio channel stdout is the protocol: nothing else may write to it.
  console.log = console.info = console.warn = console.error;
  const env = agentEnv();
  childEnv = { ...process.env };
  // One failed request must not take the whole sandbox's agent down with it.
  process.on("unhandledRejection", (err) => process.stderr.write(`bothy-agent: unhandled rejection: ${String(err)}\n`));
  // stdio (gVisor) by default; a virtio-serial port (QEMU) when the environment names one. A
  // port's host comes and goes (pause, restore): the agent then keeps running and says hello again.
  const port = env.channel === undefined ? undefined : new VirtioPort(env.channel, hostGone);
  spawner = Spawner.start();
  channel = port
    ? new Channel(port.input, port.output, onFrame, shutdown)
    : new Channel(process.stdin, process.stdout, onFrame, shutdown);
  // The template's boot hooks (its services) first, so the first command finds them up; behind
  // the native front, the spawner too (see agentEnv().front).
  void runBootHooks()
    .then(() => (env.front ? spawner?.settled : undefined))
    .finally(hello);
}

/** The host that made these requests is gone: commands run on, detached, and their ids are free for the next host. */
function dropHostRequests(): void {
  for (const cmd of commands.values()) cmd.detach();
  commands.clear();
  for (const write of writes.values()) void write.abort();
  writes.clear();
  for (const read of reads.values()) read.cancel();
  reads.clear();
  for (const tunnel of tunnels.values()) tunnel.destroy();
  tunnels.clear();
}

function hostGone(): void {
  // Whatever the old host sent last may have been cut mid-frame.
  channel.resetDecoder();
  dropHostRequests();
  if (!acked) return;
  acked = false;
  hello();
}

function sendError(id: number | undefined, code: Extract<GuestFrame, { t: "error" }>["code"], message: string): void {
  channel.send({ t: "error", ...(id === undefined ? {} : { id }), code, message: message.slice(0, 4000) });
}

function onFrame(raw: RawFrame): void {
  const parsed = hostFrame.safeParse(raw.header);
  if (!parsed.success) {
    const id = (raw.header as { id?: unknown } | null)?.id;
    sendError(
      typeof id === "number" ? id : undefined,
      "bad_frame",
      parsed.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`).join("; "),
    );
    return;
  }
  const frame = parsed.data;
  switch (frame.t) {
    case "hello_ack":
      acked = true;
      return;
    case "resync":
      // A new host took over the stream (a server restart); the old one's requests are over.
      dropHostRequests();
      acked = false;
      hello();
      return;
    case "exec": {
      if (commands.has(frame.id) || writes.has(frame.id))
        return sendError(frame.id, "busy", `request id ${frame.id} is in use`);
      const cmd: Command = new Command(
        frame.id,
        frame,
        childEnv,
        channel,
        (id) => {
          if (commands.get(id) === cmd) commands.delete(id); // a detached command's id may be taken again
        },
        spawner,
      );
      commands.set(frame.id, cmd);
      return;
    }
    case "stdin": {
      const cmd = commands.get(frame.id);
      if (!cmd) return sendError(frame.id, "unknown_request", `no running command ${frame.id}`);
      cmd.stdin(raw.payload, frame.eof);
      return;
    }
    case "signal":
      commands.get(frame.id)?.signal(frame.signal);
      return;
    case "resize":
      commands.get(frame.id)?.resize({ cols: frame.cols, rows: frame.rows });
      return;
    case "credit":
      commands.get(frame.id)?.credit(frame.bytes);
      reads.get(frame.id)?.credit(frame.bytes);
      tunnels.get(frame.id)?.credit(frame.bytes);
      return;
    case "identity":
      applyIdentity(frame, raw.payload).then(
        (env) => {
          childEnv = env;
          channel.send({ t: "identity_done", id: frame.id });
        },
        (err: Error) => sendError(frame.id, "io_error", `identity: ${err.message}`),
      );
      return;
    case "limits":
      // A start ends with limits: once answered, commands go through the helper from the first.
      Promise.all([applyLimits(frame), spawner?.settled]).then(
        () => channel.send({ t: "done", id: frame.id }),
        (err: Error) => sendError(frame.id, "io_error", `limits: ${err.message}`),
      );
      return;
    case "volumes":
      mountVolumes(frame).then(
        () => channel.send({ t: "done", id: frame.id }),
        (err: Error) => sendError(frame.id, "io_error", `volumes: ${err.message}`),
      );
      return;
    case "stat":
      statPath(resolveGuestPath(frame.path), frame.sha256).then(
        (stat) => channel.send({ t: "stat_result", id: frame.id, stat }),
        (err) => sendFileError(frame.id, err),
      );
      return;
    case "list":
      listDir(resolveGuestPath(frame.path)).then(
        ({ entries, truncated }) =>
          channel.send({ t: "list_result", id: frame.id, truncated }, Buffer.from(JSON.stringify(entries))),
        (err) => sendFileError(frame.id, err),
      );
      return;
    case "cancel":
      reads.get(frame.id)?.cancel();
      reads.delete(frame.id);
      void writes.get(frame.id)?.abort();
      writes.delete(frame.id);
      tunnels.get(frame.id)?.destroy();
      return;
    case "ports_list":
      listeningPorts().then(
        (ports) => channel.send({ t: "ports_result", id: frame.id, ports }),
        (err: Error) => sendError(frame.id, "io_error", `listing ports: ${err.message}`),
      );
      return;
    case "tcp_open": {
      if (tunnels.has(frame.id)) return sendError(frame.id, "busy", `request id ${frame.id} is in use`);
      const tunnel: TcpTunnel = new TcpTunnel(frame.id, frame.port, channel, (id) => {
        if (tunnels.get(id) === tunnel) tunnels.delete(id);
      });
      tunnels.set(frame.id, tunnel);
      return;
    }
    case "tcp_data": {
      const tunnel = tunnels.get(frame.id);
      if (!tunnel) return; // reset by the guest's side already; its tcp_closed is on the way
      tunnel.write(raw.payload, frame.eof);
      return;
    }
    case "mkdir":
      return reply(frame.id, makeDir(resolveGuestPath(frame.path), frame.parents));
    case "remove":
      return reply(frame.id, removePath(resolveGuestPath(frame.path), frame.recursive));
    case "rename":
      return reply(frame.id, renamePath(resolveGuestPath(frame.from), resolveGuestPath(frame.to)));
    case "file_read":
      if (reads.has(frame.id)) return sendError(frame.id, "busy", `request id ${frame.id} is in use`);
      reads.set(
        frame.id,
        new FileRead(frame.id, resolveGuestPath(frame.path), channel, (err) => {
          reads.delete(frame.id);
          if (err) sendFileError(frame.id, err);
        }),
      );
      return;
    case "file_write":
      if (commands.has(frame.id) || writes.has(frame.id))
        return sendError(frame.id, "busy", `request id ${frame.id} is in use`);
      writes.set(frame.id, new AtomicWrite({ ...frame, path: resolveGuestPath(frame.path) }));
      return;
    case "file_chunk": {
      const write = writes.get(frame.id);
      if (!write) return sendError(frame.id, "unknown_request", `no file write ${frame.id}`);
      const bytes = raw.payload.length;
      write.write(raw.payload).then(
        () => channel.send({ t: "file_ack", id: frame.id, bytes }),
        () => undefined, // the commit reports the failure
      );
      if (!frame.eof) return;
      writes.delete(frame.id);
      write.commit().then(
        (done) => channel.send({ t: "file_done", id: frame.id, ...done }),
        async (err) => {
          await write.abort();
          sendFileError(frame.id, err);
        },
      );
      return;
    }
  }
}

function reply(id: number, op: Promise<void>): void {
  op.then(
    () => channel.send({ t: "done", id }),
    (err) => sendFileError(id, err),
  );
}

function sendFileError(id: number, err: unknown): void {
  const e = fileOpError(err);
  sendError(id, e.code, e.message);
}

function shutdown(reason: string): void {
  process.stderr.write(`bothy-agent: ${reason}; exiting\n`);
  for (const cmd of commands.values()) cmd.kill();
  for (const write of writes.values()) void write.abort();
  for (const read of reads.values()) read.cancel();
  for (const tunnel of tunnels.values()) tunnel.destroy();
  // A moment for the stderr line above to leave; the host is already gone.
  setTimeout(() => process.exit(0), 10);
}

let helloTimer: NodeJS.Timeout | undefined;

/** Says hello now and every HELLO_REPEAT_MS until acknowledged; calling it again restarts it. */
function hello(): void {
  clearTimeout(helloTimer);
  if (acked) return;
  channel.send({ t: "hello", gen: PROTOCOL_GENERATION, agent: AGENT_VERSION, pid: process.pid });
  helloTimer = setTimeout(hello, HELLO_REPEAT_MS).unref();
}
