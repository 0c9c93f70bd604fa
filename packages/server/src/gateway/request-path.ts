/**
 * The path a policy rule judges. Servers do not agree on how to read a request's path: `..`
 * segments, percent-escapes, `//`, `\` and `;` are each read differently by some, so a rule for
 * `/repos/me/` matched against the raw text could pass a request the upstream reads as `/admin`.
 * A path is therefore judged in its canonical form (escapes decoded, `.` and `..` resolved,
 * repeated slashes merged) and in the other forms servers read it as; a path whose reading
 * depends on the server is refused, not guessed at.
 */

/**
 * `path`: the canonical form. `readings`: every form some server reads it as, the canonical one
 * first: also decoded with its `.`, `..` and `//` kept (a store of flat keys, say), and with each
 * segment's `;parameters` dropped (Tomcat, Spring). A rule must decide alike on all of them.
 */
export type JudgedPath = { ok: true; path: string; readings: string[] } | { ok: false; problem: string };

/**
 * Escapes whose decoding changes how the path splits into segments, or that hide another escape:
 * the upstream may or may not decode them before it splits.
 */
const AMBIGUOUS_ESCAPES: Record<string, string> = {
  "2f": "an encoded slash (%2F)",
  "5c": "an encoded backslash (%5C)",
  "2e": "an encoded dot (%2E)",
  "25": "an encoded percent sign (%25: double encoding)",
  "00": "an encoded NUL (%00)",
};

function refuse(problem: string): JudgedPath {
  return { ok: false, problem };
}

/** The canonical form of a request target's path (the query is not part of it), or why there is none. */
export function judgedPath(target: string): JudgedPath {
  if (!target.startsWith("/")) return refuse("a request target that is not a path: absolute-form or *");
  const raw = target.split("?", 1)[0] ?? target;
  if (raw.includes("#")) return refuse("a fragment (#) in the request target");
  if (raw.includes("\\")) return refuse("a backslash, which some servers read as /");
  // Control characters, space and DEL are not valid in a path; some servers cut the path at them.
  if ([...raw].some((c) => c.charCodeAt(0) <= 0x20 || c.charCodeAt(0) === 0x7f))
    return refuse("a control character or space");
  for (const m of raw.matchAll(/%(.{0,2})/g)) {
    const hex = (m[1] ?? "").toLowerCase();
    if (!/^[0-9a-f]{2}$/.test(hex)) return refuse("a % that does not start an escape (%XX)");
    const why = AMBIGUOUS_ESCAPES[hex];
    if (why !== undefined) return refuse(why);
    // Escapes of control characters are refused like the raw characters.
    if (parseInt(hex, 16) < 0x20 || hex === "7f") return refuse(`an encoded control character (%${hex.toUpperCase()})`);
  }
  let decoded: string;
  try {
    decoded = decodeURIComponent(raw);
  } catch {
    return refuse("escapes that are not valid UTF-8 (overlong or truncated sequences)");
  }
  const segments = decoded.split("/").slice(1);
  const out: string[] = [];
  let dots = false;
  let empty = false;
  for (const [index, segment] of segments.entries()) {
    // `..;x` is `..` to servers that drop path parameters (Tomcat, Spring).
    const bare = segment.split(";", 1)[0] ?? segment;
    if (bare !== segment && (bare === "." || bare === ".."))
      return refuse(`a dot segment with parameters (${segment})`);
    // Look-alikes a server folding Unicode (NFKC) reads as dots.
    const folded = segment.normalize("NFKC");
    if (folded !== segment && (folded === "." || folded === ".."))
      return refuse("a segment of Unicode dots that some servers read as . or ..");
    if (segment === ".") {
      dots = true;
      if (index === segments.length - 1) out.push("");
    } else if (segment === "..") {
      dots = true;
      out.pop();
      if (index === segments.length - 1) out.push("");
    } else if (segment === "" && index < segments.length - 1) {
      // Servers that merge `//` and servers that keep it agree only while no `..` follows.
      empty = true;
    } else out.push(segment);
  }
  if (dots && empty) return refuse("an empty segment (//) together with . or .. segments");
  const path = `/${out.join("/")}`;
  const unparameterised = path.replace(/;[^/]*/g, "");
  return { ok: true, path, readings: [...new Set([path, decoded, unparameterised])] };
}
