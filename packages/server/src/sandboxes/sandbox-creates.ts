import { createHash } from "node:crypto";
import { BothyError, IDEMPOTENCY_KEY_RE, type SandboxInfo } from "@bothy/protocol";
import type { Driver } from "../drivers/driver.ts";
import { describeCauses, toCreateFailure } from "../errors/internal-errors.ts";
import { DEFAULT_TENANT } from "../ledger/ledger.ts";
import type { SnapshotRow } from "../ledger/snapshot-rows.ts";
import { isDefaultPolicy } from "../network/egress-policy.ts";
import { tenantSnapshot } from "../snapshots/snapshot-lookup.ts";
import { newSandboxId } from "../util/ids.ts";
import { bootSandbox } from "./boot.ts";
import { networkPolicy, parseCreateRequest, type CreateRequest } from "./create-request.ts";
import type { HeldSandboxes } from "./held-sandboxes.ts";
import { expiryFrom, lifetimeOf } from "./lifetime.ts";
import type { BuiltTemplateRef, ManagerContext } from "./manager-context.ts";
import type { PoolShape } from "./warm-pool.ts";

/** Whose the sandbox is, and what its tenant's quotas say about a new one (throws to refuse). */
export interface CreateOwner {
  tenant: string;
  /** The key holds `network:private`: `allow_out` may name private blocks within BOTHY_ALLOW_OUT_PERMIT. */
  mayOpenPrivate?: boolean;
  admit?: (size: { vcpu: number; memoryMib: number }) => void;
}

export interface CreateResult {
  sandbox: SandboxInfo;
  /** False when an Idempotency-Key replay returned an existing sandbox. */
  created: boolean;
}

/**
 * Creates: the body checked, an Idempotency-Key replayed or refused, a warm-pool sandbox claimed
 * when one fits (else a new boot), the ledger row written before anything is made; and the pool
 * filled for a template's default shape.
 */
export class SandboxCreates {
  /** Creates under an Idempotency-Key that are still booting, with the fingerprint of their body. */
  private readonly inflightKeys = new Map<string, { fingerprint: string; job: Promise<CreateResult> }>();

  constructor(
    private readonly ctx: ManagerContext,
    private readonly held: HeldSandboxes,
  ) {}

  /**
   * Starts filling the warm pool for each configured shape (BOTHY_POOL_SHAPES), or those of one
   * template, at the template's current build (pools of older builds are drained).
   */
  async warm(templateName?: string): Promise<void> {
    const { defaultDiskMib, defaultProcesses } = this.ctx.config.limits;
    for (const s of this.ctx.config.poolShapes) {
      if (templateName !== undefined && s.template !== templateName) continue;
      const template = await this.ctx.templates.resolve(s.template);
      if (!template) continue;
      // A shape of a driver this host cannot run has no pool (its creates are refused anyway).
      const driver = this.ctx.drivers.all().find((d) => d.name === (s.driver ?? this.ctx.drivers.defaultName));
      if (!driver) continue;
      const size = { vcpu: s.vcpu, memoryMib: s.memoryMib, diskMib: defaultDiskMib, maxProcesses: defaultProcesses };
      this.ctx.pool.warm(this.shape(template, size, driver));
    }
  }

  async create(
    body: unknown,
    idempotencyKey: string | undefined,
    owner: CreateOwner = { tenant: DEFAULT_TENANT },
  ): Promise<CreateResult> {
    if (this.ctx.stopping)
      throw new BothyError("shutting_down", "The server is shutting down; retry against its replacement.");
    const req = parseCreateRequest(
      body,
      this.ctx.config,
      this.ctx.gateway !== undefined,
      owner.mayOpenPrivate ?? false,
    );
    if (req.snapshot !== undefined) refuseOtherTemplate(body);
    if (idempotencyKey === undefined) return this.createNew(req, undefined, owner);
    if (!IDEMPOTENCY_KEY_RE.test(idempotencyKey)) {
      throw new BothyError(
        "idempotency_key_invalid",
        "Idempotency-Key must be 1-255 printable ASCII characters without spaces.",
      );
    }
    const fingerprint = createHash("sha256").update(JSON.stringify(req)).digest("hex");
    const reused = (): BothyError =>
      new BothyError(
        "idempotency_key_reused",
        "This Idempotency-Key was used for a different request body; use a new key for a new sandbox.",
      );
    // A create still booting under this key may not be in the ledger yet, so its body is checked here too.
    // Keys are per tenant: the same key in two tenants names two sandboxes.
    const slot = `${owner.tenant}\0${idempotencyKey}`;
    const inflight = this.inflightKeys.get(slot);
    if (inflight) {
      if (inflight.fingerprint !== fingerprint) throw reused();
      return { ...(await inflight.job), created: false };
    }
    const known = this.ctx.ledger.findIdempotencyKey(owner.tenant, idempotencyKey);
    if (known) {
      if (known.fingerprint !== fingerprint) throw reused();
      const row = this.ctx.ledger.getSandbox(known.sandbox_id);
      if (row) return { sandbox: this.ctx.view(row), created: false };
    }
    const job = this.createNew(req, { key: idempotencyKey, fingerprint }, owner);
    this.inflightKeys.set(slot, { fingerprint, job });
    try {
      return await job;
    } finally {
      this.inflightKeys.delete(slot);
    }
  }

  /**
   * The tenant's snapshot by id or name; another tenant's is answered as one that does not exist.
   * A sandbox from a snapshot runs on the snapshot's driver: naming another is refused.
   */
  private snapshotOf(ref: string, tenant: string, driver: string | undefined): SnapshotRow {
    const row = tenantSnapshot(this.ctx.ledger.snapshots, tenant, ref);
    if (driver !== undefined && driver !== row.driver)
      throw new BothyError(
        "invalid_request",
        `Snapshot ${row.id} was taken on ${row.driver}; a sandbox from it runs there too: leave out "driver" or give "${row.driver}".`,
      );
    return row;
  }

  /** The template build a snapshot lies over (its environment and name; its files come from the snapshot's chain). */
  private async snapshotTemplate(snapshot: SnapshotRow): Promise<BuiltTemplateRef> {
    const t = await this.ctx.templates.resolveBuild?.(snapshot.template, snapshot.template_hash);
    if (t?.hash !== snapshot.template_hash)
      throw new BothyError(
        "template_not_built",
        `Snapshot ${snapshot.id} lies over template build ${snapshot.template}@${snapshot.template_hash.slice(0, 12)}, which is no longer on this host; take a new snapshot.`,
      );
    return t;
  }

  private shape(
    t: BuiltTemplateRef,
    size: { vcpu: number; memoryMib: number; diskMib: number; maxProcesses: number },
    driver: Driver,
    snapshot?: SnapshotRow,
  ): PoolShape {
    return {
      driver,
      templateName: t.name,
      templateRoot: snapshot ? this.ctx.snapshotLayers.treeOf(snapshot.layer_id) : t.rootfs,
      templateHash: t.hash,
      templateEnv: t.env,
      ...size,
      ...this.ctx.trust(),
      ...(snapshot ? { snapshotId: snapshot.id } : {}),
    };
  }

  /**
   * Boots `count` sandboxes from a snapshot ahead of the creates that will start from it, of
   * `size` (the source sandbox's) and the default posture: what a create must ask for to take one.
   */
  async warmSnapshot(
    snapshot: SnapshotRow,
    size: { vcpu: number; memoryMib: number; diskMib: number; maxProcesses: number },
    count: number,
  ): Promise<void> {
    const template = await this.snapshotTemplate(snapshot);
    const shape = this.shape(template, size, this.ctx.drivers.get(snapshot.driver), snapshot);
    this.ctx.pool.warmSnapshot({ ...shape, snapshotId: snapshot.id }, count);
  }

  private async createNew(
    req: CreateRequest,
    idem: { key: string; fingerprint: string } | undefined,
    owner: CreateOwner,
  ): Promise<CreateResult> {
    const snapshot = req.snapshot === undefined ? undefined : this.snapshotOf(req.snapshot, owner.tenant, req.driver);
    const template = snapshot ? await this.snapshotTemplate(snapshot) : await this.ctx.templates.resolve(req.template);
    if (!template) {
      throw new BothyError(
        "template_not_built",
        `Template "${req.template}" is defined but not built yet: run \`bothy template build ${req.template}\`.`,
      );
    }
    const driver = this.ctx.drivers.get(snapshot?.driver ?? req.driver);
    const lifetime = lifetimeOf(req, this.ctx.config.lifecycle);
    const started = Date.now();
    const diskMib = req.disk_mib ?? this.ctx.config.limits.defaultDiskMib;
    const maxProcesses = req.max_processes ?? this.ctx.config.limits.defaultProcesses;
    const shape = this.shape(
      template,
      { vcpu: req.vcpu, memoryMib: req.memory_mib, diskMib, maxProcesses },
      driver,
      snapshot,
    );
    const network = networkPolicy(req, owner.tenant, this.ctx.config.network, this.ctx.policies);
    const mounts = req.volumes ?? [];
    if (mounts.length > 0 && !this.ctx.volumes)
      throw new BothyError("not_supported", "This server has no volumes; create the sandbox without `volumes`.");
    // Pool sandboxes were made with the default posture and no volumes; any other create boots its
    // own. One from a snapshot takes only a sandbox booted from that snapshot (the shape names it).
    const poolable = isDefaultPolicy(network.egress) && !network.egress.gateway && mounts.length === 0;
    // A claim from the pool takes no more of the host; any other create needs room, a pool
    // sandbox giving up its own when the host is full. From here to the row's insert below all
    // runs synchronously, so two creates cannot both pass these checks.
    if (!(poolable && this.ctx.pool.hasReady(shape)) && !this.ctx.makeRoom()) {
      throw new BothyError(
        "capacity_exhausted",
        `This host runs at most ${this.ctx.config.limits.maxSandboxes} sandboxes; delete one or raise BOTHY_MAX_SANDBOXES.`,
      );
    }
    owner.admit?.({ vcpu: req.vcpu, memoryMib: req.memory_mib });
    const secrets = req.secrets ?? [];
    // Before anything is made: a create naming a secret the vault lacks makes nothing.
    if (secrets.length > 0) this.ctx.gateway?.vault.requireAll(owner.tenant, secrets);
    // Looked up again in the turn of the claim and insert: a delete of the snapshot since cannot slip between.
    if (snapshot) this.snapshotOf(snapshot.id, owner.tenant, undefined);
    const warm = poolable ? this.ctx.pool.claim(shape) : undefined;
    const id = warm?.spec.id ?? newSandboxId();
    // Checked before the row, claimed right after it in the same turn: no other create interleaves.
    const claims = this.ctx.volumes?.claimsFor(owner.tenant, id, driver.name, mounts) ?? [];
    this.ctx.ledger.insertSandbox(
      {
        id,
        template: template.name,
        template_hash: template.hash,
        driver: driver.name,
        acceleration: driver.acceleration,
        vcpu: req.vcpu,
        memory_mib: req.memory_mib,
        disk_mib: diskMib,
        max_processes: maxProcesses,
        state: warm ? "running" : "creating",
        expires_at: expiryFrom(lifetime.timeoutS, started),
        delete_on_disconnect: lifetime.deleteOnDisconnect ? 1 : 0,
        disconnect_grace_s: lifetime.disconnectGraceS,
        network: JSON.stringify(network.shown),
        metadata: JSON.stringify(req.metadata ?? {}),
        tenant: owner.tenant,
        policy: network.record ? JSON.stringify(network.record) : null,
      },
      idem,
    );
    // In the same turn as the row: no sweep can find the sandbox expired without its lifecycle.
    if (lifetime.onTimeout !== "delete" || !lifetime.autoWake)
      this.ctx.ledger.lifecycle.put({
        sandbox_id: id,
        on_timeout: lifetime.onTimeout,
        auto_wake: lifetime.autoWake ? 1 : 0,
        timeout_s: lifetime.timeoutS,
        asleep_by: null,
      });
    this.ctx.volumes?.commitClaims(claims);
    if (snapshot) this.ctx.ledger.snapshots.addUse(id, snapshot.id);
    if (secrets.length > 0) this.ctx.gateway?.vault.bindSandbox(owner.tenant, id, secrets);
    // Queued first on the new sandbox's actor, so it starts in this turn: the host's limit counts it at once.
    return this.ctx.actor.run(id, "create", async (move): Promise<CreateResult> => {
      let booted = warm;
      // Pool sandboxes boot at the lowest CPU weight (warm-pool.ts); this one now serves a caller.
      if (warm?.handle.prioritize)
        await warm.handle
          .prioritize()
          .catch((err: unknown) =>
            this.ctx.log("pool_prioritize_failed", { sandbox_id: id, error: describeCauses(err) }),
          );
      try {
        booted ??= await bootSandbox(
          driver,
          this.ctx.bootSpec(
            id,
            template,
            { vcpu: req.vcpu, memoryMib: req.memory_mib, diskMib, maxProcesses },
            network.egress,
          ),
          this.ctx.config.bootTimeoutMs,
        );
      } catch (err) {
        const e = toCreateFailure(err);
        move("creating", "failed", e.message);
        if (idem) this.ctx.ledger.forgetIdempotencyKey(owner.tenant, idem.key);
        this.ctx.log("sandbox_create_failed", { sandbox_id: id, error: describeCauses(err) });
        throw e;
      }
      try {
        if (!warm) move("creating", "running");
      } catch (err) {
        await booted.handle.destroy();
        if (idem) this.ctx.ledger.forgetIdempotencyKey(owner.tenant, idem.key);
        throw err;
      }
      this.held.adopt(booted);
      // A sandbox's time counts from when it runs, not from a boot that may have been slow.
      if (!warm) this.ctx.ledger.setExpiresAt(id, expiryFrom(lifetime.timeoutS));
      this.ctx.touch(id);
      this.ctx.log("sandbox_created", {
        sandbox_id: id,
        template: template.name,
        vcpu: req.vcpu,
        memory_mib: req.memory_mib,
        driver: driver.name,
        warm: warm !== undefined,
        ms: Date.now() - started,
        ...(warm === undefined && booted.stepsMs ? { steps: booted.stepsMs } : {}),
      });
      return { sandbox: this.ctx.info(id), created: true };
    });
  }
}

/** A create from a snapshot runs its snapshot's template: naming a template in the same body is refused, never ignored. */
function refuseOtherTemplate(body: unknown): void {
  if (typeof body === "object" && body !== null && "template" in body)
    throw new BothyError(
      "invalid_request",
      `A sandbox from a snapshot runs the snapshot's template: leave out "template" when you give "snapshot".`,
    );
}
