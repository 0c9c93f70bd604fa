import { posix } from "node:path";
import { Code, ConnectError, type HandlerContext, type ServiceImpl } from "@connectrpc/connect";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { FileStat } from "@bothy/protocol";
import type { AgentClient } from "../agent/agent-client.ts";
import type { SandboxManager } from "../sandboxes/sandbox-manager.ts";
import { toConnectError } from "./e2b-errors.ts";
import { HOME } from "./envd-routes.ts";
import { watchGuestDir, type DirChange } from "./dir-watch.ts";
import {
  EventType,
  Filesystem,
  FileType,
  type EntryInfoSchema,
  type WatchDirResponseSchema,
} from "./gen/filesystem_pb.ts";
import { checkRpcUser, sandboxOf } from "./process-service.ts";

type EntryInit = MessageInitShape<typeof EntryInfoSchema>;

/** envd lists at most this deep when asked for more. */
const MAX_DEPTH = 16;

const TYPES: Record<FileStat["type"], FileType> = {
  file: FileType.FILE,
  dir: FileType.DIRECTORY,
  symlink: FileType.SYMLINK,
  other: FileType.UNSPECIFIED,
};

/** Go's FileMode.String(), as envd reports `permissions`: "-rw-r--r--", "drwxr-xr-x", "Lrwxrwxrwx". */
function permissions(type: FileStat["type"], mode: number): string {
  const lead = type === "dir" ? "d" : type === "symlink" ? "L" : "-";
  let bits = "";
  for (let i = 8; i >= 0; i--) bits += mode & (1 << i) ? "rwx"[(8 - i) % 3] : "-";
  return lead + bits;
}

function entry(path: string, stat: Omit<FileStat, "sha256">): EntryInit {
  return {
    name: posix.basename(path),
    type: TYPES[stat.type],
    path,
    size: BigInt(stat.size),
    mode: stat.mode,
    permissions: permissions(stat.type, stat.mode),
    // bothy runs everything as root, and files it makes are root's.
    owner: "root",
    group: "root",
    modifiedTime: timestampFromMs(Math.round(stat.mtime_ms)),
  };
}

async function statEntry(agent: AgentClient, path: string): Promise<EntryInit> {
  return entry(path, await agent.stat(path));
}

async function exists(agent: AgentClient, path: string): Promise<boolean> {
  try {
    await agent.stat(path);
    return true;
  } catch (err) {
    if (toConnectError(err).code === Code.NotFound) return false;
    throw err;
  }
}

const EVENT_TYPES: Record<DirChange["op"], EventType> = {
  create: EventType.CREATE,
  write: EventType.WRITE,
  remove: EventType.REMOVE,
};

/**
 * envd's `filesystem.Filesystem` on the agent's file calls; WatchDir runs a watcher in the guest.
 * The polling watcher RPCs (CreateWatcher, GetWatcherEvents, RemoveWatcher) are not served: the
 * SDKs do not call them.
 */
export function filesystemService(manager: SandboxManager): Partial<ServiceImpl<typeof Filesystem>> {
  /** Runs a call on the sandbox's agent with an absolute path, its errors as Connect codes. */
  const call = async <T>(ctx: HandlerContext, path: string, run: (agent: AgentClient, abs: string) => Promise<T>) => {
    checkRpcUser(ctx);
    if (path === "") throw new ConnectError("path is required", Code.InvalidArgument);
    try {
      return await run(await manager.agent(sandboxOf(ctx)), posix.resolve(HOME, path));
    } catch (err) {
      throw toConnectError(err);
    }
  };

  return {
    stat: (req, ctx) => call(ctx, req.path, async (agent, path) => ({ entry: await statEntry(agent, path) })),

    listDir: (req, ctx) =>
      call(ctx, req.path, async (agent, path) => {
        const root = await agent.stat(path);
        if (root.type !== "dir") throw new ConnectError(`${path} is not a directory`, Code.InvalidArgument);
        const depth = Math.min(Math.max(req.depth, 1), MAX_DEPTH);
        const entries: EntryInit[] = [];
        const walk = async (dir: string, level: number): Promise<void> => {
          for (const e of (await agent.list(dir)).entries) {
            if (e.type === "other") continue;
            const child = posix.join(dir, e.name);
            entries.push(entry(child, e));
            if (e.type === "dir" && level < depth) await walk(child, level + 1);
          }
        };
        await walk(path, 1);
        return { entries };
      }),

    makeDir: (req, ctx) =>
      call(ctx, req.path, async (agent, path) => {
        if (await exists(agent, path)) throw new ConnectError(`${path} already exists`, Code.AlreadyExists);
        await agent.mkdir(path, true);
        return { entry: await statEntry(agent, path) };
      }),

    move: (req, ctx) =>
      call(ctx, req.source, async (agent, source) => {
        if (req.destination === "") throw new ConnectError("destination is required", Code.InvalidArgument);
        const destination = posix.resolve(HOME, req.destination);
        const parent = posix.dirname(destination);
        if (parent !== "/") await agent.mkdir(parent, true);
        await agent.rename(source, destination);
        return { entry: await statEntry(agent, destination) };
      }),

    async *watchDir(req, ctx): AsyncGenerator<MessageInitShape<typeof WatchDirResponseSchema>> {
      checkRpcUser(ctx);
      if (req.path === "") throw new ConnectError("path is required", Code.InvalidArgument);
      const path = posix.resolve(HOME, req.path);
      let agent: AgentClient;
      try {
        agent = await manager.agent(sandboxOf(ctx));
        const stat = await agent.stat(path);
        if (stat.type !== "dir") throw new ConnectError(`${path} is not a directory`, Code.InvalidArgument);
      } catch (err) {
        throw toConnectError(err);
      }
      const interval = Number(ctx.requestHeader.get("keepalive-ping-interval"));
      const keepaliveMs = Number.isFinite(interval) && interval > 0 ? interval * 1000 : undefined;
      try {
        for await (const item of watchGuestDir(agent, path, req.recursive, ctx.signal, keepaliveMs)) {
          if (item === "ready") yield { event: { case: "start", value: {} } };
          else if (item === "keepalive") yield { event: { case: "keepalive", value: {} } };
          else yield { event: { case: "filesystem", value: { name: item.name, type: EVENT_TYPES[item.op] } } };
        }
      } catch (err) {
        throw toConnectError(err);
      }
    },

    remove: (req, ctx) =>
      call(ctx, req.path, async (agent, path) => {
        const stat = await agent.stat(path);
        await agent.remove(path, stat.type === "dir");
        return {};
      }),
  };
}
