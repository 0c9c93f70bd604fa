/**
 * Moving a file's bytes between the browser and a sandbox: an upload that reports its progress
 * (XMLHttpRequest's upload events: fetch has none for a request body), and a preview read that
 * stops after a bounded number of bytes, however large the file.
 */
import { ApiError, call, problemOf, sessionHeaders } from "../api.ts";

/** PUTs `file` to `path`, calling `progress` with the bytes sent so far and the total. */
export function uploadWithProgress(
  path: string,
  file: Blob,
  progress: (sent: number, total: number) => void,
): Promise<void> {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("PUT", path);
    for (const [name, value] of Object.entries(sessionHeaders())) xhr.setRequestHeader(name, value);
    xhr.setRequestHeader("content-type", "application/octet-stream");
    xhr.upload.onprogress = (ev) => progress(ev.loaded, ev.lengthComputable ? ev.total : file.size);
    xhr.onload = () => {
      if (xhr.status >= 200 && xhr.status < 300) {
        progress(file.size, file.size);
        resolve();
      } else reject(problemOf(xhr.responseText, xhr.status, xhr.statusText));
    };
    xhr.onerror = () => reject(new ApiError("The upload failed: the connection to the server was lost.", "unknown", 0));
    xhr.send(file);
  });
}

export interface Head {
  /** The first bytes of the file, at most the limit asked for. */
  bytes: Uint8Array<ArrayBuffer>;
  /** The file's whole size, as the server said. */
  size: number;
  /** The file has more than `bytes`. */
  cut: boolean;
}

/** Reads at most `limit` bytes of the answer to GET `path`, then cancels the rest of it. */
export async function readHead(path: string, limit: number): Promise<Head> {
  const res = await call("GET", path);
  const size = Number(res.headers.get("content-length") ?? "NaN");
  const reader = res.body!.getReader();
  const chunks: Uint8Array[] = [];
  let got = 0;
  let cut = false;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    const take = Math.min(value.length, limit - got);
    chunks.push(value.subarray(0, take));
    got += take;
    if (got >= limit) {
      // The server sends the file's length, so whether more follows is known without reading it.
      cut = take < value.length || size > got;
      await reader.cancel();
      break;
    }
  }
  const bytes = new Uint8Array(got);
  let at = 0;
  for (const c of chunks) {
    bytes.set(c, at);
    at += c.length;
  }
  return { bytes, size: Number.isFinite(size) ? size : got, cut };
}
