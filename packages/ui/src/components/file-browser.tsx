/** A directory of the sandbox: listing, download (a link the cookie authenticates) and upload. */
import type { DirEntry } from "@bothy/protocol";
import { useCallback, useEffect, useState } from "preact/hooks";
import { ApiError, call, download, getJson } from "../api.ts";

const join = (dir: string, name: string): string => `${dir.replace(/\/$/, "")}/${name}`;

export function FileBrowser({ sandboxId, writable }: { sandboxId: string; writable: boolean }) {
  const [dir, setDir] = useState("/workspace");
  const [entries, setEntries] = useState<DirEntry[]>([]);
  const [message, setMessage] = useState<string | null>(null);
  const base = `/sandboxes/${sandboxId}/files`;
  const load = useCallback(() => {
    getJson<{ entries: DirEntry[] }>(`${base}/list?path=${encodeURIComponent(dir)}`)
      .then((r) => {
        setEntries([...r.entries].sort((a, b) => a.name.localeCompare(b.name)));
        setMessage(null);
      })
      .catch((err: unknown) => setMessage(err instanceof ApiError ? err.message : String(err)));
  }, [base, dir]);
  useEffect(load, [load]);
  const upload = async (files: FileList | null): Promise<void> => {
    for (const file of Array.from(files ?? [])) {
      setMessage(`Uploading ${file.name}…`);
      try {
        await call("PUT", `${base}?path=${encodeURIComponent(join(dir, file.name))}`, file);
        setMessage(`Uploaded ${file.name}.`);
      } catch (err) {
        setMessage(err instanceof ApiError ? err.message : String(err));
      }
    }
    load();
  };
  const up = dir === "/" ? undefined : dir.replace(/\/[^/]+\/?$/, "") || "/";
  return (
    <section aria-label="Files">
      <h2>Files</h2>
      <div class="toolbar">
        <span class="path">{dir}</span>
        {up !== undefined && (
          <button type="button" class="quiet" onClick={() => setDir(up)}>
            Up
          </button>
        )}
        {writable && (
          <label class="upload">
            Upload
            <input
              type="file"
              name="upload"
              multiple
              onChange={(ev) => void upload((ev.target as HTMLInputElement).files)}
            />
          </label>
        )}
      </div>
      {message !== null && (
        <p role="status" class="hint">
          {message}
        </p>
      )}
      <ul class="files">
        {entries.map((e) => (
          <li key={e.name}>
            {e.type === "dir" ? (
              <button type="button" class="link" onClick={() => setDir(join(dir, e.name))}>
                {e.name}/
              </button>
            ) : (
              <button
                type="button"
                class="link"
                onClick={() =>
                  void download(`${base}?path=${encodeURIComponent(join(dir, e.name))}`, e.name).catch((err: unknown) =>
                    setMessage(err instanceof ApiError ? err.message : String(err)),
                  )
                }
              >
                {e.name}
              </button>
            )}
            <span class="size">{e.type === "dir" ? "" : `${e.size} B`}</span>
          </li>
        ))}
      </ul>
    </section>
  );
}
