/** Snapshots: request and answer bodies of /snapshots, `POST /sandboxes/{id}/snapshots` and `/fork`. */
import { z } from "zod";
import { sandboxInfo, sandboxMetadata } from "./api.ts";

/** A snapshot's id: `snap_` and 20 base32 letters. */
export const SNAPSHOT_ID_RE = /^snap_[a-z2-7]{20}$/;
/** A snapshot's optional name, unique in its tenant: lower-case letters, digits, '-' and '_', at most 63. */
export const SNAPSHOT_NAME_RE = /^[a-z0-9][a-z0-9_-]{0,62}$/;
/** At most this many children in one fork. */
export const MAX_FORK_COUNT = 20;

/** `POST /sandboxes/{id}/snapshots`. */
export const createSnapshotRequest = z.strictObject({
  name: z
    .string()
    .regex(SNAPSHOT_NAME_RE, "a snapshot name: lower-case letters, digits, '-' and '_', at most 63")
    .optional(),
  /**
   * Keep memory and processes too, where the driver can (QEMU: its children resume with the running
   * processes; gVisor with this runsc cannot: 501).
   */
  memory: z.boolean().optional(),
  /**
   * Boot this many sandboxes from the snapshot in the background, of the source sandbox's size and
   * the default network posture, so that as many creates from it (`POST /sandboxes {snapshot}`)
   * take one each instead of booting; they are given up when the snapshot is deleted or after 10
   * minutes without a create.
   */
  warm: z.number().int().min(0).max(MAX_FORK_COUNT).optional(),
});
export type CreateSnapshotRequest = z.infer<typeof createSnapshotRequest>;

export const snapshotInfo = z.object({
  snapshot_id: z.string(),
  name: z.string().nullable(),
  /** The sandbox it was taken of (which may be deleted since). */
  source_sandbox_id: z.string(),
  template: z.string(),
  driver: z.string(),
  /** Bytes it stores: what the sandbox wrote over its template (or over the snapshot it started from). */
  bytes: z.number().int(),
  created_at: z.string(),
  /**
   * Whether it kept memory and processes (`memory: true` on a driver that can: QEMU), so that
   * sandboxes started from it resume them; false: files only, and its sandboxes boot.
   */
  memory: z.boolean(),
  /** Live sandboxes started from it (asleep ones included): while there are any it cannot be deleted. */
  used_by: z.array(z.string()),
  /** Sandboxes booted from it ahead of creates (`warm`), ready to be taken. */
  warm_ready: z.number().int(),
});
export type SnapshotInfo = z.infer<typeof snapshotInfo>;
export const snapshotList = z.object({ snapshots: z.array(snapshotInfo) });

/** `POST /sandboxes/{id}/fork`: a snapshot of the sandbox and `count` sandboxes started from it. */
export const forkRequest = z.strictObject({
  count: z.number().int().min(1).max(MAX_FORK_COUNT),
  /** The snapshot's name (optional, as for a snapshot). */
  name: createSnapshotRequest.shape.name,
  /** The snapshot keeps memory and processes, and each child resumes from them (as for a snapshot). */
  memory: createSnapshotRequest.shape.memory,
  /** Each child's timeout; omitted: BOTHY_DEFAULT_TIMEOUT_S. */
  timeout_s: z.number().int().optional(),
  /** Labels every child gets. */
  metadata: sandboxMetadata.optional(),
});
export type ForkRequest = z.infer<typeof forkRequest>;
export const forkResult = z.object({ snapshot: snapshotInfo, sandboxes: z.array(sandboxInfo) });
export type ForkResult = z.infer<typeof forkResult>;
