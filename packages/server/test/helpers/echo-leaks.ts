/** What an attacker reading a scrubbed response can still recover of a secret's value. */

/**
 * What an upstream's echo gives back of `value` after the scrubber: any 4 bytes of the value in
 * a row, as they are or in any maximal run of base64 characters decoded from each of its four
 * character offsets in both alphabets (the attacker reads as much as it can out of what is left).
 */
export function recoverable(text: string, value: string, placeholder: string): string[] {
  // The placeholder is the sandbox's own and stands where the value was: it is not read as text around it.
  return text.split(placeholder).flatMap((part) => readable(part, value));
}

function readable(text: string, value: string): string[] {
  const raw = Buffer.from(value);
  const pieces = new Set<string>();
  for (let i = 0; i + 4 <= raw.length; i++) pieces.add(raw.subarray(i, i + 4).toString("latin1"));
  const found: string[] = [];
  for (const piece of pieces) if (text.includes(piece)) found.push(`raw: ${piece}`);
  for (const run of text.match(/[A-Za-z0-9+/_-]{4,}/g) ?? [])
    for (let shift = 0; shift < 4; shift++) {
      const decoded = Buffer.from(run.slice(shift).replace(/-/g, "+").replace(/_/g, "/"), "base64").toString("latin1");
      for (const piece of pieces) if (decoded.includes(piece)) found.push(`${run}@${shift}: ${piece}`);
    }
  return found;
}
