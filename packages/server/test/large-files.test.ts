import { createHash } from "node:crypto";
import { request } from "node:http";
import { Readable } from "node:stream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { noLeaks } from "./helpers/host-state.ts";
import { createSandbox, runCommand } from "./helpers/client.ts";
import { driverTitle, testDrivers } from "./helpers/drivers.ts";
import { startTestServer, type TestServer } from "./helpers/test-server.ts";

/**
 * 1 GB up and down through the files API, generated and hashed on the fly so the test itself
 * holds no copy. Under QEMU's software emulation the guest moves bytes ~10x slower (~1 MB/s on
 * the 2026-11-30 host), so that driver streams a smaller file by default: 16 MB, eight times the
 * upload window (UPLOAD_WINDOW_BYTES), still paced end to end and checked whole; the memory bound
 * is what gVisor's 1 GB shows (BOTHY_TEST_BIG_FILE_MB overrides both).
 */
const SIZE_MB: Record<string, number> = { gvisor: 1024, qemu: 16 };
const CHUNK = 1024 * 1024;

function chunkAt(i: number): Buffer {
  // Cheap, deterministic, not constant (so nothing along the way can compress it away).
  const b = Buffer.alloc(CHUNK);
  for (let off = 0; off < CHUNK; off += 4) b.writeUInt32LE((i * 2654435761 + off * 40503) >>> 0, off);
  return b;
}

for (const driver of testDrivers()) {
  describe.skipIf(driver.missing !== undefined)(driverTitle(driver, "large files"), () => {
    let ts: TestServer;
    let id: string;
    const mb = Number(process.env["BOTHY_TEST_BIG_FILE_MB"] ?? SIZE_MB[driver.name] ?? 128);

    beforeAll(async () => {
      ts = await startTestServer({ BOTHY_DRIVER: driver.name });
      id = await createSandbox(ts.url, { template: "seed", vcpu: 1, memoryMib: 512 });
    });

    afterAll(async () => {
      expect(await ts?.stop()).toEqual(noLeaks());
    });

    it(`streams a ${mb} MB file in and out without buffering it`, { timeout: 900_000 }, async () => {
      const rssBefore = process.memoryUsage().rss;
      let peak = rssBefore;
      const sampler = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 50);
      try {
        const upHash = createHash("sha256");
        // node:http rather than fetch: undici reads a request body stream as fast as it can,
        // whatever the server's pace, which would measure the client's buffer, not bothy's.
        const source = Readable.from(
          (function* () {
            for (let i = 0; i < mb; i++) {
              const c = chunkAt(i);
              upHash.update(c);
              yield c;
            }
          })(),
        );
        const written = await new Promise<{ size: number; sha256: string }>((resolve, reject) => {
          const req = request(
            `${ts.url}/sandboxes/${id}/files?path=/workspace/big.bin`,
            { method: "PUT", headers: { "content-type": "application/octet-stream" } },
            (res) => {
              let text = "";
              res.on("data", (c: Buffer) => (text += c.toString()));
              res.on("end", () => resolve(JSON.parse(text) as { size: number; sha256: string }));
            },
          );
          req.on("error", reject);
          source.pipe(req);
        });
        const expected = upHash.digest("hex");
        expect(written).toMatchObject({ size: mb * CHUNK, sha256: expected });

        const get = await fetch(`${ts.url}/sandboxes/${id}/files?path=/workspace/big.bin`);
        const downHash = createHash("sha256");
        let size = 0;
        for await (const chunk of get.body as unknown as AsyncIterable<Uint8Array>) {
          downHash.update(chunk);
          size += chunk.length;
        }
        expect(size).toBe(mb * CHUNK);
        expect(downHash.digest("hex")).toBe(expected);
      } finally {
        clearInterval(sampler);
      }
      const growthMb = (peak - rssBefore) / 1024 / 1024;
      console.info(`${driver.name}: ${mb} MB up and down; server+client RSS grew ${growthMb.toFixed(1)} MB`);
      expect(growthMb).toBeLessThan(150);
      const rm = await runCommand(ts.wsUrl, id, { cmd: "rm /workspace/big.bin" });
      expect(rm.exit?.exit_code).toBe(0);
    });
  });
}
