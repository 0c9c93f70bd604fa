/**
 * The host's end of the guest-agent protocol, as the one object the server holds per sandbox:
 * one frame channel (agent-channel.ts: framing, hello, resync, loss, request ids and deadlines)
 * and the per-feature clients over it (commands, files, ports, the guest's setup), each of whose
 * requests handles its own frames.
 */
import type { Readable, Writable } from "node:stream";
import type { GuestVolume } from "../drivers/driver.ts";
import type { BothyError, DirEntry, FileStat } from "@bothy/protocol";
import { AgentChannel } from "./agent-channel.ts";
import { CommandClient, type ExecEvents, type ExecHandle, type ExecOptions } from "./command-client.ts";
import { FileClient } from "./file-client.ts";
import { GuestSetupClient, type GuestIdentity } from "./guest-setup-client.ts";
import { PortClient, type ListeningPort } from "./port-client.ts";
import type { TcpStream } from "./tcp-stream.ts";

export type { ExecEvents, ExecHandle, ExecOptions, GuestIdentity, ListeningPort };
export { FILE_TIMEOUT_MS } from "./agent-channel.ts";
export { CONNECT_TIMEOUT_MS } from "./port-client.ts";

export class AgentClient {
  private readonly channel: AgentChannel;
  private readonly commands: CommandClient;
  private readonly files: FileClient;
  private readonly ports: PortClient;
  private readonly setup: GuestSetupClient;

  constructor(input: Readable, output: Writable, options: { fileTimeoutMs?: number } = {}) {
    this.channel = new AgentChannel(input, output, options);
    this.commands = new CommandClient(this.channel);
    this.files = new FileClient(this.channel);
    this.ports = new PortClient(this.channel);
    this.setup = new GuestSetupClient(this.channel);
  }

  // ---- the channel ------------------------------------------------------------------------------

  /**
   * Resolves once the agent has said hello with our protocol generation. With `resync` the agent
   * is already running (a restored VM) and is asked to say hello again.
   */
  handshake(timeoutMs: number, signal?: AbortSignal, resync = false): Promise<void> {
    return this.channel.handshake(timeoutMs, signal, resync);
  }

  get isClosed(): boolean {
    return this.channel.isClosed;
  }

  /** Calls `fn` when the channel closes without the host's `close()`; see AgentChannel.onLost. */
  onLost(fn: (reason: BothyError) => void): () => void {
    return this.channel.onLost(fn);
  }

  /** Calls `fn` once the channel is closed, for any reason; see AgentChannel.onClose. */
  onClose(fn: () => void): () => void {
    return this.channel.onClose(fn);
  }

  /** Closes the channel: every request still waiting fails with `reason`. */
  close(reason: BothyError): void {
    this.channel.close(reason);
  }

  // ---- commands ---------------------------------------------------------------------------------

  /** Variables every command gets beneath its own (SandboxSpec.commandEnv). */
  get commandEnv(): Record<string, string> {
    return this.commands.commandEnv;
  }

  set commandEnv(env: Record<string, string>) {
    this.commands.commandEnv = env;
  }

  exec(options: ExecOptions, events: ExecEvents): ExecHandle {
    return this.commands.exec(options, events);
  }

  // ---- files ------------------------------------------------------------------------------------

  stat(path: string, options: { sha256?: boolean } = {}): Promise<FileStat> {
    return this.files.stat(path, options);
  }

  list(path: string): Promise<{ entries: DirEntry[]; truncated: boolean }> {
    return this.files.list(path);
  }

  mkdir(path: string, parents = false): Promise<void> {
    return this.files.mkdir(path, parents);
  }

  remove(path: string, recursive = false): Promise<void> {
    return this.files.remove(path, recursive);
  }

  rename(from: string, to: string): Promise<void> {
    return this.files.rename(from, to);
  }

  /** A guest file streamed out, once opened, with the stat of what was opened; see FileClient.openRead. */
  openRead(path: string): Promise<{ stat: FileStat; stream: Readable }> {
    return this.files.openRead(path);
  }

  readFile(path: string, limit?: number): Promise<Buffer> {
    return this.files.readFile(path, limit);
  }

  writeFile(
    path: string,
    data: Buffer,
    options: { mode?: number; ifSha256?: string } = {},
  ): Promise<{ size: number; sha256: string }> {
    return this.files.writeFile(path, data, options);
  }

  /** Streams data into a guest file, replaced atomically at the end; see FileClient.writeStream. */
  writeStream(
    path: string,
    source: AsyncIterable<Buffer | Uint8Array> | Iterable<Buffer | Uint8Array>,
    options: { mode?: number; ifSha256?: string } = {},
  ): Promise<{ size: number; sha256: string }> {
    return this.files.writeStream(path, source, options);
  }

  // ---- ports ------------------------------------------------------------------------------------

  /** The TCP sockets listening inside the guest. */
  listPorts(): Promise<ListeningPort[]> {
    return this.ports.listPorts();
  }

  /** A TCP connection to `port` on the guest's loopback; see PortClient.openTcp. */
  openTcp(port: number): Promise<TcpStream> {
    return this.ports.openTcp(port);
  }

  // ---- the guest's setup ------------------------------------------------------------------------

  /** Tells the guest who it is (see the `identity` frame); resolves once it has applied it. */
  identify(identity: GuestIdentity): Promise<void> {
    return this.setup.identify(identity);
  }

  /** Gives the guest its limits (see the `limits` frame); resolves once it has applied them. */
  applyLimits(limits: { maxProcesses: number; rootBytes?: number }): Promise<void> {
    return this.setup.applyLimits(limits);
  }

  /** Has a VM guest mount its volumes (see the `volumes` frame); resolves once they are mounted. */
  mountVolumes(volumes: readonly GuestVolume[]): Promise<void> {
    return this.setup.mountVolumes(volumes);
  }
}
