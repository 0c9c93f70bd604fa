import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { attachCommand, readEventStream, startBackgroundCommand } from "./helpers/background.ts";
import { api, createSandbox, runCommand } from "./helpers/client.ts";
import { driverTitle, testDriver, testDrivers } from "./helpers/drivers.ts";
import { useTestServer } from "./helpers/suite.ts";
import type { TestServer } from "./helpers/test-server.ts";

const pexec = promisify(execFile);
const qemu = testDriver("qemu");
const gvisor = testDrivers().find((d) => d.name === "gvisor");

/** QEMU processes whose command line names this sandbox's directory. */
async function vmProcesses(ts: TestServer, id: string): Promise<string[]> {
  const { stdout } = await pexec("ps", ["-eo", "pid=,args="]);
  return stdout.split("\n").filter((l) => l.includes("qemu-system") && l.includes(join(ts.home, "sandboxes", id)));
}

/**
 * A VM's private memory (RssAnon) and the part of it that is guest RAM (the resident pages of the
 * one anonymous mapping of exactly the guest's size), in MiB. Shared pages of the QEMU binary and
 * its libraries (RssFile) are left out: every VM on the host shares them.
 */
async function vmMemory(
  ts: TestServer,
  id: string,
  memoryMib: number,
): Promise<{ privateMib: number; guestMib: number }> {
  const pid = (await readFile(join(ts.home, "sandboxes", id, "qemu.pid"), "utf8")).trim();
  const status = await readFile(`/proc/${pid}/status`, "utf8");
  const privateKb = Number(/RssAnon:\s+(\d+)/.exec(status)?.[1]);
  let guestKb = 0;
  let inGuestRam = false;
  for (const line of (await readFile(`/proc/${pid}/smaps`, "utf8")).split("\n")) {
    const range = /^([0-9a-f]+)-([0-9a-f]+) /.exec(line);
    if (range) inGuestRam = parseInt(range[2] ?? "0", 16) - parseInt(range[1] ?? "0", 16) === memoryMib * 1024 * 1024;
    const rss = /^Rss:\s+(\d+) kB/.exec(line);
    if (rss && inGuestRam) guestKb += Number(rss[1]);
  }
  return { privateMib: privateKb / 1024, guestMib: guestKb / 1024 };
}

async function sh(ts: TestServer, id: string, cmd: string): Promise<string> {
  const r = await runCommand(ts.wsUrl, id, { cmd });
  if (r.exit?.exit_code !== 0) throw new Error(`${id}: ${cmd} → ${JSON.stringify(r.exit ?? r.error)} ${r.stderr}`);
  return r.stdout;
}

describe.skipIf(qemu.missing !== undefined)(driverTitle(qemu, "QEMU sandboxes"), () => {
  let ts: TestServer;
  useTestServer({ BOTHY_DRIVER: "qemu" }, (s) => (ts = s));

  it("restores two sandboxes from one snapshot with their own identity and different random bytes", async () => {
    const ids = [await createSandbox(ts.url), await createSandbox(ts.url)];
    try {
      const probe =
        "hostname; echo $BOTHY_SANDBOX_ID; date +%s; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; node -e 'console.log(require(\"crypto\").randomBytes(16).toString(\"hex\"))'";
      const [a, b] = await Promise.all(ids.map((id) => sh(ts, id, probe).then((s) => s.trim().split("\n"))));
      for (const [id, lines] of [
        [ids[0], a],
        [ids[1], b],
      ] as const) {
        expect(lines?.[0]).toBe(id);
        expect(lines?.[1]).toBe(id);
        // The clock is the host's, not the snapshot's (generous bound: this is not a speed test).
        expect(Math.abs(Number(lines?.[2]) - Date.now() / 1000)).toBeLessThan(300);
      }
      expect(a?.[3]).toMatch(/^[0-9a-f]{64}$/);
      expect(a?.[3]).not.toBe(b?.[3]);
      expect(a?.[4]).not.toBe(b?.[4]);
      const info = await api(ts.url, "GET", `/sandboxes/${ids[0]}`);
      expect(info.json).toMatchObject({ driver: "qemu", acceleration: expect.stringMatching(/^(tcg|kvm)$/) });
    } finally {
      for (const id of ids) await api(ts.url, "DELETE", `/sandboxes/${id}`);
    }
  });

  it("runs a background command past its socket, re-attaches with replay, and reports its end on /events", async () => {
    const id = await createSandbox(ts.url);
    try {
      const commandId = await startBackgroundCommand(ts.url, id, "echo first; sleep 2; echo second; exit 5");
      const listed = await api(ts.url, "GET", `/sandboxes/${id}/commands`);
      expect(listed.json["commands"]).toEqual(
        expect.arrayContaining([expect.objectContaining({ command_id: commandId, background: true })]),
      );
      const ended = readEventStream(ts.url, `?sandbox_id=${id}&since=0`, (evs) =>
        evs.some((e) => e.type === "command.exited" && e.data["command_id"] === commandId),
      );
      const events = await attachCommand(ts.wsUrl, id, commandId);
      expect(
        events
          .filter((e) => e.type === "stdout")
          .map((e) => (e as { data: string }).data)
          .join(""),
      ).toBe("first\nsecond\n");
      expect(events.at(-1)).toMatchObject({ type: "process_exited", command_id: commandId, exit_code: 5 });
      expect((await ended).find((e) => e.type === "command.exited")?.data).toMatchObject({
        command_id: commandId,
        exit_code: 5,
      });
    } finally {
      await api(ts.url, "DELETE", `/sandboxes/${id}`);
    }
  });

  it("pauses to disk and resumes with files and background processes intact", async () => {
    const id = await createSandbox(ts.url);
    try {
      const pid = (
        await sh(
          ts,
          id,
          "echo kept > /workspace/note; (while true; do echo tick >> /workspace/ticks; sleep 1; done) >/dev/null 2>&1 & echo $!",
        )
      ).trim();
      expect(pid).toMatch(/^\d+$/);

      const paused = await api(ts.url, "POST", `/sandboxes/${id}/pause`);
      expect(paused.status).toBe(200);
      expect(paused.json["state"]).toBe("paused");
      expect(await vmProcesses(ts, id)).toEqual([]);
      expect(existsSync(join(ts.home, "sandboxes", id, "memory.state"))).toBe(true);

      const resumed = await api(ts.url, "POST", `/sandboxes/${id}/resume`);
      expect(resumed.json["state"]).toBe("running");
      expect(await sh(ts, id, "cat /workspace/note")).toBe("kept\n");
      expect(await sh(ts, id, `kill -0 ${pid} && echo alive`)).toBe("alive\n");
      expect(existsSync(join(ts.home, "sandboxes", id, "memory.state"))).toBe(false);

      // A command on a paused sandbox resumes it first.
      await api(ts.url, "POST", `/sandboxes/${id}/pause`);
      expect(await sh(ts, id, `cat /workspace/note; kill -0 ${pid} && echo alive`)).toBe("kept\nalive\n");
      expect((await api(ts.url, "GET", `/sandboxes/${id}`)).json["state"]).toBe("running");

      // So does a file call; and the next request on the same connection is served (the
      // download ends at its Content-Length, not when the slower guest says it is done).
      await api(ts.url, "POST", `/sandboxes/${id}/pause`);
      const file = await fetch(`${ts.url}/sandboxes/${id}/files?path=/workspace/note`);
      expect(file.status).toBe(200);
      expect(await file.text()).toBe("kept\n");
      expect((await api(ts.url, "GET", `/sandboxes/${id}`)).json["state"]).toBe("running");
    } finally {
      await api(ts.url, "DELETE", `/sandboxes/${id}`);
    }
  });

  // The translation cache (BOTHY_QEMU_TB_MIB, 64 by default) plus ~48 MB of QEMU's own.
  it("keeps an idle VM's own memory within the guest memory it uses plus 112 MB", async () => {
    const id = await createSandbox(ts.url, { template: "seed", vcpu: 1, memoryMib: 512 });
    try {
      await sh(ts, id, "echo warm");
      const m = await vmMemory(ts, id, 512);
      expect(m.guestMib).toBeGreaterThan(0);
      console.info(`idle VM: ${m.privateMib.toFixed(0)} MB private, ${m.guestMib.toFixed(0)} MB of it guest memory`);
      expect(m.privateMib - m.guestMib).toBeLessThanOrEqual(112);
    } finally {
      await api(ts.url, "DELETE", `/sandboxes/${id}`);
    }
  });

  it("deletes a paused sandbox with its state file, overlay and sockets", async () => {
    const id = await createSandbox(ts.url);
    await api(ts.url, "POST", `/sandboxes/${id}/pause`);
    const del = await api(ts.url, "DELETE", `/sandboxes/${id}?wait=true`);
    expect(del.json["state"]).toBe("deleted");
    expect(existsSync(join(ts.home, "sandboxes", id))).toBe(false);
    expect(await vmProcesses(ts, id)).toEqual([]);
  });

  it.skipIf(gvisor?.missing !== undefined)(
    "takes a driver per request, and gVisor answers pause with not_supported",
    async () => {
      const res = await api(ts.url, "POST", "/sandboxes", { template: "seed", driver: "gvisor" });
      expect(res.status).toBe(201);
      const id = res.json["sandbox_id"] as string;
      try {
        expect(res.json).toMatchObject({ driver: "gvisor", acceleration: "ptrace" });
        const pause = await api(ts.url, "POST", `/sandboxes/${id}/pause`);
        expect(pause.status).toBe(501);
        expect(pause.json["code"]).toBe("not_supported");
        expect(String(pause.json["detail"])).toMatch(/qemu/);
      } finally {
        await api(ts.url, "DELETE", `/sandboxes/${id}`);
      }
    },
  );
});
