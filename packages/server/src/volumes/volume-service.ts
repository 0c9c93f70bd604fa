/**
 * Volumes: ext4 images of a fixed size that outlive sandboxes, one tenant's each. A volume's row
 * and its files are made in one step (the image is whole before the row exists, and a failed
 * insert removes it), so a crash leaves at most a directory no row names, which `removeOrphans`
 * (start-up and every sweep) deletes. A full volume gives the guest ENOSPC: the image never
 * grows past its size, so the host's disk gives at most `size_mib` to each.
 */
import { existsSync, writeFileSync } from "node:fs";
import { chmod, mkdir, readdir, rm } from "node:fs/promises";
import {
  BothyError,
  createVolumeRequest,
  VOLUME_NAME_RE,
  type VolumeInfo,
  type VolumeMount,
  type SandboxState,
} from "@bothy/protocol";
import type { Quotas } from "../auth/quotas.ts";
import { describeCauses } from "../errors/internal-errors.ts";
import type { Logger } from "../events/server-events.ts";
import type { LedgerStore } from "../ledger/store.ts";
import type { VolumeClaim, VolumeRow } from "../ledger/volume-rows.ts";
import { run } from "../util/host-command.ts";
import { newVolumeId } from "../util/ids.ts";
import { parseInput } from "../api/parse-input.ts";
import { checkMounts } from "./mount-path.ts";
import type { VolumeMounts } from "./volume-mounts.ts";

const MKFS_TIMEOUT_MS = 120_000;
/** The states in which a sandbox may hold a volume's host mount: its container may run. */
const HOLDING_STATES: readonly SandboxState[] = ["creating", "running", "deleting"];
const VOLUME_ID_RE = /^vol_[a-z2-7]{20}$/;
/** Drivers that can mount volumes: gVisor through the host's mount, QEMU as a virtio disk. */
export const VOLUME_DRIVERS: readonly string[] = ["gvisor", "qemu"];

export class VolumeService {
  /** Creates in flight: their directories exist before their rows, so the orphan sweep skips them. */
  private readonly making = new Map<string, { tenant: string; name: string; mib: number }>();

  constructor(
    private readonly ledger: LedgerStore,
    private readonly quotas: Quotas,
    readonly mounts: VolumeMounts,
    private readonly log: Logger,
  ) {}

  async create(tenant: string, body: unknown): Promise<VolumeInfo> {
    const req = parseInput(createVolumeRequest, body, "POST /volumes");
    const inFlight = [...this.making.values()].filter((m) => m.tenant === tenant);
    const exists = (): BothyError =>
      new BothyError(
        "volume_exists",
        `Volume ${req.name} already exists; pick another name or delete it first (DELETE /volumes/${req.name}).`,
      );
    if (inFlight.some((m) => m.name === req.name)) throw exists();
    // Noted as in flight before the ledger is read: a second create of the name, or its quota, counts it.
    const id = newVolumeId();
    this.making.set(id, { tenant, name: req.name, mib: req.size_mib });
    const dir = this.dirOf(id);
    try {
      if (await this.ledger.volumes.byName(tenant, req.name)) throw exists();
      const used =
        (await this.ledger.volumes.totalMib(tenant)) +
        Math.ceil((await this.ledger.snapshots.totalBytes(tenant)) / (1024 * 1024)) +
        inFlight.reduce((n, m) => n + m.mib, 0);
      await this.quotas.admitStorage(tenant, used, req.size_mib);
      await mkdir(dir, { mode: 0o700 });
      const image = this.mounts.imagePath(id);
      await makeImage(image, req.size_mib);
      const row: VolumeRow = {
        id,
        tenant,
        name: req.name,
        size_mib: req.size_mib,
        created_at: new Date().toISOString(),
      };
      await this.ledger.volumes.insert(row);
      this.log("volume_created", { volume_id: id, tenant, name: req.name, size_mib: req.size_mib });
      return await this.view(row);
    } catch (err) {
      await rm(dir, { recursive: true, force: true });
      if (err instanceof BothyError) throw err;
      throw new BothyError("internal", "The volume's file system could not be made on this host; nothing was kept.", {
        cause: err,
      });
    } finally {
      this.making.delete(id);
    }
  }

  async list(tenant: string): Promise<VolumeInfo[]> {
    return Promise.all((await this.ledger.volumes.list(tenant)).map((r) => this.view(r)));
  }

  async info(tenant: string, name: string): Promise<VolumeInfo> {
    return this.view(await this.find(tenant, name));
  }

  /** Deletes a volume no live sandbox mounts, and its files. */
  async delete(tenant: string, name: string): Promise<{ deleted: string }> {
    const row = await this.find(tenant, name);
    const live = await this.ledger.volumes.remove(row.id);
    if (live.length > 0)
      throw new BothyError(
        "volume_in_use",
        `Volume ${name} is mounted by ${live.map((c) => c.sandbox_id).join(", ")}; delete those sandboxes first.`,
        { details: { sandboxes: live.map((c) => c.sandbox_id) } },
      );
    this.log("volume_deleted", { volume_id: row.id, tenant, name });
    // The row is gone: what is left on the host is an orphan the sweep removes if this fails.
    await this.removeFiles(row.id).catch((err: unknown) =>
      this.log("volume_orphan_remove_failed", { volume_id: row.id, error: describeCauses(err) }),
    );
    return { deleted: name };
  }

  /**
   * A create's mounts as claims of sandbox `sandboxId`, checked against the tenant's volumes and who
   * mounts them now (`shareRefusal`). Synchronous, so a create's check and its claim
   * (`commitClaims`, in the same turn) cannot interleave with another create's.
   */
  async claimsFor(
    tenant: string,
    sandboxId: string,
    driver: string,
    mounts: readonly VolumeMount[],
  ): Promise<VolumeClaim[]> {
    if (mounts.length === 0) return [];
    if (!VOLUME_DRIVERS.includes(driver))
      throw new BothyError(
        "not_supported",
        `The ${driver} driver cannot mount volumes; create the sandbox with driver "gvisor" or "qemu", or without volumes.`,
      );
    checkMounts(mounts);
    const claims: VolumeClaim[] = [];
    for (const m of mounts) {
      const row = await this.find(tenant, m.name);
      const readOnly = m.read_only === true;
      const live = await Promise.all(
        (await this.ledger.volumes.liveClaims(row.id)).map(async (c) => ({
          ...c,
          driver: (await this.ledger.getSandbox(c.sandbox_id))?.driver ?? "unknown",
        })),
      );
      const refusal = shareRefusal(m.name, driver, readOnly, live, existsSync(this.mounts.vmWrittenPath(row.id)));
      if (refusal) throw refusal;
      claims.push({ sandbox_id: sandboxId, volume_id: row.id, path: m.path, read_only: readOnly ? 1 : 0 });
    }
    return claims;
  }

  /**
   * Records the claims; a VM's read-write claim first marks the volume as VM-written (the host's
   * kernel never mounts it after: `VM_WRITTEN`), before the VM can have written a byte.
   */
  async commitClaims(claims: readonly VolumeClaim[]): Promise<void> {
    if (claims.length === 0) return;
    for (const c of claims)
      if (c.read_only === 0 && (await this.ledger.getSandbox(c.sandbox_id))?.driver === "qemu")
        writeFileSync(this.mounts.vmWrittenPath(c.volume_id), `${c.sandbox_id}\n`, { mode: 0o600 });
    await this.ledger.volumes.addClaims(claims);
  }

  /**
   * Removes volume directories no row names (a create cut short by a crash, a delete whose file
   * removal failed) and unmounts mounts no sandbox holds. Creates in flight are skipped. `owned`:
   * the sandboxes the manager holds or works on now.
   */
  async removeOrphans(by: string, owned: () => ReadonlySet<string>): Promise<void> {
    // A holder whose sandbox no longer runs (it died without its handle saying so) holds nothing.
    // One the manager is working on (a wake of a stopped sandbox mounts before its row says
    // running) keeps its hold.
    const working = owned();
    for (const [volumeId, holders] of this.mounts.held())
      for (const sandboxId of holders)
        if (
          !working.has(sandboxId) &&
          !HOLDING_STATES.includes((await this.ledger.getSandbox(sandboxId))?.state ?? "deleted")
        )
          await this.mounts
            .releaseOne(sandboxId, volumeId)
            .catch((err: unknown) =>
              this.log("volume_unmount_failed", { volume_id: volumeId, error: describeCauses(err) }),
            );
    await this.mounts.prune();
    const entries = await readdir(this.mounts.dir).catch(() => [] as string[]);
    for (const id of entries) {
      // `making` first: a create's entry there goes only once its row is in the ledger.
      if (!VOLUME_ID_RE.test(id) || this.making.has(id) || (await this.ledger.volumes.byId(id))) continue;
      try {
        await this.removeFiles(id);
        this.log("volume_orphan_removed", { volume_id: id, description: this.dirOf(id), by });
      } catch (err) {
        this.log("volume_orphan_remove_failed", { volume_id: id, error: describeCauses(err) });
      }
    }
  }

  private async removeFiles(id: string): Promise<void> {
    await this.mounts.forceUnmount(id);
    await rm(this.dirOf(id), { recursive: true, force: true });
  }

  private dirOf(id: string): string {
    return `${this.mounts.dir}/${id}`;
  }

  /** The tenant's volume by name; another tenant's is as absent as one that never existed. */
  private async find(tenant: string, name: string): Promise<VolumeRow> {
    const row = VOLUME_NAME_RE.test(name) ? await this.ledger.volumes.byName(tenant, name) : undefined;
    if (!row)
      throw new BothyError("volume_not_found", `No volume ${name.slice(0, 64)}; GET /volumes lists this tenant's.`);
    return row;
  }

  private async view(row: VolumeRow): Promise<VolumeInfo> {
    return {
      volume_id: row.id,
      name: row.name,
      size_mib: row.size_mib,
      created_at: row.created_at,
      mounted_by: (await this.ledger.volumes.liveClaims(row.id)).map((c) => ({
        sandbox_id: c.sandbox_id,
        path: c.path,
        read_only: c.read_only === 1,
      })),
    };
  }
}

/**
 * Why a `driver` sandbox may not mount volume `name` (read-only or not) beside its `live` claims,
 * or undefined when it may. gVisor sandboxes share one host mount, so one writer and any readers
 * are safe among them. A VM's disk is the image itself, cached by the guest's own ext4, which is
 * not a cluster file system: a VM reader beside any writer, or beside the host's mount, would read
 * blocks changing under its cache, and a VM writer must be alone. VM readers together are safe.
 * And an image a VM had read-write (`vmWritten`) is never mounted by the host's kernel again.
 */
export function shareRefusal(
  name: string,
  driver: string,
  readOnly: boolean,
  live: ReadonlyArray<VolumeClaim & { driver: string }>,
  vmWritten: boolean,
): BothyError | undefined {
  const ids = (claims: ReadonlyArray<VolumeClaim>): string[] => claims.map((c) => c.sandbox_id);
  const unsafe = (claims: ReadonlyArray<VolumeClaim>, why: string): BothyError =>
    new BothyError("volume_share_unsafe", `Volume ${name} ${why}`, { details: { sandboxes: ids(claims) } });
  const writer = live.find((c) => c.read_only === 0);
  if (driver !== "qemu") {
    const vms = live.filter((c) => c.driver === "qemu");
    if (vms.length > 0)
      return unsafe(
        vms,
        `is a disk of the QEMU sandboxes ${ids(vms).join(", ")}; delete them first, or mount it from QEMU read-only beside other QEMU readers.`,
      );
    if (vmWritten)
      return unsafe(
        [],
        "was mounted read-write by a QEMU sandbox, so this host's kernel does not mount its file system; mount it in QEMU sandboxes only.",
      );
  }
  if (!readOnly && writer)
    return new BothyError(
      "volume_in_use",
      `Volume ${name} is mounted read-write by ${writer.sandbox_id}; mount it with "read_only": true, or delete that sandbox first.`,
      { details: { sandboxes: [writer.sandbox_id] } },
    );
  if (driver !== "qemu") return undefined;
  if (!readOnly && live.length > 0)
    return unsafe(
      live,
      `is mounted by ${ids(live).join(", ")}; a QEMU sandbox mounts a volume read-write only when no other sandbox has it (ext4 is not a cluster file system). Mount it read-only, or delete those sandboxes first.`,
    );
  if (writer)
    return unsafe(
      [writer],
      `is mounted read-write by ${writer.sandbox_id}; a QEMU reader would see its disk change under its own cache. Delete the writer first.`,
    );
  const hosted = live.filter((c) => c.driver !== "qemu");
  if (hosted.length > 0)
    return unsafe(
      hosted,
      `is mounted on this host for the gVisor sandboxes ${ids(hosted).join(", ")}; a QEMU reader needs the image unmounted. Delete them first.`,
    );
  return undefined;
}

/**
 * A sparse file of `mib` with an empty ext4 file system, laid out as images/ext4-image.ts lays out
 * templates' (4 KiB blocks, lazy inode tables and journal, so only metadata is written), with no
 * blocks reserved for root: the guest's root may fill it all.
 */
async function makeImage(image: string, mib: number): Promise<void> {
  await run("truncate", ["-s", `${mib}M`, image], { timeoutMs: 10_000 });
  await run(
    "mkfs.ext4",
    ["-q", "-F", "-L", "bothy-volume", "-m", "0", "-b", "4096", "-E", "lazy_itable_init=1,lazy_journal_init=1", image],
    { timeoutMs: MKFS_TIMEOUT_MS },
  );
  await chmod(image, 0o600);
}
