import { describe, expect, it } from "vitest";
import { parseListening } from "../src/ports.ts";

// Lines as Linux writes them (gVisor writes the same columns).
const TCP = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 0100007F:1F41 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0 100 0 0 10 0
   2: 0100007F:1F40 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0 20 4 30 10 -1
`;
const TCP6 = `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:0BB8 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4 1 0 100 0 0 10 0
   1: 00000000000000000000000001000000:1389 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5 1 0 100 0 0 10 0
   2: 0000000000000000FFFF00000100007F:0050 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 6 1 0 100 0 0 10 0
`;

describe("listening sockets from /proc/net/tcp and tcp6", () => {
  it("reads LISTEN rows only, with their address and port", () => {
    expect(parseListening(TCP, false)).toEqual([
      { port: 8000, address: "0.0.0.0" },
      { port: 8001, address: "127.0.0.1" },
    ]);
  });

  it("writes IPv6 addresses in their short form", () => {
    expect(parseListening(TCP6, true)).toEqual([
      { port: 3000, address: "::" },
      { port: 5001, address: "::1" },
      { port: 80, address: "::ffff:7f00:1" },
    ]);
  });
});
