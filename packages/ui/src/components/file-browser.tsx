/**
 * A directory of the sandbox: listing, download (fetched with the session's token), a bounded
 * preview (file-preview.tsx) and upload with a progress bar.
 */
import type { DirEntry } from "@bothy/protocol";
import { useCallback, useEffect, useState } from "preact/hooks";
import { ApiError, download, getJson } from "../api.ts";
import { FilePreview } from "./file-preview.tsx";
import { uploadWithProgress } from "./file-transfer.ts";
import "./sandbox-parts.css";

const join = (dir: string, name: string): string => `${dir.replace(/\/$/, "")}/${name}`;

export function FileBrowser({ sandboxId, writable }: { sandboxId: string; writable: boolean }) {
  const [dir, setDir] = useState("/workspace");
  const [entries, setEntries] = useState<DirEntry[]>([]);
  const [message, setMessage] = useState<string | null>(null);
  /** The latest upload's progress, kept once done so its end can be seen. */
  const [progress, setProgress] = useState<{ name: string; sent: number; total: number; done: boolean } | null>(null);
  const [preview, setPreview] = useState<{ path: string; name: string } | null>(null);
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
      setMessage(null);
      setProgress({ name: file.name, sent: 0, total: file.size, done: false });
      try {
        await uploadWithProgress(`${base}?path=${encodeURIComponent(join(dir, file.name))}`, file, (sent, total) =>
          setProgress({ name: file.name, sent, total, done: false }),
        );
        setProgress({ name: file.name, sent: file.size, total: file.size, done: true });
      } catch (err) {
        setProgress(null);
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
          <label class="upload" data-focus-ring>
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
      {progress !== null && (
        <p class="upload-progress">
          <label for="upload-progress">
            {progress.done ? "Uploaded" : "Uploading"} {progress.name}
          </label>{" "}
          <progress id="upload-progress" max={progress.total || 1} value={progress.sent} />{" "}
          <span>
            {progress.sent} of {progress.total} bytes
          </span>
        </p>
      )}
      {message !== null && (
        <p role="status" class="hint">
          {message}
        </p>
      )}
      {preview !== null && (
        <FilePreview
          key={preview.path}
          path={`${base}?path=${encodeURIComponent(preview.path)}`}
          name={preview.name}
          onClose={() => setPreview(null)}
        />
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
            {e.type !== "dir" && (
              <button
                type="button"
                class="quiet"
                aria-label={`Preview ${e.name}`}
                onClick={() => setPreview({ path: join(dir, e.name), name: e.name })}
              >
                Preview
              </button>
            )}
          </li>
        ))}
      </ul>
    </section>
  );
}
