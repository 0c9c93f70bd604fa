/**
 * The tenant's default host policy (GET /policy for any key; saving and removing need scope
 * policy): rules in order (host pattern, methods, path, allow/deny/ask), the allow and deny
 * lists, and what happens otherwise. An admin key picks the tenant. Tool rules are kept as
 * they are (shown, not edited here).
 */
import type { EgressAction, HostRule, TenantPolicyInfo } from "@bothy/protocol";
import { useEffect, useState } from "preact/hooks";
import { getJson, sendJson } from "../api.ts";
import type { PageProps } from "../app.tsx";
import { ErrorLine, useLoad } from "../use-load.tsx";
import { ScrollBox } from "../components/scroll-box.tsx";

const ACTIONS: readonly EgressAction[] = ["allow", "deny", "ask"];
type Policy = NonNullable<TenantPolicyInfo["policy"]>;
interface RuleDraft {
  host: string;
  methods: string;
  path: string;
  action: EgressAction;
}
interface Draft {
  rules: RuleDraft[];
  allow: string;
  deny: string;
  /** "" leaves `default` out: the server then derives it. */
  fallback: EgressAction | "";
}

const words = (s: string): string[] => s.split(/[\s,]+/).filter(Boolean);
const draftOf = (p: Policy | null): Draft => ({
  rules: (p?.rules ?? []).map((r) => ({
    host: r.host,
    methods: r.methods?.join(" ") ?? "",
    path: r.path ?? "",
    action: r.action,
  })),
  allow: (p?.allow_hosts ?? []).join("\n"),
  deny: (p?.deny_hosts ?? []).join("\n"),
  fallback: p?.default ?? "",
});

function policyOf(d: Draft, tools: Policy["tools"]): Policy {
  const rules: HostRule[] = d.rules.map((r) => ({
    host: r.host.trim(),
    action: r.action,
    ...(words(r.methods).length > 0 ? { methods: words(r.methods.toUpperCase()) } : {}),
    ...(r.path.trim() !== "" ? { path: r.path.trim() } : {}),
  }));
  return {
    ...(rules.length > 0 ? { rules } : {}),
    ...(words(d.allow).length > 0 ? { allow_hosts: words(d.allow) } : {}),
    ...(words(d.deny).length > 0 ? { deny_hosts: words(d.deny) } : {}),
    ...(d.fallback !== "" ? { default: d.fallback } : {}),
    ...(tools !== undefined ? { tools } : {}),
  };
}

export function PolicyPage({ session, can }: PageProps) {
  const [tenant, setTenant] = useState(session.tenant);
  const tenants = useLoad(
    () =>
      can("admin")
        ? getJson<{ tenants: Array<{ tenant: string }> }>("/tenants").then((r) => r.tenants.map((t) => t.tenant))
        : Promise.resolve([session.tenant]),
    [],
  );
  const q = `/policy?tenant=${encodeURIComponent(tenant)}`;
  const policy = useLoad(() => getJson<TenantPolicyInfo>(q), [q]);
  const [draft, setDraft] = useState<Draft>(draftOf(null));
  const [done, setDone] = useState<string | null>(null);
  // The form takes the stored policy when a tenant's is first read, not on the reload after a
  // save: that would drop what was typed meanwhile.
  const [draftTenant, setDraftTenant] = useState<string | null>(null);
  useEffect(() => {
    if (policy.data === null || policy.data.tenant !== tenant || draftTenant === tenant) return;
    setDraft(draftOf(policy.data.policy));
    setDraftTenant(tenant);
  }, [policy.data, tenant]);
  const editable = can("policy");
  const setRule = (i: number, patch: Partial<RuleDraft>): void =>
    setDraft({ ...draft, rules: draft.rules.map((r, j) => (j === i ? { ...r, ...patch } : r)) });
  const save = async (ev: Event): Promise<void> => {
    ev.preventDefault();
    try {
      await sendJson("PUT", q, policyOf(draft, policy.data?.policy?.tools));
      setDone(`Saved: ${tenant}'s sandboxes' next requests are judged by it.`);
      policy.reload();
    } catch (err) {
      policy.fail(err);
    }
  };
  const remove = async (): Promise<void> => {
    try {
      await sendJson("DELETE", q);
      setDraft(draftOf(null));
      setDone(`Removed ${tenant}'s default policy.`);
      policy.reload();
    } catch (err) {
      policy.fail(err);
    }
  };
  const tools = Object.entries(policy.data?.policy?.tools ?? {});
  return (
    <>
      <h1>Host policy</h1>
      <p class="hint">
        The tenant's rules come before every one of its sandboxes' own: the first rule that matches a request decides
        it, then the deny list, then the allow list, then the default.
      </p>
      {(tenants.data?.length ?? 0) > 1 && (
        <div class="toolbar">
          <label for="policy-tenant">Tenant</label>
          <select
            id="policy-tenant"
            value={tenant}
            onChange={(ev) => setTenant((ev.target as HTMLSelectElement).value)}
          >
            {tenants.data!.map((t) => (
              <option key={t} value={t}>
                {t}
              </option>
            ))}
          </select>
        </div>
      )}
      <ErrorLine error={policy.error ?? tenants.error} />
      {done !== null && <p role="status">{done}</p>}
      {policy.data !== null && policy.data.policy === null && (
        <p data-policy="none">{tenant} has no default policy: its sandboxes' own rules alone decide.</p>
      )}
      <form class="policy" aria-label={`Default policy of ${tenant}`} onSubmit={(ev) => void save(ev)}>
        <fieldset disabled={!editable}>
          <legend>Rules, in order</legend>
          <ScrollBox label="Rules">
            <table class="rules">
              <thead>
                <tr>
                  <th scope="col">Host pattern</th>
                  <th scope="col">Methods</th>
                  <th scope="col">Path prefix</th>
                  <th scope="col">Action</th>
                  {editable && <th scope="col">Remove</th>}
                </tr>
              </thead>
              <tbody>
                {draft.rules.map((r, i) => (
                  <tr key={i} data-rule={i}>
                    <td>
                      <input
                        aria-label={`Rule ${i + 1} host`}
                        required
                        placeholder="*.example.com"
                        value={r.host}
                        onInput={(ev) => setRule(i, { host: (ev.target as HTMLInputElement).value })}
                      />
                    </td>
                    <td>
                      <input
                        aria-label={`Rule ${i + 1} methods`}
                        placeholder="any"
                        size={8}
                        value={r.methods}
                        onInput={(ev) => setRule(i, { methods: (ev.target as HTMLInputElement).value })}
                      />
                    </td>
                    <td>
                      <input
                        aria-label={`Rule ${i + 1} path`}
                        placeholder="any"
                        size={10}
                        value={r.path}
                        onInput={(ev) => setRule(i, { path: (ev.target as HTMLInputElement).value })}
                      />
                    </td>
                    <td>
                      <select
                        aria-label={`Rule ${i + 1} action`}
                        value={r.action}
                        onChange={(ev) =>
                          setRule(i, { action: (ev.target as HTMLSelectElement).value as EgressAction })
                        }
                      >
                        {ACTIONS.map((a) => (
                          <option key={a}>{a}</option>
                        ))}
                      </select>
                    </td>
                    {editable && (
                      <td>
                        <button
                          type="button"
                          class="quiet"
                          onClick={() => setDraft({ ...draft, rules: draft.rules.filter((_, j) => j !== i) })}
                        >
                          Remove rule {i + 1}
                        </button>
                      </td>
                    )}
                  </tr>
                ))}
              </tbody>
            </table>
          </ScrollBox>
          {editable && (
            <button
              type="button"
              class="quiet"
              onClick={() =>
                setDraft({ ...draft, rules: [...draft.rules, { host: "", methods: "", path: "", action: "ask" }] })
              }
            >
              Add rule
            </button>
          )}
        </fieldset>
        <fieldset disabled={!editable} class="lists">
          <legend>Lists and default</legend>
          <label>
            Deny hosts (one a line)
            <textarea
              rows={3}
              value={draft.deny}
              onInput={(ev) => setDraft({ ...draft, deny: (ev.target as HTMLTextAreaElement).value })}
            />
          </label>
          <label>
            Allow hosts (one a line)
            <textarea
              rows={3}
              value={draft.allow}
              onInput={(ev) => setDraft({ ...draft, allow: (ev.target as HTMLTextAreaElement).value })}
            />
          </label>
          <label>
            Otherwise
            <select
              value={draft.fallback}
              onChange={(ev) =>
                setDraft({ ...draft, fallback: (ev.target as HTMLSelectElement).value as Draft["fallback"] })
              }
            >
              <option value="">(deny if anything is allowed, else allow)</option>
              {ACTIONS.map((a) => (
                <option key={a}>{a}</option>
              ))}
            </select>
          </label>
        </fieldset>
        {tools.length > 0 && <p>Tool rules (kept as they are): {tools.map(([t, a]) => `${t}: ${a}`).join(", ")}.</p>}
        {editable ? (
          <div class="actions">
            <button type="submit">Save policy</button>
            {policy.data?.policy != null && (
              <button type="button" class="danger" onClick={() => void remove()}>
                Remove policy
              </button>
            )}
          </div>
        ) : (
          <p class="hint">This key lacks the policy scope: it can read the policy, not change it.</p>
        )}
      </form>
    </>
  );
}
