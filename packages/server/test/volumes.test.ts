/**
 * Volumes on a real server (gVisor): data that outlives sandboxes, a full volume that gives the
 * guest ENOSPC without filling the host, one writer and any readers, paths a volume may not
 * cover, tenant isolation and the storage quota, seen from the attacker's side (a sandbox's code,
 * another tenant's key); and, on a `bothy serve` killed and restarted, a mounted volume that keeps
 * working and leaves nothing behind. The driver does not matter to the API's checks, which run on
 * gVisor alone. The QEMU part (one VM doing most of it) checks what differs there: a volume is a
 * virtio disk the guest mounts, read-only for a reader at the device, and the combinations that
 * would put two file systems' caches on one image are refused (docs/architecture.md, Volumes).
 */
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { stat, statfs } from "node:fs/promises";
import { mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import { existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ConflictError, NotFoundError, Sandbox, Volume } from "@bothy/sdk";
import { Sandbox as E2bSandbox, Volume as E2bVolume } from "e2b";
import { api, deleteSandbox, pollUntil, runCommand, waitDeleted, waitForState } from "./helpers/client.ts";
import { useE2bEnv } from "./helpers/e2b-env.ts";
import { testDriver } from "./helpers/drivers.ts";
import { hostLeaks, noLeaks } from "./helpers/host-state.ts";
import { spawnTestServe, type ServeProcess } from "./helpers/serve-process.ts";
import { useTestServer } from "./helpers/suite.ts";
import type { TestServer } from "./helpers/test-server.ts";

const MIB = 1024 * 1024;
const VOLUME_MIB = 64;

/** A create's body mounting `volumes`. */
const withVolumes = (volumes: unknown[]): Record<string, unknown> => ({
  template: "seed",
  vcpu: 1,
  memory_mib: 512,
  volumes,
});

async function hostFreeBytes(path: string): Promise<number> {
  const s = await statfs(path);
  return s.bavail * s.bsize;
}

/** Volume mounts of a home on the host (volumes/<id>/mnt). */
async function volumeMounts(home: string): Promise<string[]> {
  return (await readFile("/proc/self/mounts", "utf8"))
    .split("\n")
    .filter((l) => l.split(" ")[1]?.startsWith(join(home, "volumes") + "/"));
}

describe("volumes (gVisor)", () => {
  let ts: TestServer;
  let bKey = "";
  const asB = (): Record<string, string> => ({ authorization: `Bearer ${bKey}` });
  /** The sandbox that mounts `data` read-write from the second test on. */
  let writer = "";
  let reader = "";

  useTestServer({ BOTHY_DRIVER: "gvisor" }, (s) => (ts = s));

  beforeAll(async () => {
    expect((await api(ts.url, "POST", "/tenants", { tenant: "b" })).status).toBe(201);
    const key = await api(ts.url, "POST", "/keys", { tenant: "b", name: "b" });
    expect(key.status).toBe(201);
    bKey = String(key.json["key"]);
    const made = await api(ts.url, "POST", "/volumes", { name: "data", size_mib: VOLUME_MIB });
    expect(made.status, JSON.stringify(made.json)).toBe(201);
    expect(made.json).toMatchObject({ name: "data", size_mib: VOLUME_MIB, mounted_by: [] });
  });

  it("keeps what one sandbox wrote for the next, after the first is deleted", { timeout: 120_000 }, async () => {
    const a = await api(ts.url, "POST", "/sandboxes", withVolumes([{ name: "data", path: "/data" }]));
    expect(a.status, JSON.stringify(a.json)).toBe(201);
    const first = String(a.json["sandbox_id"]);
    const wrote = await runCommand(ts.wsUrl, first, { cmd: "echo kept-across > /data/note && sync && echo ok" });
    expect(wrote.stdout, wrote.stderr).toBe("ok\n");
    expect((await api(ts.url, "GET", "/volumes/data")).json["mounted_by"]).toEqual([
      { sandbox_id: first, path: "/data", read_only: false },
    ]);
    expect(await deleteSandbox(ts.url, first)).toBe("deleted");
    // The last sandbox using it is gone: so is its host mount.
    expect(await volumeMounts(ts.home)).toEqual([]);

    const b = await api(ts.url, "POST", "/sandboxes", withVolumes([{ name: "data", path: "/mnt/shared" }]));
    expect(b.status, JSON.stringify(b.json)).toBe(201);
    writer = String(b.json["sandbox_id"]);
    expect((await runCommand(ts.wsUrl, writer, { cmd: "cat /mnt/shared/note" })).stdout).toBe("kept-across\n");
  });

  it("gives a sandbox that fills its volume ENOSPC, and the host's disk at most the volume's size", async () => {
    const before = await hostFreeBytes(ts.home);
    const fill = await runCommand(ts.wsUrl, writer, {
      cmd: `dd if=/dev/zero of=/mnt/shared/fill bs=1M count=${VOLUME_MIB * 4} conv=fsync; echo "exit=$?"`,
    });
    expect(fill.stderr).toMatch(/No space left on device/);
    expect(fill.stdout).toMatch(/exit=1/);
    const after = await hostFreeBytes(ts.home);
    // Other tests of the machine write too: the margin is the volume's whole size, not a timing.
    expect(before - after).toBeLessThan(VOLUME_MIB * 2 * MIB);
    expect((await runCommand(ts.wsUrl, writer, { cmd: "rm /mnt/shared/fill && echo freed" })).stdout).toBe("freed\n");
  });

  it("refuses a second read-write mount, naming the writer; a reader cannot write (EROFS)", async () => {
    const second = await api(ts.url, "POST", "/sandboxes", withVolumes([{ name: "data", path: "/data" }]));
    expect(second.status).toBe(409);
    expect(second.type).toMatch(/problem\+json/);
    expect(second.json["code"]).toBe("volume_in_use");
    expect(String(second.json["detail"])).toContain(writer);

    const r = await api(ts.url, "POST", "/sandboxes", withVolumes([{ name: "data", path: "/data", read_only: true }]));
    expect(r.status, JSON.stringify(r.json)).toBe(201);
    reader = String(r.json["sandbox_id"]);
    const read = await runCommand(ts.wsUrl, reader, { cmd: "cat /data/note" });
    expect(read.stdout).toBe("kept-across\n");
    const write = await runCommand(ts.wsUrl, reader, { cmd: "echo x > /data/note; echo x > /data/new" });
    expect(write.stderr).toMatch(/Read-only file system/);
    expect((await runCommand(ts.wsUrl, writer, { cmd: "cat /mnt/shared/note; ls /mnt/shared" })).stdout).toBe(
      "kept-across\nlost+found\nnote\n",
    );
  });

  it("refuses to delete a volume a live sandbox mounts, naming them", async () => {
    const del = await api(ts.url, "DELETE", "/volumes/data");
    expect(del.status).toBe(409);
    expect(del.json["code"]).toBe("volume_in_use");
    expect(String(del.json["detail"])).toContain(writer);
    expect(String(del.json["detail"])).toContain(reader);
    expect((await api(ts.url, "GET", "/volumes/data")).status).toBe(200);
  });

  it("answers another tenant's volume as one that does not exist: GET, DELETE, mount at create", async () => {
    const sandboxesBefore = (await api(ts.url, "GET", "/sandboxes")).json["sandboxes"] as unknown[];
    const mount = (name: string): Record<string, unknown> => withVolumes([{ name, path: "/data", read_only: true }]);
    for (const [method, path, body, unknownBody] of [
      ["GET", "/volumes/data", undefined, undefined],
      ["DELETE", "/volumes/data", undefined, undefined],
      ["POST", "/sandboxes", mount("data"), mount("nothing")],
    ] as const) {
      const theirs = await api(ts.url, method, path, body, asB());
      const unknown = await api(ts.url, method, path.replace("data", "nothing"), unknownBody, asB());
      expect(theirs.status, `${method} ${path}`).toBe(404);
      expect(theirs.json["code"]).toBe("volume_not_found");
      // Byte for byte what an unknown name gets: nothing tells that the name exists elsewhere.
      expect(JSON.stringify(theirs.json).replaceAll("data", "NAME")).toBe(
        JSON.stringify(unknown.json).replaceAll("nothing", "NAME"),
      );
    }
    expect((await api(ts.url, "GET", "/volumes", undefined, asB())).json["volumes"]).toEqual([]);
    // Nothing was made by the refused create, and a's volume is untouched.
    expect(((await api(ts.url, "GET", "/sandboxes")).json["sandboxes"] as unknown[]).length).toBe(
      sandboxesBefore.length,
    );
    expect((await api(ts.url, "GET", "/volumes/data")).json["mounted_by"]).toHaveLength(2);
  });

  it("refuses mount paths that would cover the guest's own directories, with a 400 code", async () => {
    const bad = [
      "data",
      "/",
      "/proc/x",
      "/sys",
      "/dev/shm",
      "/run/bothy",
      "/opt/bothy/agent.mjs",
      "/opt",
      "/data/../etc",
      "/data/",
      "//data",
    ];
    for (const path of bad) {
      const res = await api(ts.url, "POST", "/sandboxes", withVolumes([{ name: "data", path, read_only: true }]));
      expect([path, res.status, res.json["code"]]).toEqual([path, 400, "invalid_volume_mount"]);
    }
    const twice = await api(
      ts.url,
      "POST",
      "/sandboxes",
      withVolumes([
        { name: "data", path: "/a", read_only: true },
        { name: "data", path: "/b", read_only: true },
      ]),
    );
    expect([twice.status, twice.json["code"]]).toEqual([400, "invalid_volume_mount"]);
  });

  it("checks volume bodies: names, sizes, a name taken (409)", async () => {
    for (const body of [
      { name: "Bad Name", size_mib: 64 },
      { name: "ok", size_mib: 1 },
      { name: "ok", size_mib: "64" },
      { name: "ok" },
      { name: "ok", size_mib: 64, extra: 1 },
    ]) {
      const res = await api(ts.url, "POST", "/volumes", body);
      expect([res.status, res.json["code"]]).toEqual([400, "invalid_request"]);
    }
    const taken = await api(ts.url, "POST", "/volumes", { name: "data", size_mib: 64 });
    expect([taken.status, taken.json["code"]]).toEqual([409, "volume_exists"]);
  });

  it("refuses a volume past the tenant's storage quota with 429, and makes nothing", async () => {
    const quota = await api(ts.url, "PATCH", "/tenants/b/quota", { max_storage_mib: 100 });
    expect(quota.status, JSON.stringify(quota.json)).toBe(200);
    expect((await api(ts.url, "POST", "/volumes", { name: "first", size_mib: 64 }, asB())).status).toBe(201);
    const dirsBefore = await readdir(join(ts.home, "volumes"));
    const over = await api(ts.url, "POST", "/volumes", { name: "second", size_mib: 64 }, asB());
    expect(over.status).toBe(429);
    expect(over.json["code"]).toBe("quota_exceeded");
    expect(String(over.json["detail"])).toMatch(/max_storage_mib/);
    expect(await readdir(join(ts.home, "volumes"))).toEqual(dirsBefore);
    const list = (await api(ts.url, "GET", "/volumes", undefined, asB())).json["volumes"] as Array<{ name: string }>;
    expect(list.map((v) => v.name)).toEqual(["first"]);
    // b's volume named like a's is b's own.
    expect((await api(ts.url, "POST", "/volumes", { name: "data", size_mib: 16 }, asB())).status).toBe(201);
    for (const name of ["first", "data"])
      expect((await api(ts.url, "DELETE", `/volumes/${name}`, undefined, asB())).status).toBe(200);
  });

  it(
    "is driven by @bothy/sdk's Volume and by the e2b SDK's Volume and volumeMounts",
    { timeout: 120_000 },
    async () => {
      // bothy's SDK.
      const conn = { baseUrl: ts.url };
      expect((await Volume.create("sdk", 16, conn)).size_mib).toBe(16);
      await expect(Volume.create("sdk", 16, conn)).rejects.toBeInstanceOf(ConflictError);
      const sbx = await Sandbox.create({ ...conn, volumes: [{ name: "sdk", path: "/v", readOnly: true }] });
      expect((await Volume.get("sdk", conn)).mounted_by).toEqual([
        { sandbox_id: sbx.sandboxId, path: "/v", read_only: true },
      ]);
      await expect(Volume.delete("sdk", conn)).rejects.toBeInstanceOf(ConflictError);
      await sbx.kill({ wait: true });
      await Volume.delete("sdk", conn);
      await expect(Volume.get("sdk", conn)).rejects.toBeInstanceOf(NotFoundError);

      // The unmodified e2b SDK: its control plane's volume calls and a create's volumeMounts.
      const restore = useE2bEnv(ts.url);
      try {
        const vol = await E2bVolume.create("from-e2b");
        expect((await E2bVolume.list()).map((v) => v.name)).toContain("from-e2b");
        expect((await E2bVolume.getInfo(vol.volumeId)).name).toBe("from-e2b");
        const e2bSbx = await E2bSandbox.create("base", { volumeMounts: { "/vol": vol } });
        const out = await e2bSbx.commands.run("echo via-e2b > /vol/f && cat /vol/f");
        expect(out.stdout).toBe("via-e2b\n");
        await e2bSbx.kill();
        expect(await waitDeleted(ts.url, e2bSbx.sandboxId)).toBe("deleted");
        expect(await E2bVolume.destroy(vol.volumeId)).toBe(true);
        expect(await E2bVolume.destroy(vol.volumeId)).toBe(false);
        // Another tenant's key sees none of it: b's id is a's 404. (E2B's volumes are 1024 MiB,
        // past the quota b got above.)
        expect((await api(ts.url, "PATCH", "/tenants/b/quota", { max_storage_mib: null })).status).toBe(200);
        const bVol = await api(ts.url, "POST", "/e2b/volumes", { name: "b-e2b" }, asB());
        expect(bVol.status).toBe(201);
        const theirs = await api(ts.url, "GET", `/e2b/volumes/${String(bVol.json["volumeID"])}`);
        expect(theirs.status).toBe(404);
        expect(
          (await api(ts.url, "DELETE", `/e2b/volumes/${String(bVol.json["volumeID"])}`, undefined, asB())).status,
        ).toBe(204);
      } finally {
        restore();
      }
    },
  );

  it("leaves no host file or mount once its sandboxes and the volume are deleted", async () => {
    expect(await volumeMounts(ts.home)).toHaveLength(1);
    for (const id of [writer, reader]) expect(await deleteSandbox(ts.url, id)).toBe("deleted");
    expect(await volumeMounts(ts.home)).toEqual([]);
    const del = await api(ts.url, "DELETE", "/volumes/data");
    expect([del.status, del.json]).toEqual([200, { deleted: "data" }]);
    expect(await readdir(join(ts.home, "volumes"))).toEqual([]);
    expect((await api(ts.url, "GET", "/volumes/data")).status).toBe(404);
  });
});

const qemu = testDriver("qemu");

/**
 * Opens `image` read-only in a paused QEMU (no guest code runs) with the drive options a reader VM
 * has, as a second reader would: "opened", or why QEMU refused it. QEMU daemonizes only once its
 * drives are open, so its exit status is the answer; the daemon is ended before this returns.
 */
async function secondQemuReader(image: string): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "bothy-reader-"));
  const pidFile = join(dir, "pid");
  try {
    await promisify(execFile)("qemu-system-x86_64", [
      ...["-M", "pc", "-accel", "tcg", "-nodefaults", "-no-user-config", "-display", "none", "-S"],
      ...["-daemonize", "-pidfile", pidFile],
      ...["-drive", `file=${image},format=raw,if=none,id=d,cache=writeback,readonly=on`],
      ...["-device", "virtio-blk-pci,drive=d"],
    ]);
  } catch (err) {
    return String((err as { stderr?: string }).stderr ?? err);
  }
  try {
    const pid = Number(await readFile(pidFile, "utf8"));
    process.kill(pid, "SIGKILL");
    await pollUntil("the reader QEMU to exit", async () => !existsSync(`/proc/${pid}`), 30_000);
    return "opened";
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** Loop devices the host has on images under `home` (a gVisor mount, or one not yet let go). */
async function loopDevices(home: string): Promise<string> {
  const { stdout } = await promisify(execFile)("losetup", ["-a"]);
  return stdout
    .split("\n")
    .filter((l) => l.includes(join(home, "volumes")))
    .join("\n");
}

describe.skipIf(qemu.missing !== undefined)(
  `volumes on QEMU${qemu.missing ? ` [qemu: skipped, needs ${qemu.missing}]` : ""}`,
  () => {
    let ts: TestServer;
    /** The VM that reads `shared` and writes `scratch`, from the first test on. */
    let vm = "";
    const SCRATCH_MIB = 16;
    const onQemu = (volumes: unknown[]): Record<string, unknown> => ({ ...withVolumes(volumes), driver: "qemu" });
    const sandboxCount = async (): Promise<number> =>
      ((await api(ts.url, "GET", "/sandboxes")).json["sandboxes"] as unknown[]).length;

    useTestServer({ BOTHY_DRIVER: "gvisor" }, (s) => (ts = s));

    beforeAll(async () => {
      for (const [name, size_mib] of [
        ["shared", 32],
        ["scratch", SCRATCH_MIB],
      ] as const)
        expect((await api(ts.url, "POST", "/volumes", { name, size_mib })).status).toBe(201);
    });

    it(
      "reads in a QEMU reader what a gVisor sandbox wrote, once the writer is gone; a second reader opens it beside",
      { timeout: 300_000 },
      async () => {
        const g = await api(ts.url, "POST", "/sandboxes", withVolumes([{ name: "shared", path: "/shared" }]));
        expect(g.status, JSON.stringify(g.json)).toBe(201);
        const gid = String(g.json["sandbox_id"]);
        const wrote = await runCommand(ts.wsUrl, gid, { cmd: "echo from-gvisor > /shared/note && sync && echo ok" });
        expect(wrote.stdout, wrote.stderr).toBe("ok\n");
        expect(await deleteSandbox(ts.url, gid)).toBe("deleted");

        const v = await api(
          ts.url,
          "POST",
          "/sandboxes",
          onQemu([
            { name: "shared", path: "/shared", read_only: true },
            { name: "scratch", path: "/scratch" },
          ]),
        );
        expect(v.status, JSON.stringify(v.json)).toBe(201);
        vm = String(v.json["sandbox_id"]);
        const read = await runCommand(ts.wsUrl, vm, {
          cmd: "cat /shared/note; echo kept > /scratch/f && sync && echo ok",
        });
        expect(read.stdout, read.stderr).toBe("from-gvisor\nok\n");
        // A second QEMU reader opens the image beside the VM: QEMU's image lock lets readers share
        // (a writer's refuses them, the control below). A paused QEMU that runs no guest code takes
        // the same lock a second reader VM's would; its boot under emulation would add nothing.
        // Which readers the server lets in together is volume-share.unit.test.ts's.
        const imageOf = async (name: string): Promise<string> =>
          join(
            ts.home,
            "volumes",
            String((await api(ts.url, "GET", `/volumes/${name}`)).json["volume_id"]),
            "volume.ext4",
          );
        expect(await secondQemuReader(await imageOf("shared"))).toBe("opened");
        expect(await secondQemuReader(await imageOf("scratch"))).toMatch(/Failed to get shared "write" lock/);
        // A VM opens the image itself: the host has it neither mounted nor on a loop device.
        expect(await volumeMounts(ts.home)).toEqual([]);
        expect(await loopDevices(ts.home)).toBe("");
      },
    );

    it("gives the reader EROFS even as root at the device, and the writer ENOSPC at the volume's size", async () => {
      // The guest is root in its VM: it may try to remount or write the reader's disk directly.
      const write = await runCommand(ts.wsUrl, vm, {
        cmd: [
          "echo x > /shared/note; echo x > /shared/new",
          "mount -o remount,rw /shared && echo remounted",
          "dev=$(awk '$2 == \"/shared\" {print $1}' /proc/mounts); dd if=/dev/zero of=$dev bs=4096 count=1 conv=fsync 2>&1",
          "cat /shared/note",
        ].join("; "),
      });
      expect(write.stderr).toMatch(/Read-only file system/);
      expect(write.stdout).not.toMatch(/remounted/);
      expect(write.stdout).toMatch(/Operation not permitted|Read-only file system/);
      expect(write.stdout).toMatch(/from-gvisor\n$/);

      const fill = await runCommand(ts.wsUrl, vm, {
        cmd: `dd if=/dev/zero of=/scratch/fill bs=1M count=${SCRATCH_MIB * 4} conv=fsync; echo "exit=$?"`,
      });
      expect(fill.stderr).toMatch(/No space left on device/);
      expect(fill.stdout).toMatch(/exit=1/);
      // The host gives it at most its size: the image (the VM's disk itself) never grows past it.
      const scratchId = String((await api(ts.url, "GET", "/volumes/scratch")).json["volume_id"]);
      const image = await stat(join(ts.home, "volumes", scratchId, "volume.ext4"));
      expect(image.size).toBe(SCRATCH_MIB * MIB);
      expect(image.blocks * 512).toBeLessThanOrEqual(SCRATCH_MIB * MIB);
      expect((await runCommand(ts.wsUrl, vm, { cmd: "rm /scratch/fill && echo freed" })).stdout).toBe("freed\n");
    });

    it("refuses every combination that would share an image unsafely, with 409 volume_share_unsafe", async () => {
      const before = await sandboxCount();
      for (const [label, body] of [
        // The host's mount of an image a VM has as its disk.
        [
          "gVisor reader of the VM's read-write volume",
          withVolumes([{ name: "scratch", path: "/s", read_only: true }]),
        ],
        ["gVisor reader of the VM's read-only volume", withVolumes([{ name: "shared", path: "/s", read_only: true }])],
        ["QEMU writer beside a QEMU reader", onQemu([{ name: "shared", path: "/s" }])],
        ["QEMU reader beside a QEMU writer", onQemu([{ name: "scratch", path: "/s", read_only: true }])],
      ] as const) {
        const res = await api(ts.url, "POST", "/sandboxes", body);
        expect([label, res.status, res.json["code"]]).toEqual([label, 409, "volume_share_unsafe"]);
        expect(res.type).toMatch(/problem\+json/);
        expect(String(res.json["detail"])).toContain(vm);
      }
      expect(await sandboxCount()).toBe(before);
    });

    it("keeps its volumes mounted across a pause and a resume", { timeout: 300_000 }, async () => {
      expect((await api(ts.url, "POST", `/sandboxes/${vm}/pause`)).status).toBe(200);
      expect(await waitForState(ts.url, vm, "paused", 60)).toBe("paused");
      const after = await runCommand(ts.wsUrl, vm, {
        cmd: "cat /shared/note /scratch/f; echo again >> /scratch/f && sync && cat /scratch/f",
      });
      expect(after.stdout, after.stderr).toBe("from-gvisor\nkept\nkept\nagain\n");
    });

    it("never lets the host's kernel mount a volume a VM had read-write, even after the VM is gone", async () => {
      expect(await deleteSandbox(ts.url, vm)).toBe("deleted");
      // Its guest could have written any bytes to that disk: a crafted ext4 for the host to parse.
      const g = await api(
        ts.url,
        "POST",
        "/sandboxes",
        withVolumes([{ name: "scratch", path: "/s", read_only: true }]),
      );
      expect([g.status, g.json["code"]]).toEqual([409, "volume_share_unsafe"]);
      expect(String(g.json["detail"])).toMatch(/QEMU sandboxes only/);
      // The volume it only read is the host's again.
      const ok = await api(
        ts.url,
        "POST",
        "/sandboxes",
        withVolumes([{ name: "shared", path: "/s", read_only: true }]),
      );
      expect(ok.status, JSON.stringify(ok.json)).toBe(201);
      expect((await runCommand(ts.wsUrl, String(ok.json["sandbox_id"]), { cmd: "cat /s/note" })).stdout).toBe(
        "from-gvisor\n",
      );
      expect(await deleteSandbox(ts.url, String(ok.json["sandbox_id"]))).toBe("deleted");
    });

    it("leaves no host file, mount or loop device once the sandboxes and volumes are deleted", async () => {
      for (const name of ["shared", "scratch"])
        expect((await api(ts.url, "DELETE", `/volumes/${name}`)).status).toBe(200);
      expect(await readdir(join(ts.home, "volumes"))).toEqual([]);
      expect(await volumeMounts(ts.home)).toEqual([]);
      expect(await loopDevices(ts.home)).toBe("");
    });
  },
);

describe("volumes across a server crash and a clean restart (gVisor)", () => {
  let home = "";
  let serve: ServeProcess | undefined;

  afterAll(async () => {
    await serve?.stop();
    if (home) await rm(home, { recursive: true, force: true });
  });

  const start = (): Promise<string> => {
    serve = spawnTestServe(home, { BOTHY_DRIVER: "gvisor" });
    return serve.url;
  };

  it(
    "keeps a mounted volume working after kill -9 and after a clean restart, and leaves nothing behind",
    { timeout: 180_000 },
    async () => {
      home = await mkdtemp("/tmp/bothy-test-volumes-");
      let base = await start();
      const ws = (): string => base.replace(/^http/, "ws");
      expect((await api(base, "POST", "/volumes", { name: "keep", size_mib: 32 })).status).toBe(201);
      const made = await api(base, "POST", "/sandboxes", withVolumes([{ name: "keep", path: "/keep" }]));
      expect(made.status, JSON.stringify(made.json)).toBe(201);
      const id = String(made.json["sandbox_id"]);
      expect((await runCommand(ws(), id, { cmd: "echo one > /keep/f && sync && echo ok" })).stdout).toBe("ok\n");

      // A crash: the sandbox outlives the server, which takes it over with its volume's mount.
      await serve?.kill();
      base = await start();
      expect((await runCommand(ws(), id, { cmd: "cat /keep/f; echo two >> /keep/f && echo ok" })).stdout).toBe(
        "one\nok\n",
      );
      expect(await volumeMounts(home)).toHaveLength(1);

      // A clean stop ends the sandbox (its disk kept) and unmounts the volume; the next call boots
      // it again on its disk, with its volume mounted again.
      await serve?.stop();
      expect(await volumeMounts(home)).toEqual([]);
      base = await start();
      expect((await runCommand(ws(), id, { cmd: "cat /keep/f" })).stdout).toBe("one\ntwo\n");

      expect(await deleteSandbox(base, id)).toBe("deleted");
      expect((await api(base, "DELETE", "/volumes/keep")).status).toBe(200);
      await serve?.stop();
      serve = undefined;
      expect(await hostLeaks(home)).toEqual(noLeaks());
      expect(await readdir(join(home, "volumes"))).toEqual([]);
    },
  );
});
