/**
 * The tenant's volumes (`/volumes`): storage that outlives sandboxes, mounted by
 * `Sandbox.create({ volumes: [{ name, path, readOnly? }] })`. What `bothy volume` uses.
 */
import { volumeInfo, volumeList, type VolumeInfo } from "@bothy/protocol";
import { z } from "zod";
import { HttpClient, type CallOptions, type ConnectionOptions } from "./http-client.ts";

export type { VolumeInfo };

export interface VolumeOptions extends ConnectionOptions, CallOptions {}

const signalOf = (o: CallOptions): CallOptions => (o.signal ? { signal: o.signal } : {});
const path = (name: string): string => `/volumes/${encodeURIComponent(name)}`;
const deleted = z.object({ deleted: z.string() });

export const Volume = {
  /** Makes an empty volume of `sizeMib`; counts against the tenant's `max_storage_mib`. */
  async create(name: string, sizeMib: number, options: VolumeOptions = {}): Promise<VolumeInfo> {
    return new HttpClient(options).json("POST", "/volumes", volumeInfo, {
      body: { name, size_mib: sizeMib },
      ...signalOf(options),
    });
  },
  async list(options: VolumeOptions = {}): Promise<VolumeInfo[]> {
    return (await new HttpClient(options).json("GET", "/volumes", volumeList, signalOf(options))).volumes;
  },
  async get(name: string, options: VolumeOptions = {}): Promise<VolumeInfo> {
    return new HttpClient(options).json("GET", path(name), volumeInfo, signalOf(options));
  },
  /** Deletes it and its data; a ConflictError (`volume_in_use`) while a live sandbox mounts it. */
  async delete(name: string, options: VolumeOptions = {}): Promise<void> {
    await new HttpClient(options).json("DELETE", path(name), deleted, signalOf(options));
  },
};
