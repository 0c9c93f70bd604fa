import { spawn } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { testTemplatesDir } from "../../../test/paths.ts";
import { api, createSandbox, runCommand } from "../../server/test/helpers/client.ts";
import { hostLeaks, noLeaks } from "../../server/test/helpers/host-state.ts";
import { watchServe } from "../../server/test/helpers/serve-process.ts";

const BOTHY = fileURLToPath(new URL("../bin/bothy.js", import.meta.url));

describe("bothy serve", () => {
  it("serves the API as its own process, logs lifecycle events, and stops cleanly on SIGTERM", async () => {
    const home = await mkdtemp("/tmp/bothy-serve-");
    const child = spawn(process.execPath, [BOTHY, "serve"], {
      env: {
        ...process.env,
        BOTHY_HOME: home,
        BOTHY_TEMPLATES_DIR: testTemplatesDir(),
        BOTHY_PORT: "0",
        BOTHY_POOL_SIZE: "1",
        BOTHY_NETWORK: "off",
      },
      stdio: ["ignore", "pipe", "inherit"],
    });
    const { logs, url } = watchServe(child);
    const exited = new Promise<number | null>((r) => child.once("exit", (code) => r(code)));
    try {
      const base = await url;
      const id = await createSandbox(base);
      const r = await runCommand(base.replace(/^http/, "ws"), id, { cmd: "echo served" });
      expect(r.stdout).toBe("served\n");
      expect((await api(base, "DELETE", `/sandboxes/${id}`)).status).toBe(200);

      const events = logs.filter((l) => l["sandbox_id"] === id).map((l) => l["event"]);
      expect(events).toEqual(
        expect.arrayContaining(["sandbox_created", "command_started", "command_exited", "sandbox_deleted"]),
      );
      child.kill("SIGTERM");
      expect(await exited).toBe(0);
      expect(await hostLeaks(home)).toEqual(noLeaks());
    } finally {
      child.kill("SIGKILL");
      await rm(home, { recursive: true, force: true });
    }
  });
});
