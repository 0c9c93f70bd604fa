/**
 * The template definition format (`templates/<name>/template.yaml`): schema, loading and the
 * content hash that names a build. The format is documented in docs/templates.md.
 */
import { createHash } from "node:crypto";
import { readFile, realpath, stat } from "node:fs/promises";
import path from "node:path";
import { BothyError, TEMPLATE_NAME_RE } from "@bothy/protocol";
import { isMap, isScalar, isSeq, parseDocument, type Document } from "yaml";
import { z } from "zod";

/**
 * Part of every hash: bump it when the builder changes what it produces from the same definition
 * (new cleanup, other debootstrap flags), so existing builds are no longer taken as current.
 */
export const TEMPLATE_FORMAT_VERSION = 2;

export const TEMPLATE_FILE = "template.yaml";

/** Debian policy 5.6.1: lowercase letters, digits, `+ - .`, at least two characters, alphanumeric first. */
export const DEBIAN_PACKAGE_RE = /^[a-z0-9][a-z0-9+.-]+$/;
const DEBIAN_BASE_RE = /^debian\/[a-z][a-z0-9-]*$/;
const ENV_NAME_RE = /^[A-Za-z_][A-Za-z0-9_]*$/;

const fileMode = z
  .string()
  .regex(/^(0o?)?[0-7]{3,4}$/, "mode must be octal, like 0644 or 755")
  .transform((s) => parseInt(s.replace(/^0o/, ""), 8));

const fileEntry = z.strictObject({
  src: z
    .string()
    .min(1)
    .refine((s) => !path.isAbsolute(s), "src must be relative to the template's folder")
    .refine((s) => !path.normalize(s).split(path.sep).includes(".."), "src must stay inside the template's folder"),
  dest: z
    .string()
    .refine((s) => path.posix.isAbsolute(s), "dest must be an absolute path")
    .refine(
      (s) => s !== "/" && path.posix.normalize(s) === s && !s.endsWith("/"),
      "dest must be a normalized file path",
    ),
  mode: fileMode.default(0o644),
});

export const templateDefinition = z
  .strictObject({
    base: z.string().regex(DEBIAN_BASE_RE, "base must look like debian/<suite>, e.g. debian/bookworm").optional(),
    from: z
      .string()
      .regex(TEMPLATE_NAME_RE, "from must name another template (lowercase letters, digits, -)")
      .optional(),
    // apt installs a set, so order and repeats carry no meaning; normalizing keeps them out of the hash.
    packages: z
      .array(z.string().regex(DEBIAN_PACKAGE_RE, "not a Debian package name"))
      .default([])
      .transform((p) => [...new Set(p)].sort()),
    files: z.array(fileEntry).default([]),
    commands: z.array(z.string().min(1, "a command must not be empty")).default([]),
    env: z
      .record(z.string(), z.string())
      .superRefine((env, ctx) => {
        for (const key of Object.keys(env)) {
          if (!ENV_NAME_RE.test(key))
            ctx.addIssue({ code: "custom", message: "env names must be shell identifiers", path: [key] });
        }
      })
      .default({}),
  })
  .superRefine((def, ctx) => {
    if ((def.base === undefined) === (def.from === undefined)) {
      ctx.addIssue({ code: "custom", message: "exactly one of `base` or `from` is required", path: [] });
    }
  });

export type TemplateDefinition = z.infer<typeof templateDefinition>;

export interface TemplateFile {
  /** Absolute path of the source, checked to lie inside the template's folder. */
  srcPath: string;
  dest: string;
  mode: number;
}

export interface LoadedTemplate {
  name: string;
  dir: string;
  def: TemplateDefinition;
  files: TemplateFile[];
  /** Hash of this definition, its files and its parent's hash. */
  hash: string;
  /** The template it is built from, already loaded (and hashed). */
  parent: LoadedTemplate | undefined;
  /** The environment of the built template: the parent's, overridden by this definition's. */
  env: Record<string, string>;
}

/**
 * A mode is read from the digits as written, always octal, as chmod reads them: YAML 1.2 alone
 * would turn `0644` into decimal 644 and `755` into 0o1363, both silently wrong.
 */
function modesAsWritten(doc: Document): void {
  const files = doc.get("files");
  if (!isSeq(files)) return;
  for (const entry of files.items) {
    if (!isMap(entry)) continue;
    const mode = entry.get("mode", true);
    if (isScalar(mode) && mode.type === "PLAIN" && typeof mode.value === "number" && mode.source !== undefined) {
      entry.set("mode", mode.source);
    }
  }
}

function invalid(file: string, message: string): BothyError {
  // No dedicated code exists for a broken definition on the server's disk: it is an operator's
  // error, not the client's, hence `internal`; the message names the file and the fix.
  return new BothyError("invalid_template", `${file}: ${message}`, { details: { template_file: file } });
}

function formatIssues(issues: readonly z.core.$ZodIssue[]): string {
  return issues
    .map((i) => {
      const where = i.path
        .map((p) => (typeof p === "number" ? `[${p}]` : `.${String(p)}`))
        .join("")
        .replace(/^\./, "");
      const msg =
        i.code === "unrecognized_keys" ? `unknown key(s) ${i.keys.map((k) => `"${k}"`).join(", ")}` : i.message;
      return where === "" ? msg : `${where}: ${msg}`;
    })
    .join("; ");
}

/** Parses and validates the text of a template.yaml; `file` only names it in errors. */
export function parseTemplateDefinition(text: string, file: string): TemplateDefinition {
  const doc = parseDocument(text, { uniqueKeys: true });
  const first = doc.errors[0];
  if (first !== undefined) throw invalid(file, `not valid YAML: ${first.message.split("\n")[0] ?? ""}`);
  modesAsWritten(doc);
  const result = templateDefinition.safeParse(doc.toJS() ?? {});
  if (!result.success) throw invalid(file, formatIssues(result.error.issues));
  return result.data;
}

export function assertTemplateName(name: string): void {
  if (!TEMPLATE_NAME_RE.test(name)) {
    throw new BothyError(
      "invalid_template_name",
      `"${name}" is not a template name: use 1-63 lowercase letters, digits and dashes, starting with a letter or digit.`,
    );
  }
}

async function resolveFiles(dir: string, def: TemplateDefinition, file: string): Promise<TemplateFile[]> {
  const realDir = await realpath(dir);
  const out: TemplateFile[] = [];
  for (const f of def.files) {
    let srcPath: string;
    try {
      srcPath = await realpath(path.join(dir, f.src));
    } catch (err) {
      throw invalid(file, `files: "${f.src}" cannot be read (${(err as NodeJS.ErrnoException).code ?? "error"})`);
    }
    // realpath, so a symlink inside the folder cannot point the copy outside of it.
    if (!srcPath.startsWith(realDir + path.sep))
      throw invalid(file, `files: "${f.src}" lies outside the template's folder`);
    if (!(await stat(srcPath)).isFile()) throw invalid(file, `files: "${f.src}" is not a regular file`);
    out.push({ srcPath, dest: f.dest, mode: f.mode });
  }
  return out;
}

/** JSON with object keys sorted at every level, so formatting and key order never change a hash. */
export function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(",")}]`;
  if (value !== null && typeof value === "object") {
    const entries = Object.entries(value as Record<string, unknown>)
      .filter(([, v]) => v !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonicalJson(v)}`).join(",")}}`;
  }
  return JSON.stringify(value);
}

/**
 * sha256 over the format version, the canonical definition, every referenced file's bytes and the
 * parent's hash. The template's name and folder are left out: a copy builds the same tree.
 */
export async function computeTemplateHash(
  def: TemplateDefinition,
  files: readonly TemplateFile[],
  parentHash: string | undefined,
): Promise<string> {
  const h = createHash("sha256");
  // Each part is framed by a label and a length so no two inputs can produce the same byte stream.
  const part = (label: string, data: string | Buffer): void => {
    const bytes = typeof data === "string" ? Buffer.from(data) : data;
    h.update(`${label}:${bytes.length}\n`);
    h.update(bytes);
  };
  part("format", String(TEMPLATE_FORMAT_VERSION));
  part("definition", canonicalJson(def));
  for (const [i, f] of files.entries()) part(`file${i}`, await readFile(f.srcPath));
  part("parent", parentHash ?? "");
  return h.digest("hex");
}

/**
 * Loads `<sourceDir>/<name>/template.yaml` and, through `from:`, its ancestors; hashes the chain
 * root first. Throws `invalid_template_name`, `template_not_found`, or `internal` naming the file.
 */
export async function loadTemplate(
  sourceDir: string,
  name: string,
  seen: readonly string[] = [],
): Promise<LoadedTemplate> {
  assertTemplateName(name);
  if (seen.includes(name)) {
    throw invalid(path.join(sourceDir, name, TEMPLATE_FILE), `"from" forms a cycle: ${[...seen, name].join(" -> ")}`);
  }
  const dir = path.join(sourceDir, name);
  const file = path.join(dir, TEMPLATE_FILE);
  let text: string;
  try {
    text = await readFile(file, "utf8");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
    const via = seen.length > 0 ? ` (from "${seen[seen.length - 1] ?? ""}")` : "";
    throw new BothyError("template_not_found", `No template "${name}"${via}: ${file} does not exist.`, {
      details: { template: name },
    });
  }
  const def = parseTemplateDefinition(text, file);
  const files = await resolveFiles(dir, def, file);
  const parent = def.from === undefined ? undefined : await loadTemplate(sourceDir, def.from, [...seen, name]);
  const hash = await computeTemplateHash(def, files, parent?.hash);
  return { name, dir, def, files, hash, parent, env: { ...(parent?.env ?? {}), ...def.env } };
}
