/** Reads a streamed body up to and including `text`, leaving the rest unread. */
export async function readUntil(reader: ReadableStreamDefaultReader<Uint8Array>, text: string): Promise<string> {
  let seen = "";
  while (!seen.includes(text)) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`stream ended before "${text}"; got ${JSON.stringify(seen)}`);
    seen += Buffer.from(value).toString("utf8");
  }
  return seen;
}
