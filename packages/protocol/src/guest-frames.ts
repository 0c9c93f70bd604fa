// zod's mini build, not its classic one: this file is the whole of the protocol the guest agent
// loads, and the classic build (every locale, dozens of methods on each schema) would be most of
// the agent's code and ~3 MB more of its memory in every sandbox (docs/performance.md, "Density").
// The schemas mean the same as in the classic build; the surface test in protocol/test pins them.
import * as z from "zod/mini";
import en from "zod/v4/locales/en.js";

// Issues read as before in English (the classic build sets this when it loads; the mini one does
// not): the agent's `bad_frame` errors carry these messages to the host.
z.config(en());

/** The host-guest protocol generation. Bump it on any incompatible change to the frames below. */
export const PROTOCOL_GENERATION = 2;

/** Unacknowledged output bytes a command may have in flight before the agent pauses it. */
export const OUTPUT_WINDOW_BYTES = 1024 * 1024;
/** Unacknowledged upload bytes the host may have in flight to the agent. */
export const UPLOAD_WINDOW_BYTES = 2 * 1024 * 1024;
/** Largest output chunk the agent sends in one frame. */
export const OUTPUT_CHUNK_BYTES = 64 * 1024;
/** Most listening sockets one `ports_result` names. */
export const MAX_LISTED_PORTS = 1024;

/** An integer in [min, max] (a safe integer, as everywhere in the protocol). */
const int = (min?: number, max?: number) =>
  z.int().check(...(min === undefined ? [] : [z.minimum(min)]), ...(max === undefined ? [] : [z.maximum(max)]));
/** A string of at most `max` characters, at least `min`. */
const text = (max: number, min = 0) => z.string().check(...(min > 0 ? [z.minLength(min)] : []), z.maxLength(max));
const flag = () => z._default(z.boolean(), false);
const sha256Hex = () => z.string().check(z.regex(/^[0-9a-f]{64}$/));

const requestId = int(1, 2 ** 31 - 1);
const guestPath = text(4096, 1).check(z.refine((p) => !p.includes("\0"), "path contains a NUL byte"));
export const SIGNALS = ["SIGINT", "SIGTERM", "SIGKILL", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"] as const;
export const signalName = z.enum(SIGNALS);
export type SignalName = z.infer<typeof signalName>;
export const ptySize = z.strictObject({ cols: int(1, 1000), rows: int(1, 1000) });
const tcpPort = int(1, 65535);
const envMap = z.record(
  z.string().check(z.regex(/^[A-Za-z_][A-Za-z0-9_]*$/, "environment names are letters, digits and _")),
  text(65536),
);

// ---- host → guest -------------------------------------------------------------------------------

export const hostFrame = z.discriminatedUnion("t", [
  z.strictObject({ t: z.literal("hello_ack"), gen: int() }),
  /** A host that connects to an agent already running (a restored VM) asks for a new hello. */
  z.strictObject({ t: z.literal("resync") }),
  z.strictObject({
    t: z.literal("exec"),
    id: requestId,
    cmd: text(256 * 1024, 1),
    cwd: z.optional(guestPath),
    env: z.optional(envMap),
    stdin: flag(),
    /** Run on a pseudo-terminal of this size; stdout and stderr arrive together on fd 1. */
    pty: z.optional(ptySize),
  }),
  z.strictObject({ t: z.literal("resize"), id: requestId, cols: ptySize.shape.cols, rows: ptySize.shape.rows }),
  /** Input for a running command; payload holds the bytes. `eof` closes its stdin after them. */
  z.strictObject({ t: z.literal("stdin"), id: requestId, eof: flag() }),
  z.strictObject({ t: z.literal("signal"), id: requestId, signal: signalName }),
  /** The host has consumed `bytes` more output bytes of command `id`. */
  z.strictObject({
    t: z.literal("credit"),
    id: requestId,
    bytes: int(1, 2 ** 31),
  }),
  /**
   * Reads a file: the agent opens it (following symlinks) and answers `stat_result` with the
   * opened file's stat, then at most `stat.size` bytes in `file_chunk` frames, then `file_done`.
   */
  z.strictObject({ t: z.literal("file_read"), id: requestId, path: guestPath }),
  /** Starts an atomic write; the data follows in `file_chunk` frames, the last with `eof`. */
  z.strictObject({
    t: z.literal("file_write"),
    id: requestId,
    path: guestPath,
    mode: z.optional(int(0, 0o7777)),
    if_sha256: z.optional(sha256Hex()),
  }),
  z.strictObject({ t: z.literal("file_chunk"), id: requestId, eof: flag() }),
  /** With `sha256`, a regular file's stat also carries its content hash (the file is read). */
  z.strictObject({ t: z.literal("stat"), id: requestId, path: guestPath, sha256: flag() }),
  /** Lists a directory: `list_result` with the entries as JSON in its payload. */
  z.strictObject({ t: z.literal("list"), id: requestId, path: guestPath }),
  /** The host gives up on file read or write `id`; an unfinished write is discarded. */
  z.strictObject({ t: z.literal("cancel"), id: requestId }),
  z.strictObject({ t: z.literal("mkdir"), id: requestId, path: guestPath, parents: flag() }),
  z.strictObject({ t: z.literal("remove"), id: requestId, path: guestPath, recursive: flag() }),
  z.strictObject({ t: z.literal("rename"), id: requestId, from: guestPath, to: guestPath }),
  /** Lists the guest's listening TCP sockets: answered with `ports_result`. */
  z.strictObject({ t: z.literal("ports_list"), id: requestId }),
  /**
   * Opens a TCP connection to `port` on the guest's loopback: answered with `tcp_opened`, or an
   * `error` (`refused` when nothing listens). Bytes then flow as `tcp_data` both ways: the host's
   * under `tcp_ack`, the guest's under `credit`; `cancel` resets it, and `tcp_closed` ends it.
   */
  z.strictObject({ t: z.literal("tcp_open"), id: requestId, port: tcpPort }),
  /** Bytes for connection `id` (payload); `eof` half-closes the sending side after them. */
  z.strictObject({ t: z.literal("tcp_data"), id: requestId, eof: flag() }),
  /**
   * The sandbox's limits, applied by the guest before the sandbox is handed out (answered with
   * `done`): at most `max_processes` processes (threads included) under its commands, and, for
   * VM guests whose disk the host just grew, the root file system grown online to `root_bytes`.
   */
  z.strictObject({
    t: z.literal("limits"),
    id: requestId,
    max_processes: int(1, 4_194_304),
    root_bytes: z.optional(int(1)),
  }),
  /**
   * The volumes a VM guest mounts (answered with `done`): each the virtio disk whose serial the
   * host gave it, mounted at `path` (read-only for a reader). The host chose the disks; the guest
   * only finds them by serial. A volume already mounted there (a restored guest) is left as it is.
   */
  z.strictObject({
    t: z.literal("volumes"),
    id: requestId,
    mounts: z
      .array(
        z.strictObject({
          serial: z.string().check(z.regex(/^[a-z0-9-]{1,20}$/)),
          path: z.string().check(z.regex(/^\/[^\0\n]{1,1023}$/)),
          read_only: z.boolean(),
        }),
      )
      .check(z.maxLength(16)),
  }),
  /**
   * Who the sandbox is, sent after the handshake by drivers whose guests share a boot (QEMU
   * snapshots): hostname, the environment commands get, the host's clock, and fresh entropy in
   * the payload (at least 32 bytes) that the guest credits to its kernel RNG before answering.
   */
  z.strictObject({
    t: z.literal("identity"),
    id: requestId,
    sandbox_id: z.string().check(z.regex(/^[a-z0-9_]{1,64}$/)),
    hostname: z.string().check(z.regex(/^[a-zA-Z0-9][a-zA-Z0-9_-]{0,62}$/)),
    env: envMap,
    time_ms: int(0),
  }),
]);
export type HostFrame = z.input<typeof hostFrame>;
export type ParsedHostFrame = z.output<typeof hostFrame>;

// ---- guest → host -------------------------------------------------------------------------------

export const fileStat = z.object({
  type: z.enum(["file", "dir", "symlink", "other"]),
  size: int(0),
  mode: int(0),
  mtime_ms: z.number(),
  sha256: z.optional(sha256Hex()),
});

/** Directory entries travel in a list_result payload; at most this many per listing. */
export const MAX_LIST_ENTRIES = 5000;
export const dirEntry = z.extend(z.omit(fileStat, { sha256: true }), { name: text(4096, 1) });
export const dirEntries = z.array(dirEntry).check(z.maxLength(MAX_LIST_ENTRIES));
export type DirEntry = z.infer<typeof dirEntry>;
export type FileStat = z.infer<typeof fileStat>;

export const guestFrame = z.discriminatedUnion("t", [
  z.strictObject({ t: z.literal("hello"), gen: int(), agent: text(200), pid: int() }),
  z.strictObject({ t: z.literal("started"), id: requestId, pid: int() }),
  /** Output of command `id` on fd 1 (stdout) or 2 (stderr); payload holds the bytes. */
  z.strictObject({ t: z.literal("output"), id: requestId, fd: z.union([z.literal(1), z.literal(2)]) }),
  z.strictObject({
    t: z.literal("exited"),
    id: requestId,
    code: z.nullable(int()),
    signal: z.nullable(text(32)),
    /** The guest kernel's OOM killer ended it (VM guests; gVisor ends the whole sandbox instead). */
    oom_killed: z.optional(z.boolean()),
  }),
  /** A chunk of a file being read; payload holds the bytes. */
  z.strictObject({ t: z.literal("file_chunk"), id: requestId }),
  z.strictObject({ t: z.literal("file_done"), id: requestId, size: int(0), sha256: z.string() }),
  z.strictObject({ t: z.literal("stat_result"), id: requestId, stat: fileStat }),
  z.strictObject({ t: z.literal("list_result"), id: requestId, truncated: z.boolean() }),
  /** A file operation without a result (mkdir, remove, rename) has completed. */
  z.strictObject({ t: z.literal("done"), id: requestId }),
  /** `bytes` more of an upload have been written; the host may send that much more. */
  z.strictObject({ t: z.literal("file_ack"), id: requestId, bytes: int(0) }),
  z.strictObject({ t: z.literal("identity_done"), id: requestId }),
  z.strictObject({
    t: z.literal("ports_result"),
    id: requestId,
    ports: z.array(z.strictObject({ port: tcpPort, address: text(64) })).check(z.maxLength(MAX_LISTED_PORTS)),
  }),
  z.strictObject({ t: z.literal("tcp_opened"), id: requestId }),
  z.strictObject({ t: z.literal("tcp_data"), id: requestId, eof: flag() }),
  /** `bytes` more the host sent on connection `id` have been written to its socket. */
  z.strictObject({ t: z.literal("tcp_ack"), id: requestId, bytes: int(0) }),
  /** Connection `id` is over (its id is free); `error` says why when it did not end cleanly. */
  z.strictObject({ t: z.literal("tcp_closed"), id: requestId, error: z.optional(text(4096)) }),
  z.strictObject({
    t: z.literal("error"),
    id: z.optional(requestId),
    code: z.enum([
      "bad_frame",
      "unknown_request",
      "spawn_failed",
      "not_found",
      "exists",
      "io_error",
      "precondition_failed",
      "not_a_file",
      "busy",
      "refused",
    ]),
    message: text(4096),
  }),
]);
export type GuestFrame = z.infer<typeof guestFrame>;
