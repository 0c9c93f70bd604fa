/**
 * A file of the sandbox shown in the page, bounded: text up to TEXT_PREVIEW_BYTES (and says when
 * it is cut), images up to IMAGE_PREVIEW_BYTES. A sandbox's file is the sandbox's to write, so
 * nothing in it may run on the dashboard's origin: HTML (and anything else not an image) is shown
 * as text, never parsed as a document; an image, SVG included, is an <img> of a blob with the
 * image's own type, in which a browser runs no script.
 */
import { useEffect, useState } from "preact/hooks";
import { ApiError } from "../api.ts";
import { readHead } from "./file-transfer.ts";

export const TEXT_PREVIEW_BYTES = 64 * 1024;
export const IMAGE_PREVIEW_BYTES = 4 * 1024 * 1024;

/** Image types by extension: only these become an <img>. */
const IMAGE_TYPES: Record<string, string> = {
  png: "image/png",
  jpg: "image/jpeg",
  jpeg: "image/jpeg",
  gif: "image/gif",
  webp: "image/webp",
  svg: "image/svg+xml",
};

type Shown =
  | { kind: "loading" }
  | { kind: "text"; text: string; cut: boolean; size: number }
  | { kind: "image"; url: string; size: number }
  | { kind: "note"; text: string };

function imageTypeOf(name: string): string | undefined {
  const ext = /\.([A-Za-z0-9]+)$/.exec(name)?.[1]?.toLowerCase();
  return ext === undefined ? undefined : IMAGE_TYPES[ext];
}

/** Text that holds a NUL byte is taken for binary: shown as such it would be noise. */
function looksBinary(bytes: Uint8Array): boolean {
  return bytes.subarray(0, 8192).includes(0);
}

export function FilePreview({ path, name, onClose }: { path: string; name: string; onClose: () => void }) {
  const [shown, setShown] = useState<Shown>({ kind: "loading" });
  useEffect(() => {
    let url: string | undefined;
    let gone = false;
    const type = imageTypeOf(name);
    readHead(path, type ? IMAGE_PREVIEW_BYTES : TEXT_PREVIEW_BYTES)
      .then((head) => {
        if (gone) return;
        if (type && head.cut)
          setShown({ kind: "note", text: `${name} is ${head.size} bytes: too large to preview; download it.` });
        else if (type) {
          url = URL.createObjectURL(new Blob([head.bytes], { type }));
          setShown({ kind: "image", url, size: head.size });
        } else if (looksBinary(head.bytes))
          setShown({ kind: "note", text: `${name} is binary (${head.size} bytes); download it to open it.` });
        else
          setShown({
            kind: "text",
            text: new TextDecoder().decode(head.bytes),
            cut: head.cut,
            size: head.size,
          });
      })
      .catch((err: unknown) => {
        if (!gone) setShown({ kind: "note", text: err instanceof ApiError ? err.message : String(err) });
      });
    return () => {
      gone = true;
      if (url !== undefined) URL.revokeObjectURL(url);
    };
  }, [path, name]);
  return (
    <div class="file-preview" aria-label={`Preview of ${name}`} role="region">
      <p>
        Preview of <code>{path}</code>{" "}
        <button type="button" class="quiet" onClick={onClose}>
          Close preview
        </button>
      </p>
      {shown.kind === "loading" && <p>Loading…</p>}
      {shown.kind === "note" && <p class="hint">{shown.text}</p>}
      {shown.kind === "image" && <img src={shown.url} alt={`${name} (${shown.size} bytes)`} />}
      {shown.kind === "text" && (
        <>
          {shown.cut && (
            <p class="hint" data-cut>
              Showing the first {TEXT_PREVIEW_BYTES / 1024} KiB of {shown.size} bytes; download the file for the rest.
            </p>
          )}
          <pre tabIndex={0}>{shown.text}</pre>
        </>
      )}
    </div>
  );
}
