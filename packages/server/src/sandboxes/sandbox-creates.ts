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
  admit?: (size: { vcpu: number; memoryMib: number }) => Promise<void> | void;
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
  /**
   * Admission, one create at a time: from the capacity and quota checks to the row's insert and
   * the create's start on its actor (which counts it against the host's limit), with ledger reads
   * and writes awaited between, so two creates cannot both pass the checks for the last slot.
   */
  private admitting: Promise<void> = Promise.resolve();

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
    // Noted as in flight before the ledger is read: a second request with the key, sent at once, joins this one.
    const job = (async (): Promise<CreateResult> => {
      const known = await this.ctx.ledger.findIdempotencyKey(owner.tenant, idempotencyKey);
      if (known) {
        if (known.fingerprint !== fingerprint) throw reused();
        const row = await this.ctx.ledger.getSandbox(known.sandbox_id);
        if (row) return { sandbox: await this.ctx.view(row), created: false };
      }
      try {
        return await this.createNew(req, { key: idempotencyKey, fingerprint }, owner);
      } catch (err) {
        // Another node of a cluster wrote this key's row first (it is the shared database's, one per
        // tenant and key, so this create's insert was refused and wrote nothing): its sandbox is the answer.
        const other = await this.ctx.ledger.findIdempotencyKey(owner.tenant, idempotencyKey).catch(() => undefined);
        const row = other && (await this.ctx.ledger.getSandbox(other.sandbox_id));
        if (!other || !row) throw err;
        if (other.fingerprint !== fingerprint) throw reused();
        return { sandbox: await this.ctx.view(row), created: false };
      }
    })();
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
  private async snapshotOf(ref: string, tenant: string, driver: string | undefined): Promise<SnapshotRow> {
    const row = await tenantSnapshot(this.ctx.ledger.snapshots, tenant, ref);
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
    const snapshot =
      req.snapshot === undefined ? undefined : await this.snapshotOf(req.snapshot, owner.tenant, req.driver);
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
    if ((req.volumes ?? []).length > 0 && !this.ctx.volumes)
      throw new BothyError("not_supported", "This server has no volumes; create the sandbox without `volumes`.");
    const { job } = await this.admit(() =>
      this.admitted(req, idem, owner, { snapshot, template, driver, lifetime, started, diskMib, maxProcesses }),
    );
    return job;
  }

  /** Runs `f` once the admissions before it have ended (see `admitting`). */
  private admit<T>(f: () => Promise<T>): Promise<T> {
    const run = this.admitting.then(f);
    this.admitting = run.then(
      () => undefined,
      () => undefined,
    );
    return run;
  }

  /**
   * A create's checks, its rows, and its start on the actor, under the admission: returns the
   * create's job (wrapped, so the admission ends when the job starts, not when it ends).
   */
  private async admitted(
    req: CreateRequest,
    idem: { key: string; fingerprint: string } | undefined,
    owner: CreateOwner,
    c: {
      snapshot: SnapshotRow | undefined;
      template: BuiltTemplateRef;
      driver: Driver;
      lifetime: ReturnType<typeof lifetimeOf>;
      started: number;
      diskMib: number;
      maxProcesses: number;
    },
  ): Promise<{ job: Promise<CreateResult> }> {
    const { snapshot, template, driver, lifetime, started, diskMib, maxProcesses } = c;
    const shape = this.shape(
      template,
      { vcpu: req.vcpu, memoryMib: req.memory_mib, diskMib, maxProcesses },
      driver,
      snapshot,
    );
    const network = await networkPolicy(req, owner.tenant, this.ctx.config.network, this.ctx.policies);
    const mounts = req.volumes ?? [];
    // Pool sandboxes were made with the default posture and no volumes; any other create boots its
    // own. One from a snapshot takes only a sandbox booted from that snapshot (the shape names it).
    const poolable = isDefaultPolicy(network.egress) && !network.egress.gateway && mounts.length === 0;
    // A claim from the pool takes no more of the host; any other create needs room, a pool
    // sandbox giving up its own when the host is full.
    if (!(poolable && this.ctx.pool.hasReady(shape)) && !this.ctx.makeRoom()) {
      throw new BothyError(
        "capacity_exhausted",
        `This host runs at most ${this.ctx.config.limits.maxSandboxes} sandboxes; delete one or raise BOTHY_MAX_SANDBOXES.`,
      );
    }
    await owner.admit?.({ vcpu: req.vcpu, memoryMib: req.memory_mib });
    const secrets = req.secrets ?? [];
    // Before anything is made: a create naming a secret the vault lacks makes nothing.
    if (secrets.length > 0) await this.ctx.gateway?.vault.requireAll(owner.tenant, secrets);
    // Checked before the row, claimed right after it: other creates wait for the admission.
    const id0 = newSandboxId();
    const claims0 = await this.ctx.volumes?.claimsFor(owner.tenant, id0, driver.name, mounts);
    // Looked up again right before the insert.
    if (snapshot) await this.snapshotOf(snapshot.id, owner.tenant, undefined);
    // The pool is claimed last, right before the insert: a check that refuses leaves the pool as it was.
    const warm = poolable ? this.ctx.pool.claim(shape) : undefined;
    const id = warm?.spec.id ?? id0;
    const claims = (claims0 ?? []).map((claim) => ({ ...claim, sandbox_id: id }));
    // The create's operation starts now, before its rows are written: from the row's first moment
    // the sandbox is this process's (the sweeper leaves it alone) and counts against the host.
    let written!: () => void;
    const rowsWritten = new Promise<void>((resolve) => (written = resolve));
    const job = this.ctx.actor.run(id, "create", async (move): Promise<CreateResult> => {
      await this.ctx.ledger.insertSandbox(
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
      // Right after the row: its expiry is at least a second away (a timeout is whole seconds).
      if (lifetime.onTimeout !== "delete" || !lifetime.autoWake)
        await this.ctx.ledger.lifecycle.put({
          sandbox_id: id,
          on_timeout: lifetime.onTimeout,
          auto_wake: lifetime.autoWake ? 1 : 0,
          timeout_s: lifetime.timeoutS,
          asleep_by: null,
        });
      await this.ctx.volumes?.commitClaims(claims);
      if (snapshot) await this.ctx.ledger.snapshots.addUse(id, snapshot.id);
      if (secrets.length > 0) await this.ctx.gateway?.vault.bindSandbox(owner.tenant, id, secrets);
      written();
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
          await this.ctx.bootSpec(
            id,
            template,
            { vcpu: req.vcpu, memoryMib: req.memory_mib, diskMib, maxProcesses },
            network.egress,
          ),
          this.ctx.config.bootTimeoutMs,
        );
      } catch (err) {
        const e = toCreateFailure(err);
        await move("creating", "failed", e.message);
        if (idem) await this.ctx.ledger.forgetIdempotencyKey(owner.tenant, idem.key);
        this.ctx.log("sandbox_create_failed", { sandbox_id: id, error: describeCauses(err) });
        throw e;
      }
      try {
        if (!warm) await move("creating", "running");
      } catch (err) {
        await booted.handle.destroy();
        if (idem) await this.ctx.ledger.forgetIdempotencyKey(owner.tenant, idem.key);
        throw err;
      }
      this.held.adopt(booted);
      // A sandbox's time counts from when it runs, not from a boot that may have been slow.
      if (!warm) await this.ctx.ledger.setExpiresAt(id, expiryFrom(lifetime.timeoutS));
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
      return { sandbox: await this.ctx.info(id), created: true };
    });
    // The admission ends once the rows are written (the quota then counts them), or with the failure.
    await Promise.race([rowsWritten, job.then(() => undefined)]);
    return { job };
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
