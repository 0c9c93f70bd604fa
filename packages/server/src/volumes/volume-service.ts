/**
 * Volumes: ext4 images of a fixed size that outlive sandboxes, one tenant's each. A volume's row
 * and its files are made in one step (the image is whole before the row exists, and a failed
 * insert removes it), so a crash leaves at most a directory no row names, which `removeOrphans`
 * (start-up and every sweep) deletes. A full volume gives the guest ENOSPC: the image never
 * grows past its size, so the host's disk gives at most `size_mib` to each.
 */
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
import type { Ledger } from "../ledger/ledger.ts";
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
/** Drivers that can mount volumes (QEMU's virtio-blk path is not built yet). */
export const VOLUME_DRIVERS: readonly string[] = ["gvisor"];

export class VolumeService {
  /** Creates in flight: their directories exist before their rows, so the orphan sweep skips them. */
  private readonly making = new Map<string, { tenant: string; name: string; mib: number }>();

  constructor(
    private readonly ledger: Ledger,
    private readonly quotas: Quotas,
    readonly mounts: VolumeMounts,
    private readonly log: Logger,
  ) {}

  async create(tenant: string, body: unknown): Promise<VolumeInfo> {
    const req = parseInput(createVolumeRequest, body, "POST /volumes");
    const inFlight = [...this.making.values()].filter((m) => m.tenant === tenant);
    if (this.ledger.volumes.byName(tenant, req.name) || inFlight.some((m) => m.name === req.name))
      throw new BothyError(
        "volume_exists",
        `Volume ${req.name} already exists; pick another name or delete it first (DELETE /volumes/${req.name}).`,
      );
    const used =
      this.ledger.volumes.totalMib(tenant) +
      Math.ceil(this.ledger.snapshots.totalBytes(tenant) / (1024 * 1024)) +
      inFlight.reduce((n, m) => n + m.mib, 0);
    this.quotas.admitStorage(tenant, used, req.size_mib);
    const id = newVolumeId();
    this.making.set(id, { tenant, name: req.name, mib: req.size_mib });
    const dir = this.dirOf(id);
    try {
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
      this.ledger.volumes.insert(row);
      this.log("volume_created", { volume_id: id, tenant, name: req.name, size_mib: req.size_mib });
      return this.view(row);
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

  list(tenant: string): VolumeInfo[] {
    return this.ledger.volumes.list(tenant).map((r) => this.view(r));
  }

  info(tenant: string, name: string): VolumeInfo {
    return this.view(this.find(tenant, name));
  }

  /** Deletes a volume no live sandbox mounts, and its files. */
  async delete(tenant: string, name: string): Promise<{ deleted: string }> {
    const row = this.find(tenant, name);
    const live = this.ledger.volumes.remove(row.id);
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
   * mounts them now: one writer at a time, any number of readers. Synchronous, so a create's check
   * and its claim (`commitClaims`, in the same turn) cannot interleave with another create's.
   */
  claimsFor(tenant: string, sandboxId: string, driver: string, mounts: readonly VolumeMount[]): VolumeClaim[] {
    if (mounts.length === 0) return [];
    if (!VOLUME_DRIVERS.includes(driver))
      throw new BothyError(
        "not_supported",
        `The ${driver} driver cannot mount volumes yet; create the sandbox with driver "gvisor" or without volumes.`,
      );
    checkMounts(mounts);
    return mounts.map((m) => {
      const row = this.find(tenant, m.name);
      const readOnly = m.read_only === true;
      const writer = this.ledger.volumes.liveClaims(row.id).find((c) => c.read_only === 0);
      if (!readOnly && writer)
        throw new BothyError(
          "volume_in_use",
          `Volume ${m.name} is mounted read-write by ${writer.sandbox_id}; mount it with "read_only": true, or delete that sandbox first.`,
          { details: { sandboxes: [writer.sandbox_id] } },
        );
      return { sandbox_id: sandboxId, volume_id: row.id, path: m.path, read_only: readOnly ? 1 : 0 };
    });
  }

  commitClaims(claims: readonly VolumeClaim[]): void {
    if (claims.length > 0) this.ledger.volumes.addClaims(claims);
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
        if (!working.has(sandboxId) && !HOLDING_STATES.includes(this.ledger.getSandbox(sandboxId)?.state ?? "deleted"))
          await this.mounts
            .releaseOne(sandboxId, volumeId)
            .catch((err: unknown) =>
              this.log("volume_unmount_failed", { volume_id: volumeId, error: describeCauses(err) }),
            );
    await this.mounts.prune();
    const entries = await readdir(this.mounts.dir).catch(() => [] as string[]);
    for (const id of entries) {
      // Checked together, in one turn: a create's directory has either its row or its entry in `making`.
      if (!VOLUME_ID_RE.test(id) || this.ledger.volumes.byId(id) || this.making.has(id)) continue;
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
  private find(tenant: string, name: string): VolumeRow {
    const row = VOLUME_NAME_RE.test(name) ? this.ledger.volumes.byName(tenant, name) : undefined;
    if (!row)
      throw new BothyError("volume_not_found", `No volume ${name.slice(0, 64)}; GET /volumes lists this tenant's.`);
    return row;
  }

  private view(row: VolumeRow): VolumeInfo {
    return {
      volume_id: row.id,
      name: row.name,
      size_mib: row.size_mib,
      created_at: row.created_at,
      mounted_by: this.ledger.volumes
        .liveClaims(row.id)
        .map((c) => ({ sandbox_id: c.sandbox_id, path: c.path, read_only: c.read_only === 1 })),
    };
  }
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
