/**
 * The host side of volumes on gVisor: each volume's image is loop-mounted once on the host, at
 * `<volumes>/<id>/mnt`, while any sandbox uses it, and runsc binds that directory into each
 * sandbox (read-only for readers). One kernel mount per image whatever the number of sandboxes:
 * two mounts of one ext4 image would be two file systems writing the same blocks.
 *
 * Who holds a mount is kept in memory, by sandbox id (releasing twice is harmless). A server that
 * restarts finds the mounts of the sandboxes it takes over still in place and adds them as holders
 * again; `prune` unmounts every mount nobody holds (start-up, after recovery, and each sweep).
 */
import { existsSync } from "node:fs";
import { mkdir, readFile } from "node:fs/promises";
import { BothyError } from "@bothy/protocol";
import { join } from "node:path";
import { describeCauses } from "../errors/internal-errors.ts";
import type { Logger } from "../events/server-events.ts";
import { run } from "../util/host-command.ts";

const MOUNT_TIMEOUT_MS = 30_000;
export const VOLUME_IMAGE = "volume.ext4";
export const VOLUME_MOUNT = "mnt";
/**
 * Beside a volume's image once a VM has had it read-write: the guest, root on its own disk, may
 * have written any bytes, so the host's kernel never mounts that image again (gVisor is refused).
 */
export const VM_WRITTEN = "vm-written";

export class VolumeMounts {
  private readonly holders = new Map<string, Set<string>>();
  /** Per volume, the mount or unmount in progress: one at a time. */
  private readonly chains = new Map<string, Promise<unknown>>();

  constructor(
    /** `$BOTHY_HOME/volumes` */
    readonly dir: string,
    private readonly log: Logger,
  ) {}

  mountDir(volumeId: string): string {
    return join(this.dir, volumeId, VOLUME_MOUNT);
  }

  imagePath(volumeId: string): string {
    return join(this.dir, volumeId, VOLUME_IMAGE);
  }

  vmWrittenPath(volumeId: string): string {
    return join(this.dir, volumeId, VM_WRITTEN);
  }

  private serial<T>(volumeId: string, work: () => Promise<T>): Promise<T> {
    const next = (this.chains.get(volumeId) ?? Promise.resolve()).then(work, work);
    const tail = next.catch(() => undefined);
    this.chains.set(volumeId, tail);
    void tail.then(() => {
      if (this.chains.get(volumeId) === tail) this.chains.delete(volumeId);
    });
    return next;
  }

  /** Mounts each volume on the host if it is not yet, with `sandboxId` as a holder; on failure it holds none of them. */
  async acquire(sandboxId: string, volumeIds: readonly string[]): Promise<void> {
    try {
      for (const id of volumeIds) {
        await this.serial(id, async () => {
          if (!(await this.isMounted(id))) {
            if (existsSync(this.vmWrittenPath(id)))
              throw new BothyError(
                "volume_share_unsafe",
                `Volume ${id} was written by a VM; this host's kernel does not mount it (use it from QEMU sandboxes).`,
              );
            const target = this.mountDir(id);
            await mkdir(target, { recursive: true, mode: 0o700 });
            await run("mount", ["-o", "loop,nosuid,nodev,noinit_itable", this.imagePath(id), target], {
              timeoutMs: MOUNT_TIMEOUT_MS,
            });
          }
          const set = this.holders.get(id) ?? new Set<string>();
          set.add(sandboxId);
          this.holders.set(id, set);
        });
      }
    } catch (err) {
      await this.release(sandboxId);
      throw err;
    }
  }

  /**
   * Before a VM opens these volumes' images as its disks: unmounts a host mount nobody holds (one
   * a sweep has not reached yet), and refuses a volume a sandbox still holds or whose image a
   * loop device still has (a lazy unmount not yet finished): two file systems on one image would
   * corrupt it. The claims (volume-service.ts) already keep a VM off a volume another driver uses.
   */
  async unmountForVm(volumeIds: readonly string[]): Promise<void> {
    for (const id of volumeIds) {
      await this.serial(id, async () => {
        const holders = [...(this.holders.get(id) ?? [])];
        if (holders.length > 0)
          throw new BothyError(
            "volume_share_unsafe",
            `Volume ${id} is still mounted on the host for ${holders.join(", ")}; try again once that sandbox has ended.`,
          );
        await this.unmountIfUnheld(id);
        const loops = (await run("losetup", ["-j", this.imagePath(id)], { timeoutMs: MOUNT_TIMEOUT_MS })).stdout.trim();
        if (loops !== "")
          throw new BothyError(
            "volume_share_unsafe",
            `Volume ${id} is still attached to a loop device on the host (an unmount finishing); try again in a moment.`,
          );
      });
    }
  }

  /** Drops `sandboxId` as a holder of every volume; a mount nobody holds any more is unmounted. */
  async release(sandboxId: string): Promise<void> {
    const errors: unknown[] = [];
    for (const [id, set] of [...this.holders]) {
      if (!set.has(sandboxId)) continue;
      set.delete(sandboxId);
      await this.serial(id, () => this.unmountIfUnheld(id)).catch((err: unknown) => errors.push(err));
    }
    if (errors.length > 0) throw new AggregateError(errors, `Unmounting the volumes of ${sandboxId} failed.`);
  }

  /** Drops one holder of one volume (a sandbox that ended without releasing). */
  async releaseOne(sandboxId: string, volumeId: string): Promise<void> {
    const set = this.holders.get(volumeId);
    if (!set?.delete(sandboxId)) return;
    await this.serial(volumeId, () => this.unmountIfUnheld(volumeId));
  }

  /** Volume ids mounted now and the sandboxes holding each. */
  held(): ReadonlyMap<string, ReadonlySet<string>> {
    return this.holders;
  }

  /** Unmounts every volume mount under `dir` that no sandbox holds (a restart's or a crash's leftovers). */
  async prune(): Promise<void> {
    for (const id of await this.mountedIds()) {
      await this.serial(id, () => this.unmountIfUnheld(id)).catch((err: unknown) =>
        this.log("volume_unmount_failed", { volume_id: id, error: describeCauses(err) }),
      );
    }
  }

  /** Unmounts the volume whatever holds it (its row is gone). */
  async forceUnmount(volumeId: string): Promise<void> {
    this.holders.delete(volumeId);
    await this.serial(volumeId, () => this.unmountIfUnheld(volumeId));
  }

  private async unmountIfUnheld(id: string): Promise<void> {
    if ((this.holders.get(id)?.size ?? 0) > 0) return;
    this.holders.delete(id);
    if (!(await this.isMounted(id))) return;
    const target = this.mountDir(id);
    await run("umount", [target], { timeoutMs: MOUNT_TIMEOUT_MS }).catch(async (err: unknown) => {
      // A sandbox's process may hold it a moment longer; detach now, the kernel frees it after.
      this.log("umount_lazy", { dir: join(this.dir, id), target, error: describeCauses(err) });
      await run("umount", ["-l", target], { timeoutMs: MOUNT_TIMEOUT_MS });
    });
  }

  async isMounted(volumeId: string): Promise<boolean> {
    return (await this.mountedIds()).includes(volumeId);
  }

  /** Volume ids with a mount at their `mnt` now (the host's mount table). */
  async mountedIds(): Promise<string[]> {
    const text = await readFile("/proc/self/mounts", "utf8");
    const prefix = this.dir.replace(/\/$/, "") + "/";
    const out: string[] = [];
    for (const line of text.split("\n")) {
      const target = line.split(" ")[1];
      if (!target?.startsWith(prefix) || !target.endsWith(`/${VOLUME_MOUNT}`)) continue;
      const id = target.slice(prefix.length, -VOLUME_MOUNT.length - 1);
      if (/^vol_[a-z2-7]{20}$/.test(id)) out.push(id);
    }
    return out;
  }
}
