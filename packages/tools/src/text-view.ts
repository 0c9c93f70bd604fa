/** How sandbox content is shown to a model: numbered lines, middle truncation, media types. */

/** Lines longer than this are cut in a read (and the read no longer counts as whole). */
export const MAX_LINE_CHARS = 2000;
/** A read shows at most this many lines at once. */
export const MAX_READ_LINES = 2000;
/** ...and at most this many characters. */
export const MAX_READ_CHARS = 100_000;

export interface NumberedView {
  text: string;
  /** 1-based, inclusive; 0/0 for an empty file. */
  first: number;
  last: number;
  totalLines: number;
  /** Whether every line of the file was shown uncut. */
  whole: boolean;
}

/** Splits text into lines as an editor counts them (a final newline does not start a line). */
export function splitLines(text: string): string[] {
  if (text === "") return [];
  const lines = text.split("\n");
  if (lines[lines.length - 1] === "") lines.pop();
  return lines;
}

/** `cat -n` style lines from `start` to `end` (1-based, inclusive), within the read limits. */
export function numberedLines(text: string, start = 1, end?: number): NumberedView {
  const lines = splitLines(text);
  const totalLines = lines.length;
  const first = Math.max(1, start);
  let last = Math.min(end ?? totalLines, totalLines, first + MAX_READ_LINES - 1);
  const out: string[] = [];
  let chars = 0;
  let cut = false;
  for (let n = first; n <= last; n++) {
    let line = lines[n - 1] ?? "";
    if (line.length > MAX_LINE_CHARS) {
      line = `${line.slice(0, MAX_LINE_CHARS)}… [line cut at ${MAX_LINE_CHARS} of ${line.length} characters]`;
      cut = true;
    }
    const row = `${String(n).padStart(6)}\t${line}`;
    if (chars + row.length > MAX_READ_CHARS && out.length > 0) {
      last = n - 1;
      break;
    }
    out.push(row);
    chars += row.length + 1;
  }
  if (totalLines === 0) return { text: "", first: 0, last: 0, totalLines, whole: true };
  return { text: out.join("\n"), first, last, totalLines, whole: first === 1 && last === totalLines && !cut };
}

/**
 * Keeps the head and tail of a long output and counts what was dropped between them, so a
 * command that prints megabytes shows its beginning and its end (where errors usually are).
 */
export class MiddleTruncator {
  private head = "";
  private tail = "";
  private dropped = 0;

  constructor(
    private readonly headChars = 15_000,
    private readonly tailChars = 15_000,
  ) {}

  push(text: string): void {
    if (this.head.length < this.headChars) {
      const room = this.headChars - this.head.length;
      this.head += text.slice(0, room);
      text = text.slice(room);
    }
    if (text === "") return;
    this.tail += text;
    if (this.tail.length > this.tailChars) {
      const excess = this.tail.length - this.tailChars;
      this.dropped += excess;
      this.tail = this.tail.slice(excess);
    }
  }

  get omitted(): number {
    return this.dropped;
  }

  toString(): string {
    if (this.dropped === 0) return this.head + this.tail;
    return `${this.head}\n[… ${this.dropped} characters omitted from the middle of the output. To see them, rerun with the output redirected to a file (cmd > out.txt 2>&1) and read parts of it with computer_read_file (start_line/end_line), or filter it with grep, head or tail …]\n${this.tail}`;
  }
}

/** Cuts the middle of a single long text, with the same notice. */
export function truncateMiddle(text: string, headChars = 15_000, tailChars = 15_000): string {
  const t = new MiddleTruncator(headChars, tailChars);
  t.push(text);
  return t.toString();
}

const IMAGE_MAGIC: Array<[string, (b: Buffer) => boolean]> = [
  [
    "image/png",
    (b) => b.length >= 8 && b.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])),
  ],
  ["image/jpeg", (b) => b.length >= 3 && b[0] === 0xff && b[1] === 0xd8 && b[2] === 0xff],
  [
    "image/gif",
    (b) => b.subarray(0, 6).toString("latin1") === "GIF87a" || b.subarray(0, 6).toString("latin1") === "GIF89a",
  ],
  [
    "image/webp",
    (b) => b.subarray(0, 4).toString("latin1") === "RIFF" && b.subarray(8, 12).toString("latin1") === "WEBP",
  ],
];

/** The image type the bytes really are (by magic number, not by name), if any. */
export function imageType(head: Buffer): string | undefined {
  return IMAGE_MAGIC.find(([, test]) => test(head))?.[0];
}

const BY_EXTENSION: Record<string, string> = {
  png: "image/png",
  jpg: "image/jpeg",
  jpeg: "image/jpeg",
  gif: "image/gif",
  webp: "image/webp",
  svg: "image/svg+xml",
  pdf: "application/pdf",
  csv: "text/csv",
  txt: "text/plain",
  md: "text/markdown",
  json: "application/json",
  html: "text/html",
  xlsx: "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
  docx: "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
  pptx: "application/vnd.openxmlformats-officedocument.presentationml.presentation",
  zip: "application/zip",
  mp4: "video/mp4",
  mp3: "audio/mpeg",
  wav: "audio/wav",
};

/** A media type from the bytes' magic number, else the name's extension, else octet-stream. */
export function mediaTypeOf(name: string, head: Buffer): string {
  const image = imageType(head);
  if (image) return image;
  if (head.subarray(0, 5).toString("latin1") === "%PDF-") return "application/pdf";
  const ext = name.toLowerCase().split(".").pop() ?? "";
  return BY_EXTENSION[ext] ?? (isBinary(head) ? "application/octet-stream" : "text/plain");
}

/** A NUL byte in the first 8 KiB marks a file as binary, as git and grep decide. */
export function isBinary(head: Buffer): boolean {
  return head.subarray(0, 8192).includes(0);
}
