/**
 * What a token made for a caller (an E2B access token, a signed link) is bound to, so that it
 * ends with the caller's key: the key's id for an API key; `none` when authentication is off
 * (and such a token is refused once the server runs with keys); for the agent tools' in-memory
 * keys, their tenant in this process (they end with it, as those keys do). Every use of a token
 * asks `holds`, which reads the key's row: a revoked or expired key's tokens stop at once.
 */
import { BothyError, KEY_ID_RE } from "@bothy/protocol";
import type { LedgerStore } from "../ledger/store.ts";
import { sees } from "./auth-hooks.ts";
import { type KeyRing, NO_AUTH_PRINCIPAL, type Principal } from "./key-ring.ts";
import { hasScope, type Scope } from "./scopes.ts";

const NONE = "none";

export class KeyBindings {
  constructor(
    private readonly ring: KeyRing,
    private readonly ledger: LedgerStore,
    private readonly mode: "keys" | "none",
  ) {}

  /** The binding of a token made for this principal. */
  of(principal: Principal): string {
    if (principal.keyId !== null) return principal.keyId;
    if (principal === NO_AUTH_PRINCIPAL) return NONE;
    const service = this.ring.serviceBinding(principal);
    if (service === undefined) throw new BothyError("internal", "A principal without a key has no token binding.");
    return service;
  }

  private async holder(binding: string, now: number): Promise<Principal | undefined> {
    if (KEY_ID_RE.test(binding)) return this.ring.holder(binding, now);
    if (binding === NONE) return this.mode === "none" ? NO_AUTH_PRINCIPAL : undefined;
    return this.ring.serviceHolder(binding);
  }

  /** Whether the binding's key is current, sees the sandbox's tenant and has every one of `scopes`. */
  async holds(binding: string, sandboxId: string, scopes: readonly Scope[], now = Date.now()): Promise<boolean> {
    const principal = await this.holder(binding, now);
    return principal !== undefined && allows(principal, await this.ledger.auth.sandboxTenant(sandboxId), scopes);
  }

  /** Every (sandbox, binding) pair among `sandboxIds` a current key could have a token for with `scopes`. */
  async candidates(
    sandboxIds: readonly string[],
    scopes: readonly Scope[],
    now = Date.now(),
  ): Promise<Array<{ sandboxId: string; binding: string }>> {
    const holders: Array<{ binding: string; principal: Principal }> = [
      ...(await this.ring.holders(now)).map((principal) => ({ binding: principal.keyId ?? "", principal })),
      ...this.ring.serviceBindings(),
      ...(this.mode === "none" ? [{ binding: NONE, principal: NO_AUTH_PRINCIPAL }] : []),
    ];
    const tenants = await Promise.all(sandboxIds.map((sandboxId) => this.ledger.auth.sandboxTenant(sandboxId)));
    return sandboxIds.flatMap((sandboxId, i) =>
      holders.filter((h) => allows(h.principal, tenants[i], scopes)).map((h) => ({ sandboxId, binding: h.binding })),
    );
  }
}

function allows(principal: Principal, tenant: string | undefined, scopes: readonly Scope[]): boolean {
  return tenant !== undefined && sees(principal, tenant) && scopes.every((s) => hasScope(principal.scopes, s));
}
