/** Which Host headers a server without keys answers (auth/host-check.ts): a web page's rebound name is not one. */
import { describe, expect, it } from "vitest";
import { hostAllowed, hostName } from "../src/auth/host-check.ts";

describe("Host check for BOTHY_AUTH=none", () => {
  const names = { bindHost: "127.0.0.1", previewDomain: "preview.example.com" };

  it("answers loopback names and addresses, BOTHY_HOST and the preview domain, with or without a port", () => {
    for (const host of [
      "localhost",
      "LOCALHOST:8080",
      "localhost.",
      "app.localhost:3000",
      "127.0.0.1:8080",
      "127.1.2.3",
      "[::1]:8080",
      "[::1]",
      "preview.example.com",
      "8000-sbx_aaaaaaaaaaaaaaaaaaaa.preview.example.com:8080",
    ])
      expect([host, hostAllowed(host, names)]).toEqual([host, true]);
    expect(hostAllowed("bothy.internal:8080", { bindHost: "bothy.internal", previewDomain: undefined })).toBe(true);
    expect(hostAllowed("[::1]:8080", { bindHost: "::1", previewDomain: undefined })).toBe(true);
  });

  it("refuses every other name, look-alikes and malformed values included", () => {
    for (const host of [
      "evil.example",
      "evil.example:8080",
      "127.0.0.1.evil.example",
      "localhost.evil.example",
      "evilpreview.example.com",
      "preview.example.com.evil.example",
      "0x7f000001",
      "2130706433",
      "[::ffff:7f00:1]",
      "localhost:8080:80",
      "local host",
      "",
      ":8080",
      "user@localhost",
    ])
      expect([host, hostAllowed(host, names)]).toEqual([host, false]);
  });

  it("reads the name of a Host header", () => {
    expect(hostName("Example.COM.:443")).toBe("example.com");
    expect(hostName("[::1]:80")).toBe("[::1]");
    expect(hostName("a b")).toBeUndefined();
  });
});
