/**
 * Names of what a server makes on the host outside its home. Each carries the home's tag, so two
 * servers on one host (two homes, or a test server beside a real one) each list and remove only
 * their own; names must fit the kernel's limits (an interface name is at most 15 characters).
 */
import { createHash } from "node:crypto";
import { realpathSync } from "node:fs";

const ALPHABET = "abcdefghijklmnopqrstuvwxyz234567";
const TAG_LENGTH = 4;

/** `[a-z2-7]{4}` from the home's real path: stable across restarts, different per home (20 bits). */
export function hostTag(home: string): string {
  const digest = createHash("sha256").update(realpathSync(home)).digest();
  return [...digest.subarray(0, TAG_LENGTH)].map((b) => ALPHABET[b & 31]).join("");
}

export type LinkKind = "veth" | "tap";

/** The nft table with every rule of this home: `inet bothy-<tag>`. */
export const nftTable = (tag: string): string => `inet bothy-${tag}`;

/** A gVisor sandbox's network namespace: `bothy-<tag>-<20-character id suffix>`. */
export const netnsName = (tag: string, sandboxId: string): string => `bothy-${tag}-${sandboxId.slice(4)}`;

/**
 * A sandbox's host-side interface, 15 characters: `bv` (veth, gVisor) or `bt` (tap, VMs), the tag,
 * `-` and 8 characters of the id; its alias holds the whole id.
 */
export const ifaceName = (tag: string, sandboxId: string, kind: LinkKind): string =>
  `${kind === "veth" ? "bv" : "bt"}${tag}-${sandboxId.slice(4, 12)}`;

/** The transient tap QEMU makes for a warm-start snapshot VM: `bs<tag>-<8 characters of its key>`. */
export const snapshotTapName = (tag: string, key: string): string => `bs${tag}-${key.slice(0, 8)}`;

/** A gVisor sandbox's cgroup (runsc makes and removes it). */
export const cgroupPath = (tag: string, sandboxId: string): string => `/bothy-${tag}/${sandboxId}`;

/**
 * Names before they carried a tag (a table `inet bothy`, `bothy-<20>`, `bv-<12>`/`bt-<12>`): a
 * server upgraded in place may find its own sandboxes' objects under them, and removes those.
 */
export const LEGACY = {
  table: "inet bothy",
  netnsName: (sandboxId: string): string => `bothy-${sandboxId.slice(4)}`,
  netnsRe: /^bothy-([a-z2-7]{20})$/,
  ifaceRe: /^b[vt]-[a-z2-7]{12}$/,
};
