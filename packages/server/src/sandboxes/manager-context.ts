import { join } from "node:path";
import { BothyError, SANDBOX_ID_RE, type SandboxInfo } from "@bothy/protocol";
import type { Config } from "../config.ts";
import { describeCauses } from "../errors/internal-errors.ts";
import type { EgressPolicy, SandboxSpec } from "../drivers/driver.ts";
import type { DriverRegistry } from "../drivers/driver-registry.ts";
import type { Logger } from "../events/server-events.ts";
import { trustEnv } from "../gateway/guest-trust.ts";
import { GatewayPolicies } from "../gateway/policies.ts";
import type { Vault } from "../gateway/vault.ts";
import { toSandboxInfo, type SandboxRow } from "../ledger/ledger.ts";
import type { LedgerStore } from "../ledger/store.ts";
import type { VolumeService } from "../volumes/volume-service.ts";
import type { LayerStore } from "../images/layer-store.ts";
import { snapshotLayerStore } from "../snapshots/snapshot-layers.ts";
import { SandboxActor } from "./sandbox-actor.ts";
import { SandboxRecords } from "./sandbox-records.ts";
import { WarmPool } from "./warm-pool.ts";

export interface BuiltTemplateRef {
  name: string;
  hash: string;
  rootfs: string;
  env: Record<string, string>;
}

/** Where templates come from; the template store implements it. */
export interface TemplateSource {
  resolve(name: string): Promise<BuiltTemplateRef | undefined>;
  /** A build by its hash, if still on disk: a stopped sandbox starts again on the template it was made from. */
  resolveBuild?(name: string, hash: string): Promise<BuiltTemplateRef | undefined>;
}

/** The ledger as the manager's parts see it: everything but changing a state, which is the actor's. */
export type LedgerView = Omit<LedgerStore, "transition">;

/**
 * What the parts of the sandbox manager share: its dependencies, one record per sandbox this
 * process holds or works on, the actor that changes their states, the warm pool, whether the
 * server is stopping, and the lookups every part makes.
 */
export class ManagerContext {
  /** One record per sandbox this process holds or works on (see sandbox-records.ts). */
  readonly records = new SandboxRecords();
  /** The only way to change a sandbox's state (sandbox-actor.ts). */
  readonly actor: SandboxActor;
  readonly ledger: LedgerView;
  readonly pool: WarmPool;
  /** Host policies of tenants and sandboxes, as the gateway applies them. */
  readonly policies: GatewayPolicies;
  /** Where snapshots' layers live (snapshots/snapshot-layers.ts). */
  readonly snapshotLayers: LayerStore;
  stopping = false;

  constructor(
    readonly config: Config,
    ledger: LedgerStore,
    readonly drivers: DriverRegistry,
    readonly templates: TemplateSource,
    readonly log: Logger,
    /** The vault that binds secrets to sandboxes, and the CA guests trust; absent: creates naming secrets are refused. */
    readonly gateway?: { vault: Vault; caPem: string },
    /** Volumes; absent: creates naming volumes are refused. */
    readonly volumes?: VolumeService,
  ) {
    this.ledger = ledger;
    this.actor = new SandboxActor(this.records, ledger, log);
    // Side state this part keeps per sandbox goes when the sandbox is over: command records
    // still marked running, and a claimed pool sandbox's deferred refill.
    this.actor.onFinal((id) => {
      ledger
        .loseCommands(id)
        .catch((err: unknown) => log("sandbox_final_cleanup_failed", { sandbox_id: id, error: describeCauses(err) }));
      this.pool.settled(id);
    });
    this.pool = new WarmPool({
      size: config.poolSize,
      shapes: config.poolShapes.map((s) => ({
        driver: s.driver ?? drivers.defaultName,
        template: s.template,
        vcpu: s.vcpu,
        memoryMib: s.memoryMib,
        diskMib: config.limits.defaultDiskMib,
        maxProcesses: config.limits.defaultProcesses,
      })),
      dirFor: (id) => this.dirFor(id),
      bootTimeoutMs: config.bootTimeoutMs,
      log,
      hasRoom: () => this.inUse() < config.limits.maxSandboxes,
    });
    this.policies = new GatewayPolicies(ledger);
    this.snapshotLayers = snapshotLayerStore(config.home);
  }

  dirFor(id: string): string {
    return join(this.config.home, "sandboxes", id);
  }

  async info(id: string): Promise<SandboxInfo> {
    checkId(id);
    const row = await this.ledger.getSandbox(id);
    if (!row) throw new BothyError("sandbox_not_found", `No sandbox ${id}; list them with GET /sandboxes.`);
    return this.view(row);
  }

  /** A row as the API shows it, with the host policy in force now (its tenant's may have changed). */
  async view(row: SandboxRow): Promise<SandboxInfo> {
    return (await this.views([row]))[0]!;
  }

  /** Rows as `view` shows them, for a list: their lifecycle rows and each tenant's policy read once for all. */
  async views(rows: readonly SandboxRow[]): Promise<SandboxInfo[]> {
    const [lifecycles, policies] = await Promise.all([
      this.ledger.lifecycle.ofMany(rows.map((r) => r.id)),
      this.policies.ofRows(rows),
    ]);
    return rows.map((row, i) => {
      const lifecycle = lifecycles.get(row.id);
      return {
        ...toSandboxInfo(row),
        on_timeout: lifecycle?.on_timeout ?? "delete",
        auto_wake: lifecycle === undefined || lifecycle.auto_wake === 1,
        policy: policies[i] ?? null,
      };
    });
  }

  /**
   * Ids of every sandbox whose host objects the manager answers for: live, being created,
   * deleted, paused or resumed, dying, and the warm pool's (which have no ledger row).
   */
  ownedIds(): Set<string> {
    return new Set([...this.records.ownedIds(), ...this.pool.ownedIds()]);
  }

  /**
   * What counts against the host's limit (BOTHY_MAX_SANDBOXES): held sandboxes, creates in flight
   * (a create that has adopted its sandbox twice), and the warm pool's, booted or booting.
   */
  private inUse(): number {
    const all = this.records.all();
    return all.filter((r) => r.booted).length + all.filter((r) => r.phase.op === "create").length + this.pool.count();
  }

  atCapacity(): boolean {
    return this.inUse() >= this.config.limits.maxSandboxes;
  }

  /** Whether one more sandbox fits, giving up a warm pool sandbox for it when the host is full. */
  makeRoom(): boolean {
    if (!this.atCapacity()) return true;
    return this.pool.evictOne() && !this.atCapacity();
  }

  /** With networking on, every guest trusts the egress CA (pool sandboxes too, so any can be claimed). */
  trust(): { egressCa?: string; commandEnv?: Record<string, string> } {
    if (!this.gateway || !this.config.network.enabled) return {};
    return { egressCa: this.gateway.caPem, commandEnv: trustEnv() };
  }

  /** What every command of the sandbox gets beneath its own env: the CA bundle's paths and its secrets' placeholders. */
  async commandEnv(id: string): Promise<Record<string, string>> {
    return { ...this.trust().commandEnv, ...(await this.gateway?.vault.placeholderEnv(id)) };
  }

  /** A boot's spec for sandbox `id` of this template and size: its directory, egress, and what its guest trusts. */
  async bootSpec(
    id: string,
    template: BuiltTemplateRef,
    size: { vcpu: number; memoryMib: number; diskMib?: number; maxProcesses: number },
    egress: EgressPolicy,
  ): Promise<SandboxSpec> {
    return {
      id,
      templateRoot: (await this.snapshotRootOf(id)) ?? template.rootfs,
      templateEnv: template.env,
      ...size,
      dir: this.dirFor(id),
      egress,
      ...this.trust(),
      commandEnv: await this.commandEnv(id),
      ...(await this.volumesOf(id)),
    };
  }

  /**
   * The layer of the snapshot a sandbox started from, if any: it stands for the snapshot's whole
   * chain, its template's layers included, and the sandbox gets its own upper over it.
   */
  private async snapshotRootOf(id: string): Promise<string | undefined> {
    const snapshot = await this.ledger.snapshots.ofSandbox(id);
    return snapshot && this.snapshotLayers.treeOf(snapshot.layer_id);
  }

  /** The volumes a sandbox's row claims, as its driver mounts them. */
  private async volumesOf(id: string): Promise<Pick<SandboxSpec, "volumes" | "volumeHost">> {
    const claims = await this.ledger.volumes.claimsOf(id);
    if (claims.length === 0 || !this.volumes) return {};
    const { mounts } = this.volumes;
    return {
      volumeHost: mounts,
      volumes: claims.map((c) => ({
        volumeId: c.volume_id,
        hostDir: mounts.mountDir(c.volume_id),
        image: mounts.imagePath(c.volume_id),
        guestPath: c.path,
        readOnly: c.read_only === 1,
      })),
    };
  }

  /**
   * Refuses to start a sandbox of another node of the cluster here: its disk is on that node, which
   * answers for it (a node whose lease lapsed takes it back when it returns). No-op on one machine.
   */
  checkHere(row: SandboxRow): void {
    const here = this.config.cluster?.nodeId;
    if (here === undefined || row.node_id === here) return;
    throw new BothyError(
      "sandbox_not_running",
      `Sandbox ${row.id} lives on node ${row.node_id ?? "(none)"}, not on this node (${here}): its disk is there. Send the request to that node; if it is down, the sandbox runs again once it is back.`,
      { details: { sandbox_id: row.id, node_id: row.node_id } },
    );
  }

  /** Notes activity on a sandbox: idle sleep counts from the last one. */
  touch(id: string): void {
    const rec = this.records.get(id);
    if (rec?.booted) rec.lastActive = Date.now();
  }
}

function checkId(id: string): void {
  if (!SANDBOX_ID_RE.test(id))
    throw new BothyError(
      "invalid_sandbox_id",
      `"${id.slice(0, 64)}" is not a sandbox id; ids look like sbx_ followed by 20 letters and digits.`,
    );
}
