import { randomBytes } from "node:crypto";

const ALPHABET = "abcdefghijklmnopqrstuvwxyz234567";

function base32(n: number): string {
  const bytes = randomBytes(n);
  let out = "";
  for (const b of bytes) out += ALPHABET[b & 31];
  return out;
}

export const newSandboxId = (): string => `sbx_${base32(20)}`;
export const newCommandId = (): string => `cmd_${base32(20)}`;
export const newKeyId = (): string => `key_${base32(20)}`;
/** What a sandbox sees in place of a vault secret (PLACEHOLDER_PREFIX + 32 random base32 characters). */
export const newPlaceholder = (): string => `bothy_ph_${base32(32)}`;
export const newApprovalId = (): string => `apr_${base32(20)}`;
export const newVolumeId = (): string => `vol_${base32(20)}`;
export const newSnapshotId = (): string => `snap_${base32(20)}`;
