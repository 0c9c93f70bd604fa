/** One open relay as the meter reads it. */
export interface MeteredRelay {
  /** Bytes the client sent that the host holds until the sandbox takes them. */
  heldBytes(): number;
  /** Whether the relay has stopped reading the client (its bytes wait in the client and the kernel). */
  paused(): boolean;
  /** Ends it (both sides) at once: the server is shutting down. */
  close(): void;
}

export interface RelayGauges {
  flowing: number;
  paused: number;
  heldBytes: number;
}

/**
 * The open byte relays into sandboxes (the TCP tunnel, the VNC stream, port WebSockets), read at
 * scrape time: how many have paused their client and how many bytes the host holds for them.
 * That a sandbox which never reads cannot make the host buffer without bound is what
 * `bothy_relay_held_bytes` shows.
 */
export class RelayMeter {
  private readonly open = new Set<MeteredRelay>();

  /** Counts `relay` until the returned function is called. */
  track(relay: MeteredRelay): () => void {
    this.open.add(relay);
    return () => this.open.delete(relay);
  }

  /**
   * Ends every open relay. A paused one reads nothing from its client, so the client's going
   * away is not seen and the connection would hold the server's close open.
   */
  closeAll(): void {
    for (const relay of [...this.open]) relay.close();
    this.open.clear();
  }

  gauges(): RelayGauges {
    const g: RelayGauges = { flowing: 0, paused: 0, heldBytes: 0 };
    for (const relay of this.open) {
      if (relay.paused()) g.paused++;
      else g.flowing++;
      g.heldBytes += relay.heldBytes();
    }
    return g;
  }
}
