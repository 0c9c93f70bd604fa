/**
 * API keys (scope keys:manage): the list, a new key (shown once, here only: the server keeps a
 * digest), and revoke. A key mints only within its own scopes, so the form offers only those.
 */
import { API_SCOPES, type ApiKeyInfo } from "@bothy/protocol";
import { useCallback, useEffect, useState } from "preact/hooks";
import { ApiError, getJson, sendJson } from "../api.ts";
import type { PageProps } from "../app.tsx";
import { ScrollBox } from "../components/scroll-box.tsx";

type Scope = (typeof API_SCOPES)[number];

export function KeysPage({ can }: PageProps) {
  const [keys, setKeys] = useState<ApiKeyInfo[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [name, setName] = useState("");
  const [scopes, setScopes] = useState<Set<Scope>>(new Set(["sandboxes:read"]));
  const [made, setMade] = useState<{ id: string; key: string } | null>(null);
  const fail = (err: unknown): void => setError(err instanceof ApiError ? err.message : String(err));
  const load = useCallback(() => {
    getJson<{ keys: ApiKeyInfo[] }>("/keys")
      .then((r) => {
        setKeys(r.keys);
        setError(null);
      })
      .catch(fail);
  }, []);
  useEffect(load, [load]);
  const create = async (ev: Event): Promise<void> => {
    ev.preventDefault();
    try {
      const key = await sendJson<ApiKeyInfo & { key: string }>("POST", "/keys", {
        name: name || "unnamed",
        scopes: [...scopes],
      });
      setMade({ id: key.key_id, key: key.key });
      setName("");
      load();
    } catch (err) {
      fail(err);
    }
  };
  const revoke = async (id: string): Promise<void> => {
    try {
      await sendJson("DELETE", `/keys/${id}`);
      load();
    } catch (err) {
      fail(err);
    }
  };
  const offered = API_SCOPES.filter((s) => can(s));
  return (
    <>
      <h1>Keys</h1>
      {error !== null && (
        <p role="alert" class="error">
          {error}
        </p>
      )}
      <form class="create" aria-label="Create a key" onSubmit={(ev) => void create(ev)}>
        <label>
          Name
          <input name="name" value={name} onInput={(ev) => setName((ev.target as HTMLInputElement).value)} />
        </label>
        <fieldset class="scopes">
          <legend>Scopes</legend>
          {offered.map((s) => (
            <label key={s} class="check">
              <input
                type="checkbox"
                checked={scopes.has(s)}
                onChange={(ev) => {
                  const next = new Set(scopes);
                  if ((ev.target as HTMLInputElement).checked) next.add(s);
                  else next.delete(s);
                  setScopes(next);
                }}
              />
              {s}
            </label>
          ))}
        </fieldset>
        <button type="submit" disabled={scopes.size === 0}>
          Create key
        </button>
      </form>
      {made !== null && (
        <div class="made" role="status">
          <p>The new key {made.id}, shown this once (the server keeps only a digest): copy it now.</p>
          <output class="secret-once" aria-label="New key">
            {made.key}
          </output>
          <button type="button" class="quiet" onClick={() => setMade(null)}>
            Done
          </button>
        </div>
      )}
      <ScrollBox label="Keys">
        <table class="list">
          <thead>
            <tr>
              <th scope="col">Key</th>
              <th scope="col">Name</th>
              <th scope="col">Tenant</th>
              <th scope="col">Scopes</th>
              <th scope="col">Last used</th>
              <th scope="col">State</th>
            </tr>
          </thead>
          <tbody>
            {(keys ?? []).map((k) => (
              <tr key={k.key_id} data-key={k.key_id}>
                <td>
                  {k.key_id} <span class="status">{k.display}</span>
                </td>
                <td>{k.name}</td>
                <td>{k.tenant}</td>
                <td>{k.scopes.join(" ")}</td>
                <td>{k.last_used_at ?? "never"}</td>
                <td>
                  {k.revoked_at !== null ? (
                    "revoked"
                  ) : (
                    <button type="button" class="danger" onClick={() => void revoke(k.key_id)}>
                      Revoke {k.name}
                    </button>
                  )}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      </ScrollBox>
    </>
  );
}
