/** Volumes: request and answer bodies of /volumes, and a create's `volumes` mounts. */
import { z } from "zod";

/** A volume's name, unique in its tenant: lower-case letters, digits, '-' and '_', at most 63. */
export const VOLUME_NAME_RE = /^[a-z0-9][a-z0-9_-]{0,62}$/;
/** At most this many volumes mounted in one sandbox. */
export const MAX_SANDBOX_VOLUMES = 8;
/** Smallest and largest volume (ext4 needs a few MiB for its journal and tables). */
export const MIN_VOLUME_MIB = 16;
export const MAX_VOLUME_MIB = 1024 * 1024;

const volumeName = z
  .string()
  .regex(VOLUME_NAME_RE, "a volume name: lower-case letters, digits, '-' and '_', at most 63");

/** `POST /volumes`. */
export const createVolumeRequest = z.strictObject({
  name: volumeName,
  size_mib: z.number().int().min(MIN_VOLUME_MIB).max(MAX_VOLUME_MIB),
});
export type CreateVolumeRequest = z.infer<typeof createVolumeRequest>;

export const volumeInfo = z.object({
  volume_id: z.string(),
  name: z.string(),
  size_mib: z.number(),
  created_at: z.string(),
  /** The live sandboxes that mount it now (asleep ones included: they keep their mounts). */
  mounted_by: z.array(z.object({ sandbox_id: z.string(), path: z.string(), read_only: z.boolean() })),
});
export type VolumeInfo = z.infer<typeof volumeInfo>;
export const volumeList = z.object({ volumes: z.array(volumeInfo) });

/** One entry of a create's `volumes`: the volume `name` appears at `path`; `read_only` mounts refuse writes. */
export const volumeMount = z.strictObject({
  name: volumeName,
  path: z.string().min(1).max(4096),
  read_only: z.boolean().optional(),
});
export type VolumeMount = z.infer<typeof volumeMount>;
