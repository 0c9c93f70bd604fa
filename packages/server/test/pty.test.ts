import { describe, expect, it } from "vitest";
import { runCommand } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { useServerWithSandbox } from "./helpers/suite.ts";
import type { TestServer } from "./helpers/test-server.ts";

for (const driver of testDrivers()) {
  describe.skipIf(driver.missing !== undefined)(driverTitle(driver, "PTY mode"), () => {
    let ts: TestServer;
    let id: string;

    useServerWithSandbox(driver.name, (server, sandbox) => {
      ts = server;
      id = sandbox;
    });

    it("runs the command on a terminal of the requested size", async () => {
      const r = await runCommand(ts.wsUrl, id, {
        cmd: "tty; stty size; test -t 1 && echo is-a-tty",
        pty: { cols: 100, rows: 30 },
      });
      expect(r.stdout).toMatch(/^\/dev\/pts\/\d+\r\n30 100\r\nis-a-tty\r\n$/);
      expect(r.exit?.exit_code).toBe(0);
    });

    it("takes typed input and echoes it like a terminal", async () => {
      const r = await runCommand(
        ts.wsUrl,
        id,
        { cmd: "read name; echo hello $name", pty: true, timeout_s: 60 },
        {
          onEvent: (ev, ws) => {
            if (ev.type === "started")
              setTimeout(() => ws.send(JSON.stringify({ type: "stdin", data: "bothy\r" })), 300);
          },
        },
      );
      expect(r.stdout).toContain("bothy\r\n"); // the terminal's echo
      expect(r.stdout).toContain("hello bothy");
    });

    it("resizes the terminal while the command runs", async () => {
      const r = await runCommand(
        ts.wsUrl,
        id,
        { cmd: "stty size; sleep 2; stty size", pty: { cols: 80, rows: 24 }, timeout_s: 60 },
        {
          onEvent: (ev, ws) => {
            if (ev.type === "stdout" && ev.data.includes("24 80"))
              ws.send(JSON.stringify({ type: "resize", cols: 132, rows: 43 }));
          },
        },
      );
      expect(r.stdout).toBe("24 80\r\n43 132\r\n");
    });

    it("delivers SIGINT to the foreground job and SIGTERM/SIGKILL to the session", async () => {
      // On a terminal the command's status is the shell's: 128 + the signal number.
      for (const [signal, status] of [
        ["SIGINT", 130],
        ["SIGTERM", 143],
        ["SIGKILL", 137],
      ] as const) {
        const r = await runCommand(
          ts.wsUrl,
          id,
          { cmd: "sleep 60; echo not-reached", pty: true, timeout_s: 60 },
          {
            onEvent: (ev, ws) => {
              if (ev.type === "started") setTimeout(() => ws.send(JSON.stringify({ type: "signal", signal })), 500);
            },
          },
        );
        expect(r.stdout).not.toContain("not-reached");
        expect(r.exit?.exit_code).toBe(status);
      }
    });
  });
}
