/**
 * The idle kept command sockets of one sandbox object (`GET /sandboxes/{id}/command?keep=true`),
 * like an HTTP agent's keep-alive sockets: a foreground command takes an idle one or opens a new
 * one (so concurrent commands each have their own), and gives it back once the server is between
 * commands. While idle a socket does not keep the Node process alive (its TCP socket is unref'd),
 * closes after IDLE_MS, and closes cleanly (1000) when the process exits, so a server does not see
 * a client that dropped (which would start a `delete_on_disconnect` sandbox's grace).
 */
import type { Socket } from "node:net";
import WebSocket from "ws";

/** A kept socket idle this long is closed: an SDK user's agent loop may pause between commands. */
const IDLE_MS = 30_000;

interface Idle {
  ws: WebSocket;
  tcp: Socket | undefined;
  timer: NodeJS.Timeout;
  onClose: () => void;
}

/** Pools with idle sockets, closed cleanly at exit by one listener for the whole process. */
const withIdle = new Set<KeptSockets>();
let exitHook = false;

export class KeptSockets {
  private readonly idle: Idle[] = [];
  private closed = false;

  /** The most recently used idle socket, ref'd again for a command; undefined when none is open. */
  take(): { ws: WebSocket; tcp: Socket | undefined } | undefined {
    for (let it = this.idle.pop(); it; it = this.idle.pop()) {
      this.forget(it);
      if (it.ws.readyState !== WebSocket.OPEN) continue;
      it.tcp?.ref();
      return { ws: it.ws, tcp: it.tcp };
    }
    return undefined;
  }

  /** A socket whose command has ended and whose server waits for the next: kept, unless closed. */
  release(ws: WebSocket, tcp: Socket | undefined): void {
    if (this.closed || ws.readyState !== WebSocket.OPEN) {
      if (ws.readyState === WebSocket.OPEN) ws.close(1000, "done");
      return;
    }
    tcp?.unref();
    const it: Idle = {
      ws,
      tcp,
      timer: setTimeout(() => ws.close(1000, "idle"), IDLE_MS).unref(),
      // Closed by the server (its own idle timeout, the sandbox deleted) or the network: dropped.
      onClose: () => {
        const i = this.idle.indexOf(it);
        if (i >= 0) this.idle.splice(i, 1);
        this.forget(it);
      },
    };
    ws.on("close", it.onClose);
    // An idle socket's frames (the server's last words before it closes) need no reader.
    ws.on("message", ignore);
    ws.on("error", ignore);
    this.idle.push(it);
    withIdle.add(this);
    if (!exitHook) {
      exitHook = true;
      process.once("exit", () => {
        for (const pool of withIdle) pool.close("client exiting");
      });
    }
  }

  /** Closes the idle sockets (1000) and every one given back later. */
  close(reason = "done"): void {
    this.closed = true;
    for (let it = this.idle.pop(); it; it = this.idle.pop()) {
      this.forget(it);
      it.ws.close(1000, reason);
    }
  }

  private forget(it: Idle): void {
    clearTimeout(it.timer);
    it.ws.off("close", it.onClose);
    it.ws.off("message", ignore);
    it.ws.off("error", ignore);
    if (this.idle.length === 0) withIdle.delete(this);
  }
}

function ignore(): void {}
