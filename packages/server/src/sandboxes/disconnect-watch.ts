import type { SandboxRow } from "../ledger/ledger.ts";
import type { LedgerStore } from "../ledger/store.ts";
import type { Logger, SandboxManager } from "./sandbox-manager.ts";

/** Close codes of a client that leaves on purpose: normal, going away, and a close frame without a code. */
const CLEAN_CLOSE = new Set([1000, 1001, 1005]);

/** A client's connection to a sandbox: a WebSocket (its close code), or an HTTP answer (none). */
export interface ClientConnection {
  once(event: "close", listener: (code?: number) => void): unknown;
}

interface Watched {
  sockets: number;
  /** Of `sockets`, kept command sockets between two commands: connected, but not using the sandbox. */
  idle: number;
  timer: NodeJS.Timeout | undefined;
}

/** A tracked connection: a kept command socket says when it waits between commands. */
export interface TrackedConnection {
  idle(between: boolean): void;
}

/**
 * Deletes `delete_on_disconnect` sandboxes whose client went away. Every WebSocket to a sandbox
 * (command and re-attach) and every command request over HTTP still waiting for its answer is
 * counted; when the last one ends without a clean close from the client (a code other than
 * 1000/1001, or a dropped connection; a close frame without a code is clean; a request whose
 * answer was not sent) a grace timer starts, and any new connection to the sandbox stops it.
 * A connection the server ended (the command exited, an error, the answer sent) is not a client
 * leaving, whatever code the peer answered with.
 */
export class DisconnectWatch {
  private readonly sandboxes = new Map<string, Watched>();
  private closed = false;

  constructor(
    private readonly manager: SandboxManager,
    private readonly ledger: LedgerStore,
    private readonly log: Logger,
  ) {}

  /** Counts `socket` against its sandbox until it closes; `endedByServer` is asked then. */
  track(sandboxId: string, socket: ClientConnection, endedByServer: () => boolean): TrackedConnection {
    if (this.closed) return { idle: () => undefined };
    const w = this.sandboxes.get(sandboxId) ?? { sockets: 0, idle: 0, timer: undefined };
    let between = false;
    const handle: TrackedConnection = {
      idle: (on) => {
        if (on === between) return;
        between = on;
        w.idle += on ? 1 : -1;
      },
    };
    this.sandboxes.set(sandboxId, w);
    w.sockets++;
    if (w.timer) {
      clearTimeout(w.timer);
      w.timer = undefined;
      this.log("disconnect_grace_cancelled", { sandbox_id: sandboxId });
    }
    socket.once("close", (code?: number) => {
      handle.idle(false);
      this.ended(sandboxId, w, (code !== undefined && CLEAN_CLOSE.has(code)) || endedByServer(), code);
    });
    return handle;
  }

  private ended(sandboxId: string, w: Watched, clean: boolean, code: number | undefined): void {
    w.sockets--;
    if (this.closed || w.sockets > 0) return;
    if (clean) {
      this.sandboxes.delete(sandboxId);
      return;
    }
    this.ledger.getSandbox(sandboxId).then(
      (row) => this.endedUnclean(sandboxId, w, row, code),
      (err: unknown) =>
        this.log("ledger_write_failed", {
          what: "disconnect watch",
          sandbox_id: sandboxId,
          error: (err as Error).message,
        }),
    );
  }

  private endedUnclean(sandboxId: string, w: Watched, row: SandboxRow | undefined, code: number | undefined): void {
    // A client came back while the row was read.
    if (this.closed || w.sockets > 0) return;
    if (row?.delete_on_disconnect !== 1) {
      this.sandboxes.delete(sandboxId);
      return;
    }
    const graceS = row.disconnect_grace_s ?? 0;
    this.log("disconnect_grace_started", { sandbox_id: sandboxId, close_code: code, grace_s: graceS });
    w.timer = setTimeout(() => {
      w.timer = undefined;
      if (this.closed || w.sockets > 0) return;
      this.sandboxes.delete(sandboxId);
      this.manager
        .delete(sandboxId, "disconnected")
        .catch((err: unknown) =>
          this.log("disconnect_delete_failed", { sandbox_id: sandboxId, error: (err as Error).message }),
        );
    }, graceS * 1000);
    w.timer.unref();
  }

  /**
   * Client connections open to the sandbox right now and in use: a kept command socket waiting
   * between commands is not counted (it must not keep its sandbox awake; its next command wakes it).
   */
  inUse(sandboxId: string): number {
    const w = this.sandboxes.get(sandboxId);
    return w ? w.sockets - w.idle : 0;
  }

  /** Stops every timer: a server that is stopping closes its sockets itself. */
  close(): void {
    this.closed = true;
    for (const w of this.sandboxes.values()) clearTimeout(w.timer);
    this.sandboxes.clear();
  }
}
