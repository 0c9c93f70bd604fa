/**
 * The tenant's snapshots (`/snapshots`): a sandbox's files kept as a layer over its template's,
 * taken with `sandbox.snapshot()` or `sandbox.fork(n)` and started from with
 * `Sandbox.create({ snapshot })`. What `bothy snapshot` uses.
 */
import { snapshotInfo, snapshotList, type SnapshotInfo } from "@bothy/protocol";
import { z } from "zod";
import { HttpClient, type CallOptions, type ConnectionOptions } from "./http-client.ts";

export type { SnapshotInfo };

export interface SnapshotOptions extends ConnectionOptions, CallOptions {}

const signalOf = (o: CallOptions): CallOptions => (o.signal ? { signal: o.signal } : {});
const path = (ref: string): string => `/snapshots/${encodeURIComponent(ref)}`;
const deleted = z.object({ deleted: z.string() });

export const Snapshot = {
  async list(options: SnapshotOptions = {}): Promise<SnapshotInfo[]> {
    return (await new HttpClient(options).json("GET", "/snapshots", snapshotList, signalOf(options))).snapshots;
  },
  /** By id (`snap_…`) or name. */
  async get(ref: string, options: SnapshotOptions = {}): Promise<SnapshotInfo> {
    return new HttpClient(options).json("GET", path(ref), snapshotInfo, signalOf(options));
  },
  /** Deletes it and its files; a ConflictError (`snapshot_in_use`) while a live sandbox started from it. */
  async delete(ref: string, options: SnapshotOptions = {}): Promise<void> {
    await new HttpClient(options).json("DELETE", path(ref), deleted, signalOf(options));
  },
};
