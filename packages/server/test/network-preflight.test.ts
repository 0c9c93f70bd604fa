import { describe, expect, it } from "vitest";
import { HostNetwork } from "../src/network/host-network.ts";

/**
 * The start-up checks that refuse before anything on the host changes: each one says what to
 * do. (ip_forward being turned on and logged is checked by network.test.ts, in its own namespace.)
 */
const base = {
  tag: "test",
  sandboxesDir: "/nonexistent",
  pool: "10.179.0.0/16",
  uplink: undefined,
  dns: ["1.1.1.1", "8.8.8.8"],
  extraBlocked: [],
  log: () => undefined,
};

describe("network start-up checks", () => {
  it("refuses an uplink that does not exist, naming the setting to fix", async () => {
    const net = new HostNetwork({ ...base, uplink: "bothy-nope0" });
    await expect(net.preflight()).rejects.toMatchObject({
      name: "HostSetupError",
      message: expect.stringMatching(/uplink interface bothy-nope0 does not exist.*BOTHY_UPLINK.*BOTHY_NETWORK=off/),
    });
  });

  it("refuses when nft is not installed, saying what to install", async () => {
    const path = process.env["PATH"];
    process.env["PATH"] = "/nonexistent";
    try {
      await expect(new HostNetwork({ ...base }).preflight()).rejects.toMatchObject({
        name: "HostSetupError",
        message: expect.stringMatching(/apt-get install nftables/),
      });
    } finally {
      process.env["PATH"] = path;
    }
  });

  it("refuses a private resolver in BOTHY_DNS", async () => {
    const net = new HostNetwork({ ...base, uplink: "lo", dns: ["10.0.0.2"] });
    await expect(net.preflight()).rejects.toMatchObject({
      message: expect.stringMatching(/BOTHY_DNS names 10\.0\.0\.2, inside 10\.0\.0\.0\/8/),
    });
  });
});
