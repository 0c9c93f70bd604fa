import { z } from "zod";

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

const requestId = z
  .number()
  .int()
  .min(1)
  .max(2 ** 31 - 1);
const guestPath = z
  .string()
  .min(1)
  .max(4096)
  .refine((p) => !p.includes("\0"), "path contains a NUL byte");
export const SIGNALS = ["SIGINT", "SIGTERM", "SIGKILL", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"] as const;
export const signalName = z.enum(SIGNALS);
export type SignalName = z.infer<typeof signalName>;
export const ptySize = z
  .object({ cols: z.number().int().min(1).max(1000), rows: z.number().int().min(1).max(1000) })
  .strict();
const tcpPort = z.number().int().min(1).max(65535);
const envMap = z.record(
  z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, "environment names are letters, digits and _"),
  z.string().max(65536),
);

// ---- host → guest -------------------------------------------------------------------------------

export const hostFrame = z.discriminatedUnion("t", [
  z.object({ t: z.literal("hello_ack"), gen: z.number().int() }).strict(),
  /** A host that connects to an agent already running (a restored VM) asks for a new hello. */
  z.object({ t: z.literal("resync") }).strict(),
  z
    .object({
      t: z.literal("exec"),
      id: requestId,
      cmd: z
        .string()
        .min(1)
        .max(256 * 1024),
      cwd: guestPath.optional(),
      env: envMap.optional(),
      stdin: z.boolean().default(false),
      /** Run on a pseudo-terminal of this size; stdout and stderr arrive together on fd 1. */
      pty: ptySize.optional(),
    })
    .strict(),
  z.object({ t: z.literal("resize"), id: requestId, cols: ptySize.shape.cols, rows: ptySize.shape.rows }).strict(),
  /** Input for a running command; payload holds the bytes. `eof` closes its stdin after them. */
  z.object({ t: z.literal("stdin"), id: requestId, eof: z.boolean().default(false) }).strict(),
  z.object({ t: z.literal("signal"), id: requestId, signal: signalName }).strict(),
  /** The host has consumed `bytes` more output bytes of command `id`. */
  z
    .object({
      t: z.literal("credit"),
      id: requestId,
      bytes: z
        .number()
        .int()
        .min(1)
        .max(2 ** 31),
    })
    .strict(),
  /**
   * Reads a file: the agent opens it (following symlinks) and answers `stat_result` with the
   * opened file's stat, then at most `stat.size` bytes in `file_chunk` frames, then `file_done`.
   */
  z.object({ t: z.literal("file_read"), id: requestId, path: guestPath }).strict(),
  /** Starts an atomic write; the data follows in `file_chunk` frames, the last with `eof`. */
  z
    .object({
      t: z.literal("file_write"),
      id: requestId,
      path: guestPath,
      mode: z.number().int().min(0).max(0o7777).optional(),
      if_sha256: z
        .string()
        .regex(/^[0-9a-f]{64}$/)
        .optional(),
    })
    .strict(),
  z.object({ t: z.literal("file_chunk"), id: requestId, eof: z.boolean().default(false) }).strict(),
  /** With `sha256`, a regular file's stat also carries its content hash (the file is read). */
  z.object({ t: z.literal("stat"), id: requestId, path: guestPath, sha256: z.boolean().default(false) }).strict(),
  /** Lists a directory: `list_result` with the entries as JSON in its payload. */
  z.object({ t: z.literal("list"), id: requestId, path: guestPath }).strict(),
  /** The host gives up on file read or write `id`; an unfinished write is discarded. */
  z.object({ t: z.literal("cancel"), id: requestId }).strict(),
  z.object({ t: z.literal("mkdir"), id: requestId, path: guestPath, parents: z.boolean().default(false) }).strict(),
  z.object({ t: z.literal("remove"), id: requestId, path: guestPath, recursive: z.boolean().default(false) }).strict(),
  z.object({ t: z.literal("rename"), id: requestId, from: guestPath, to: guestPath }).strict(),
  /** Lists the guest's listening TCP sockets: answered with `ports_result`. */
  z.object({ t: z.literal("ports_list"), id: requestId }).strict(),
  /**
   * Opens a TCP connection to `port` on the guest's loopback: answered with `tcp_opened`, or an
   * `error` (`refused` when nothing listens). Bytes then flow as `tcp_data` both ways: the host's
   * under `tcp_ack`, the guest's under `credit`; `cancel` resets it, and `tcp_closed` ends it.
   */
  z.object({ t: z.literal("tcp_open"), id: requestId, port: tcpPort }).strict(),
  /** Bytes for connection `id` (payload); `eof` half-closes the sending side after them. */
  z.object({ t: z.literal("tcp_data"), id: requestId, eof: z.boolean().default(false) }).strict(),
  /**
   * The sandbox's limits, applied by the guest before the sandbox is handed out (answered with
   * `done`): at most `max_processes` processes (threads included) under its commands, and, for
   * VM guests whose disk the host just grew, the root file system grown online to `root_bytes`.
   */
  z
    .object({
      t: z.literal("limits"),
      id: requestId,
      max_processes: z.number().int().min(1).max(4_194_304),
      root_bytes: z.number().int().min(1).optional(),
    })
    .strict(),
  /**
   * The volumes a VM guest mounts (answered with `done`): each the virtio disk whose serial the
   * host gave it, mounted at `path` (read-only for a reader). The host chose the disks; the guest
   * only finds them by serial. A volume already mounted there (a restored guest) is left as it is.
   */
  z
    .object({
      t: z.literal("volumes"),
      id: requestId,
      mounts: z
        .array(
          z
            .object({
              serial: z.string().regex(/^[a-z0-9-]{1,20}$/),
              path: z.string().regex(/^\/[^\0\n]{1,1023}$/),
              read_only: z.boolean(),
            })
            .strict(),
        )
        .max(16),
    })
    .strict(),
  /**
   * Who the sandbox is, sent after the handshake by drivers whose guests share a boot (QEMU
   * snapshots): hostname, the environment commands get, the host's clock, and fresh entropy in
   * the payload (at least 32 bytes) that the guest credits to its kernel RNG before answering.
   */
  z
    .object({
      t: z.literal("identity"),
      id: requestId,
      sandbox_id: z.string().regex(/^[a-z0-9_]{1,64}$/),
      hostname: z.string().regex(/^[a-zA-Z0-9][a-zA-Z0-9_-]{0,62}$/),
      env: envMap,
      time_ms: z.number().int().min(0),
    })
    .strict(),
]);
export type HostFrame = z.input<typeof hostFrame>;
export type ParsedHostFrame = z.output<typeof hostFrame>;

// ---- guest → host -------------------------------------------------------------------------------

export const fileStat = z.object({
  type: z.enum(["file", "dir", "symlink", "other"]),
  size: z.number().int().min(0),
  mode: z.number().int().min(0),
  mtime_ms: z.number(),
  sha256: z
    .string()
    .regex(/^[0-9a-f]{64}$/)
    .optional(),
});

/** Directory entries travel in a list_result payload; at most this many per listing. */
export const MAX_LIST_ENTRIES = 5000;
export const dirEntry = fileStat.omit({ sha256: true }).extend({ name: z.string().min(1).max(4096) });
export const dirEntries = z.array(dirEntry).max(MAX_LIST_ENTRIES);
export type DirEntry = z.infer<typeof dirEntry>;
export type FileStat = z.infer<typeof fileStat>;

export const guestFrame = z.discriminatedUnion("t", [
  z
    .object({ t: z.literal("hello"), gen: z.number().int(), agent: z.string().max(200), pid: z.number().int() })
    .strict(),
  z.object({ t: z.literal("started"), id: requestId, pid: z.number().int() }).strict(),
  /** Output of command `id` on fd 1 (stdout) or 2 (stderr); payload holds the bytes. */
  z.object({ t: z.literal("output"), id: requestId, fd: z.union([z.literal(1), z.literal(2)]) }).strict(),
  z
    .object({
      t: z.literal("exited"),
      id: requestId,
      code: z.number().int().nullable(),
      signal: z.string().max(32).nullable(),
      /** The guest kernel's OOM killer ended it (VM guests; gVisor ends the whole sandbox instead). */
      oom_killed: z.boolean().optional(),
    })
    .strict(),
  /** A chunk of a file being read; payload holds the bytes. */
  z.object({ t: z.literal("file_chunk"), id: requestId }).strict(),
  z.object({ t: z.literal("file_done"), id: requestId, size: z.number().int().min(0), sha256: z.string() }).strict(),
  z.object({ t: z.literal("stat_result"), id: requestId, stat: fileStat }).strict(),
  z.object({ t: z.literal("list_result"), id: requestId, truncated: z.boolean() }).strict(),
  /** A file operation without a result (mkdir, remove, rename) has completed. */
  z.object({ t: z.literal("done"), id: requestId }).strict(),
  /** `bytes` more of an upload have been written; the host may send that much more. */
  z.object({ t: z.literal("file_ack"), id: requestId, bytes: z.number().int().min(0) }).strict(),
  z.object({ t: z.literal("identity_done"), id: requestId }).strict(),
  z
    .object({
      t: z.literal("ports_result"),
      id: requestId,
      ports: z.array(z.object({ port: tcpPort, address: z.string().max(64) }).strict()).max(MAX_LISTED_PORTS),
    })
    .strict(),
  z.object({ t: z.literal("tcp_opened"), id: requestId }).strict(),
  z.object({ t: z.literal("tcp_data"), id: requestId, eof: z.boolean().default(false) }).strict(),
  /** `bytes` more the host sent on connection `id` have been written to its socket. */
  z.object({ t: z.literal("tcp_ack"), id: requestId, bytes: z.number().int().min(0) }).strict(),
  /** Connection `id` is over (its id is free); `error` says why when it did not end cleanly. */
  z.object({ t: z.literal("tcp_closed"), id: requestId, error: z.string().max(4096).optional() }).strict(),
  z
    .object({
      t: z.literal("error"),
      id: requestId.optional(),
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
      message: z.string().max(4096),
    })
    .strict(),
]);
export type GuestFrame = z.infer<typeof guestFrame>;
