/**
 * Snapshots: what a sandbox wrote over its template, kept as a read-only layer over the
 * template's (never a full copy), that new sandboxes start from with their own upper layer and a
 * new identity. One tenant's each, like volumes: another tenant's is answered as one that does not
 * exist. A snapshot's layer is published and its row written under the layer store's lock, so the
 * orphan sweep (start-up, every sweeper pass, each delete) sees either both or neither; a capture
 * assembles its copy in a staging directory the sweep leaves to it. Taking one is a `snapshot`
 * operation on the sandbox's actor: no delete, sleep or wake runs meanwhile.
 */
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, readdir, rm } from "node:fs/promises";
import path from "node:path";
import {
  BothyError,
  createSnapshotRequest,
  forkRequest,
  type ForkResult,
  type SandboxInfo,
  type SnapshotInfo,
} from "@bothy/protocol";
import { parseInput } from "../api/parse-input.ts";
import type { Quotas } from "../auth/quotas.ts";
import { execQuiet } from "../agent/quiet-exec.ts";
import { vmSnapshotFiles } from "../drivers/qemu-snapshot.ts";
import { describeCauses } from "../errors/internal-errors.ts";
import type { Logger } from "../events/server-events.ts";
import { LAYER_ID_RE, LayerStore, MAX_CHAIN_LENGTH } from "../images/layer-store.ts";
import { isUniqueViolation } from "../ledger/dialect.ts";
import type { LedgerStore } from "../ledger/store.ts";
import type { SnapshotRow } from "../ledger/snapshot-rows.ts";
import type { NetworkPolicy } from "@bothy/protocol";
import type { CreateOwner, SandboxManager, SnapshotSubject, TemplateSource } from "../sandboxes/sandbox-manager.ts";
import { newSnapshotId } from "../util/ids.ts";
import { snapshotLayerStore, snapshotStagingDir, treeBytes } from "./snapshot-layers.ts";
import { tenantSnapshot } from "./snapshot-lookup.ts";

const MIB = 1024 * 1024;
/** The guest's `sync` before a capture; a guest that cannot flush in this long is refused a snapshot. */
const SYNC_TIMEOUT_MS = 60_000;
const LAYER_PREFIX = "snap";

export interface SnapshotDeps {
  ledger: LedgerStore;
  manager: SandboxManager;
  quotas: Quotas;
  templates: TemplateSource;
  home: string;
  /** The host's default disk and process limits: a warmed snapshot's sandboxes get the source's or these. */
  limits: { defaultDiskMib: number; defaultProcesses: number };
  log: Logger;
}

export class SnapshotService {
  readonly layers: LayerStore;
  private readonly staging: string;
  /** Captures in flight, by snapshot id: their staging dirs are theirs, their names taken. */
  private readonly making = new Map<string, { tenant: string; name: string | null }>();

  constructor(private readonly deps: SnapshotDeps) {
    this.layers = snapshotLayerStore(deps.home);
    this.staging = snapshotStagingDir(deps.home);
  }

  /** Takes a snapshot of sandbox `sandboxId` (running or asleep), in the sandbox's tenant. */
  async create(sandboxId: string, body: unknown, idempotencyKey?: string): Promise<SnapshotInfo> {
    const req = parseInput(createSnapshotRequest, body, "POST /sandboxes/{id}/snapshots");
    const warm = req.warm ?? 0;
    const parent = warm > 0 ? await this.deps.manager.info(sandboxId) : undefined;
    // Sandboxes booted ahead count toward the host's limit, not the tenant's; the tenant must still
    // have room for the creates that will take them, or warming them is wasted.
    if (parent)
      await this.deps.quotas.admit(await this.tenantOf(sandboxId), {
        vcpu: parent.vcpu,
        memoryMib: parent.memory_mib,
        count: warm,
      });
    const row = await this.capture(sandboxId, req, idempotencyKey ?? null);
    if (parent) await this.warm(row, parent, warm);
    return this.view(row);
  }

  async list(tenant: string): Promise<SnapshotInfo[]> {
    return Promise.all((await this.deps.ledger.snapshots.list(tenant)).map((r) => this.view(r)));
  }

  async info(tenant: string, ref: string): Promise<SnapshotInfo> {
    return this.view(await this.find(tenant, ref));
  }

  /** Deletes a snapshot no live sandbox started from, and its layer (unless a later snapshot lies over it). */
  async delete(tenant: string, ref: string): Promise<{ deleted: string }> {
    const row = await this.find(tenant, ref);
    const live = await this.deps.ledger.snapshots.remove(row.id);
    if (live.length > 0)
      throw new BothyError(
        "snapshot_in_use",
        `Snapshot ${row.name ?? row.id} is in use by ${live.join(", ")}; delete those sandboxes first.`,
        { details: { sandboxes: live } },
      );
    this.deps.log("snapshot_deleted", { snapshot_id: row.id, tenant, layer: row.layer_id });
    // Its pool's sandboxes mount its layer: gone before the sweep, which keeps mounted layers.
    await this.deps.manager.dropSnapshotPool(row.id);
    // The row is gone: its layer is an orphan now, removed here, or by the next sweep if this fails.
    await this.removeOrphans("delete").catch((err: unknown) =>
      this.deps.log("snapshot_orphan_remove_failed", { snapshot_id: row.id, error: describeCauses(err) }),
    );
    return { deleted: row.id };
  }

  /**
   * A snapshot of the sandbox and `count` sandboxes started from it, all or nothing: the quotas are
   * checked for every child before anything is made, and a child that fails takes the others and
   * the snapshot with it. With an Idempotency-Key a retry gets the same snapshot and children.
   */
  async fork(
    sandboxId: string,
    body: unknown,
    idempotencyKey: string | undefined,
    owner: CreateOwner,
  ): Promise<{ result: ForkResult; created: boolean }> {
    const req = parseInput(forkRequest, body, "POST /sandboxes/{id}/fork");
    const parent = await this.deps.manager.info(sandboxId);
    const tenant = await this.tenantOf(sandboxId);
    const size = { vcpu: parent.vcpu, memoryMib: parent.memory_mib, count: req.count };
    const earlier =
      idempotencyKey === undefined
        ? undefined
        : await this.deps.ledger.snapshots.byIdempotencyKey(tenant, idempotencyKey);
    if (!earlier) await this.deps.quotas.admit(tenant, size);
    const snapshot =
      earlier ??
      (await this.capture(
        sandboxId,
        { ...(req.name === undefined ? {} : { name: req.name }), ...(req.memory === true ? { memory: true } : {}) },
        idempotencyKey ?? null,
      ));
    const child = await this.childBody(snapshot, parent, req);
    const made = await Promise.allSettled(
      Array.from({ length: req.count }, (_, i) =>
        this.deps.manager.create(child, idempotencyKey === undefined ? undefined : childKey(idempotencyKey, i), {
          ...owner,
          tenant,
          admit: (s) => this.deps.quotas.admit(tenant, s),
        }),
      ),
    );
    const failed = made.find((m): m is PromiseRejectedResult => m.status === "rejected");
    if (failed) {
      await this.undoFork(
        snapshot,
        made.flatMap((m) => (m.status === "fulfilled" && m.value.created ? [m.value.sandbox.sandbox_id] : [])),
        !earlier,
      );
      throw failed.reason;
    }
    const sandboxes = made.flatMap((m) => (m.status === "fulfilled" ? [m.value.sandbox] : []));
    const created = !earlier || made.some((m) => m.status === "fulfilled" && m.value.created);
    this.deps.log("sandbox_forked", { sandbox_id: sandboxId, snapshot_id: snapshot.id, count: req.count });
    return { result: { snapshot: await this.view(snapshot), sandboxes }, created };
  }

  /**
   * Removes layers no snapshot row names (directly or as the parent of one) and none mounted now,
   * and staging copies no capture in flight owns: what a crash or a failed delete left.
   */
  async removeOrphans(by: string): Promise<void> {
    const removed = await this.layers.removeOrphans(
      async () => (await this.deps.ledger.snapshots.layers()).map((l) => l.layer_id),
      new AbortController().signal,
    );
    if (removed.length > 0) this.deps.log("snapshot_layers_removed", { layers: removed, by });
    for (const entry of await readdir(this.staging).catch(() => [] as string[])) {
      // In one turn with the check: a capture's staging dir has its entry in `making` until removed.
      if (this.making.has(entry)) continue;
      await rm(path.join(this.staging, entry), { recursive: true, force: true });
    }
  }

  /** Template layers snapshots lie over: the template store's sweep must keep them. */
  async templateLayers(): Promise<string[]> {
    return (await this.deps.ledger.snapshots.layers()).map((l) => l.template_layer);
  }

  private async capture(
    sandboxId: string,
    req: { name?: string; memory?: boolean },
    idempotencyKey: string | null,
  ): Promise<SnapshotRow> {
    const tenant = await this.tenantOf(sandboxId);
    const name = req.name ?? null;
    if (name !== null) await this.refuseTakenName(tenant, name);
    return this.deps.manager.forSnapshot(sandboxId, async (subject) => {
      const { driver } = subject;
      const { captureFiles, captureImage } = driver;
      if (!captureFiles && !captureImage)
        throw new BothyError(
          "not_supported",
          `The ${driver.name} driver cannot take snapshots yet; snapshots work on sandboxes of the gvisor and qemu drivers.`,
        );
      if (req.memory === true && !captureImage)
        throw new BothyError(
          "snapshot_memory_unsupported",
          `The ${driver.name} driver on this host cannot keep a sandbox's memory and processes in a snapshot; send "memory": false (the default) to keep its files, which every sandbox started from it gets.`,
        );
      await this.deps.quotas.admitStorage(tenant, await this.usedMib(tenant), 0, "snapshot");
      const id = newSnapshotId();
      // Noted as in flight before the name is looked up again: a second capture with the name, at once, is refused.
      if (name !== null && [...this.making.values()].some((m) => m.tenant === tenant && m.name === name))
        throw taken(name);
      this.making.set(id, { tenant, name });
      try {
        if (name !== null && (await this.deps.ledger.snapshots.byName(tenant, name))) throw taken(name);
      } catch (err) {
        this.making.delete(id);
        throw err;
      }
      const base = await this.baseOf(subject).catch((err: unknown) => {
        this.making.delete(id);
        throw err;
      });
      const staging = path.join(this.staging, id);
      const started = Date.now();
      try {
        await mkdir(this.staging, { recursive: true, mode: 0o700 });
        // gVisor's sentry may hold written pages of mapped files; `sync` in the guest puts them in the upper.
        if (subject.agent) {
          const flushed = await execQuiet(
            subject.agent,
            "sync",
            SYNC_TIMEOUT_MS,
            "The guest's sync before the snapshot",
            "agent_timeout",
          );
          if (flushed.code !== 0)
            throw new BothyError(
              "internal",
              `The guest's sync before the snapshot failed: ${flushed.output.slice(-200)}`,
            );
        }
        // A VM's snapshot is files beside an empty tree (its disk member, its memory); gVisor's is the tree.
        let tree = staging;
        let beside: string[] = [];
        let frozenMs: number;
        if (captureImage) {
          tree = path.join(staging, "tree");
          await mkdir(tree, { recursive: true, mode: 0o755 });
          ({ frozenMs, files: beside } = await captureImage.call(
            driver,
            { id: sandboxId, dir: subject.dir, ...(subject.agent && subject.handle ? { handle: subject.handle } : {}) },
            base.parentStore.treeOf(base.parent),
            staging,
            req.memory === true,
          ));
        } else if (captureFiles) {
          ({ frozenMs } = await captureFiles.call(
            driver,
            { id: sandboxId, dir: subject.dir, running: subject.agent !== undefined },
            staging,
          ));
        } else throw new BothyError("internal", `The ${driver.name} driver has no capture.`);
        const bytes = await treeBytes(staging);
        await this.deps.quotas.admitStorage(tenant, await this.usedMib(tenant), Math.ceil(bytes / MIB), "snapshot");
        const row = await this.layers.locked(new AbortController().signal, async () => {
          // The staging folder and a layer's folder lie at one depth under the store, so the disk
          // member's backing file, named relative to its folder, is found from either.
          const layer = await this.layers.publish(tree, base.parent, LAYER_PREFIX, base.parentStore, beside);
          const snapshot: SnapshotRow = {
            id,
            tenant,
            name,
            source_sandbox_id: sandboxId,
            template: subject.row.template,
            template_hash: subject.row.template_hash,
            driver: driver.name,
            layer_id: layer.id,
            template_layer: base.templateLayer,
            bytes,
            created_at: new Date().toISOString(),
            idempotency_key: idempotencyKey,
            memory: req.memory === true ? 1 : 0,
          };
          try {
            await this.deps.ledger.snapshots.insert(snapshot);
          } catch (err) {
            await rm(path.join(this.layers.dir, layer.id), { recursive: true, force: true });
            if (!isUniqueViolation(err)) throw err;
            if (name !== null && (await this.deps.ledger.snapshots.byName(tenant, name))) throw taken(name);
            // The other unique key: a fork with the same Idempotency-Key finished its capture first.
            throw new BothyError(
              "idempotency_key_in_flight",
              "A fork with this Idempotency-Key is under way; retry once it has answered, and get its snapshot and sandboxes.",
            );
          }
          return snapshot;
        });
        this.deps.log("snapshot_created", {
          snapshot_id: id,
          sandbox_id: sandboxId,
          tenant,
          bytes,
          frozen_ms: frozenMs,
          ms: Date.now() - started,
        });
        return row;
      } finally {
        await rm(staging, { recursive: true, force: true });
        this.making.delete(id);
      }
    });
  }

  /**
   * Boots `count` sandboxes from the snapshot for creates to take, of the source sandbox's size.
   * Best effort: the snapshot is made either way, and creates from it boot cold without them.
   */
  private async warm(row: SnapshotRow, parent: SandboxInfo, count: number): Promise<void> {
    const { limits } = this.deps;
    try {
      await this.deps.manager.warmSnapshot(
        row,
        {
          vcpu: parent.vcpu,
          memoryMib: parent.memory_mib,
          diskMib: parent.disk_mib ?? limits.defaultDiskMib,
          maxProcesses: parent.max_processes ?? limits.defaultProcesses,
        },
        count,
      );
      this.deps.log("snapshot_warming", { snapshot_id: row.id, count });
    } catch (err) {
      this.deps.log("snapshot_warming", { snapshot_id: row.id, count: 0, error: describeCauses(err) });
    }
  }

  /** The layer a capture of this sandbox lies over: the snapshot it started from, else its template's top layer. */
  private async baseOf(
    subject: SnapshotSubject,
  ): Promise<{ parent: string; parentStore: LayerStore; templateLayer: string }> {
    const own = await this.deps.ledger.snapshots.ofSandbox(subject.row.id);
    if (own) {
      // Overlayfs mounts at most MAX_CHAIN_LENGTH lower dirs: a snapshot that could not be started from is refused.
      if ((await this.layers.chain(own.layer_id)).length >= MAX_CHAIN_LENGTH)
        throw new BothyError(
          "invalid_request",
          `Sandbox ${subject.row.id} already mounts ${MAX_CHAIN_LENGTH} layers (snapshots over its template), the most a sandbox can; snapshot a sandbox started from an earlier snapshot.`,
        );
      return { parent: own.layer_id, parentStore: this.layers, templateLayer: own.template_layer };
    }
    const { template, template_hash: hash } = subject.row;
    const built = await this.deps.templates.resolveBuild?.(template, hash);
    const layerDir = built && path.dirname(built.rootfs);
    const layerId = layerDir && path.basename(layerDir);
    if (
      !built ||
      !layerDir ||
      !layerId ||
      path.basename(built.rootfs) !== "tree" ||
      !LAYER_ID_RE.test(layerId) ||
      path.basename(path.dirname(layerDir)) !== "layers"
    )
      throw new BothyError(
        "template_not_built",
        `The sandbox's template build ${template}@${hash.slice(0, 12)} is not on this host as layers; rebuild it (bothy template build ${template}) and snapshot a sandbox made from the new build.`,
      );
    return {
      parent: layerId,
      parentStore: new LayerStore(path.dirname(path.dirname(layerDir))),
      templateLayer: layerId,
    };
  }

  /** MiB of the tenant's volumes and snapshots, captures in flight not counted (their size is not known yet). */
  private async usedMib(tenant: string): Promise<number> {
    const [volumes, snapshots] = await Promise.all([
      this.deps.ledger.volumes.totalMib(tenant),
      this.deps.ledger.snapshots.totalBytes(tenant),
    ]);
    return volumes + Math.ceil(snapshots / MIB);
  }

  private async refuseTakenName(tenant: string, name: string): Promise<void> {
    const inFlight = [...this.making.values()].some((m) => m.tenant === tenant && m.name === name);
    if (inFlight || (await this.deps.ledger.snapshots.byName(tenant, name))) throw taken(name);
  }

  /** A child of a fork: the parent's size and network posture, its snapshot; no volumes or secrets. */
  private async childBody(
    snapshot: SnapshotRow,
    parent: SandboxInfo,
    req: { timeout_s?: number; metadata?: Record<string, string> },
  ): Promise<Record<string, unknown>> {
    const net = (await this.deps.ledger.getSandbox(parent.sandbox_id))?.network;
    const shown = net ? (JSON.parse(net) as NetworkPolicy) : undefined;
    return {
      snapshot: snapshot.id,
      vcpu: parent.vcpu,
      memory_mib: parent.memory_mib,
      ...(parent.disk_mib == null ? {} : { disk_mib: parent.disk_mib }),
      ...(parent.max_processes == null ? {} : { max_processes: parent.max_processes }),
      ...(shown?.enabled === true
        ? {
            internet: shown.internet,
            ...(shown.allow_out.length > 0 ? { allow_out: shown.allow_out } : {}),
            ...(shown.deny_out.length > 0 ? { deny_out: shown.deny_out } : {}),
          }
        : {}),
      ...(req.timeout_s === undefined ? {} : { timeout_s: req.timeout_s }),
      ...(req.metadata === undefined ? {} : { metadata: req.metadata }),
    };
  }

  /** A fork that failed: its children made so far are deleted, and the snapshot if this call made it. */
  private async undoFork(snapshot: SnapshotRow, children: string[], ownSnapshot: boolean): Promise<void> {
    await Promise.allSettled(children.map((id) => this.deps.manager.delete(id, "fork failed", { wait: true })));
    if (!ownSnapshot) return;
    if ((await this.deps.ledger.snapshots.remove(snapshot.id)).length === 0) {
      await this.deps.manager.dropSnapshotPool(snapshot.id);
      await this.removeOrphans("fork failed");
    }
  }

  /** The tenant of a sandbox the caller may see (the auth hook answered any other as unknown). */
  private async tenantOf(sandboxId: string): Promise<string> {
    await this.deps.manager.info(sandboxId);
    const tenant = await this.deps.ledger.auth.sandboxTenant(sandboxId);
    if (tenant === undefined)
      throw new BothyError("sandbox_not_found", `No sandbox ${sandboxId}; list them with GET /sandboxes.`);
    return tenant;
  }

  /** The tenant's snapshot by id or name; another tenant's is as absent as one that never existed. */
  private find(tenant: string, ref: string): Promise<SnapshotRow> {
    return tenantSnapshot(this.deps.ledger.snapshots, tenant, ref);
  }

  /** Whether it kept memory: its row says so, or (taken before the row did) its layer holds a memory state. */
  private keptMemory(row: SnapshotRow): boolean {
    if (row.memory !== null) return row.memory === 1;
    return existsSync(vmSnapshotFiles(this.layers.treeOf(row.layer_id)).memory);
  }

  private async view(row: SnapshotRow): Promise<SnapshotInfo> {
    return {
      snapshot_id: row.id,
      name: row.name,
      source_sandbox_id: row.source_sandbox_id,
      template: row.template,
      driver: row.driver,
      bytes: row.bytes,
      created_at: row.created_at,
      memory: this.keptMemory(row),
      used_by: await this.deps.ledger.snapshots.liveUsers(row.id),
      warm_ready: this.deps.manager.snapshotPoolReady(row.id),
    };
  }
}

function taken(name: string): BothyError {
  return new BothyError(
    "snapshot_exists",
    `Snapshot ${name} already exists in this tenant; pick another name or delete it first (DELETE /snapshots/${name}).`,
  );
}

/** A child's Idempotency-Key, derived from the fork's: within the create's limits whatever the fork's length. */
function childKey(forkKey: string, index: number): string {
  return `fork-${createHash("sha256").update(forkKey).digest("hex").slice(0, 32)}-${index}`;
}
