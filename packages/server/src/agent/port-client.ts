/**
 * Ports in the guest over the agent channel: which TCP sockets listen there, and a connection to
 * one of them relayed as a TcpStream, each direction within its window.
 */
import { BothyError } from "@bothy/protocol";
import type { AgentChannel } from "./agent-channel.ts";
import { TcpStream } from "./tcp-stream.ts";

export interface ListeningPort {
  port: number;
  address: string;
}

/** How long opening a connection to a port inside the guest may take. */
export const CONNECT_TIMEOUT_MS = 15_000;

export class PortClient {
  constructor(private readonly channel: AgentChannel) {}

  /** The TCP sockets listening inside the guest. */
  listPorts(): Promise<ListeningPort[]> {
    return this.channel.request(
      "ports_list",
      (id) => ({ t: "ports_list", id }),
      "ports_result",
      (frame) => frame.ports,
    );
  }

  /**
   * Opens a TCP connection to `port` on the guest's loopback, relayed over the guest channel.
   * Fails with `port_not_listening` when nothing listens there, `agent_timeout` when the guest
   * has not connected within the connect timeout. Destroying the stream resets the guest's socket.
   */
  openTcp(port: number): Promise<TcpStream> {
    const channel = this.channel;
    return new Promise((resolve, reject) => {
      let opened = false;
      const stream = new TcpStream({
        data: (payload, eof) => channel.send({ t: "tcp_data", id, eof }, payload),
        credit: (bytes) => channel.creditOutput(id, bytes),
        cancel: () => {
          channel.settle(id);
          channel.forgetCredit(id);
          channel.send({ t: "cancel", id });
        },
      });
      const fail = (e: BothyError): void => {
        if (opened) stream.destroy(e);
        else {
          stream.destroy();
          reject(e);
        }
      };
      const id = channel.allocate({
        frame: (frame, payload) => {
          switch (frame.t) {
            case "tcp_opened":
              channel.disarm(id);
              opened = true;
              resolve(stream);
              return true;
            case "tcp_data":
              stream.received(payload, frame.eof);
              return true;
            case "tcp_ack":
              stream.acked(frame.bytes);
              return true;
            case "tcp_closed":
              channel.settle(id);
              channel.forgetCredit(id);
              stream.guestClosed(frame.error);
              return true;
            case "error":
              channel.settle(id);
              fail(
                new BothyError(frame.code === "refused" ? "port_not_listening" : "agent_unavailable", frame.message, {
                  details: { guest_code: frame.code },
                }),
              );
              return true;
            default:
              return false;
          }
        },
        fail,
      });
      channel.send({ t: "tcp_open", id, port });
      channel.arm(id, `connect to port ${port}`, CONNECT_TIMEOUT_MS);
    });
  }
}
