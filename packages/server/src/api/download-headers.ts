/**
 * Headers for a file's bytes read out of a sandbox and served on the API's own origin
 * (`GET /sandboxes/{id}/files`, E2B's `/files` and its signed URLs). What a sandbox wrote is the
 * sandbox's to choose: an HTML or SVG file opened in a browser must not run as the API's origin,
 * so it is a download (`attachment`), never sniffed into a type that renders, and even if it were
 * shown, a CSP `sandbox` makes it an opaque origin without scripts.
 */
export const SANDBOX_FILE_HEADERS = {
  "content-disposition": "attachment",
  "content-security-policy": "sandbox",
  "x-content-type-options": "nosniff",
} as const;
