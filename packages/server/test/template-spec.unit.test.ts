import { mkdir, mkdtemp, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { BothyError } from "@bothy/protocol";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { canonicalJson, loadTemplate, parseTemplateDefinition } from "../src/images/template-spec.ts";

const repoTemplates = fileURLToPath(new URL("../../../templates/", import.meta.url));

function parseError(yaml: string): string {
  try {
    parseTemplateDefinition(yaml, "t.yaml");
  } catch (err) {
    expect(err).toBeInstanceOf(BothyError);
    return (err as BothyError).message;
  }
  throw new Error("expected the definition to be rejected");
}

describe("template definition schema", () => {
  it("accepts the documented format, with defaults and octal modes", () => {
    const def = parseTemplateDefinition(
      [
        "base: debian/bookworm",
        "packages: [nodejs, bash, nodejs, g++, libc6.1]",
        "files:",
        "  - { src: motd, dest: /etc/motd, mode: 0600 }",
        "  - { src: run.sh, dest: /usr/local/bin/run, mode: '0755' }",
        "  - { src: other, dest: /etc/other }",
        "  - { src: tool, dest: /usr/local/bin/tool, mode: 755 }",
        "  - { src: key, dest: /etc/key, mode: 0o400 }",
        "env: { LANG: C.UTF-8 }",
      ].join("\n"),
      "t.yaml",
    );
    expect(def.packages).toEqual(["bash", "g++", "libc6.1", "nodejs"]);
    expect(def.files.map((f) => f.mode)).toEqual([0o600, 0o755, 0o644, 0o755, 0o400]);
    expect(def.commands).toEqual([]);
    expect(def.env).toEqual({ LANG: "C.UTF-8" });
  });

  it.each([
    ["unknown top-level keys", "base: debian/bookworm\npackage: [bash]", /unknown key\(s\) "package"/],
    [
      "unknown keys in a file entry",
      "base: debian/bookworm\nfiles: [{ src: a, dest: /a, owner: root }]",
      /files\[0\]: unknown key\(s\) "owner"/,
    ],
    ["neither base nor from", "packages: [bash]", /exactly one of `base` or `from`/],
    ["both base and from", "base: debian/bookworm\nfrom: seed", /exactly one of `base` or `from`/],
    ["a base that is not debian/<suite>", "base: ubuntu/noble", /base must look like debian\/<suite>/],
    ["a from that is not a template name", "from: ../seed", /from must name another template/],
    [
      "package names outside Debian policy",
      "base: debian/bookworm\npackages: [bash, 'rm -rf']",
      /packages\[1\]: not a Debian package name/,
    ],
    ["upper-case package names", "base: debian/bookworm\npackages: [Bash]", /packages\[0\]/],
    ["option-like package names", "base: debian/bookworm\npackages: [--yes]", /packages\[0\]/],
    [
      "a src leaving the folder",
      "base: debian/bookworm\nfiles: [{ src: ../x, dest: /x }]",
      /files\[0\]\.src: src must stay inside/,
    ],
    [
      "an absolute src",
      "base: debian/bookworm\nfiles: [{ src: /etc/passwd, dest: /x }]",
      /files\[0\]\.src: src must be relative/,
    ],
    [
      "a relative dest",
      "base: debian/bookworm\nfiles: [{ src: a, dest: etc/a }]",
      /files\[0\]\.dest: dest must be an absolute path/,
    ],
    [
      "a dest with ..",
      "base: debian/bookworm\nfiles: [{ src: a, dest: /etc/../a }]",
      /dest must be a normalized file path/,
    ],
    [
      "a non-octal mode string",
      "base: debian/bookworm\nfiles: [{ src: a, dest: /a, mode: '0888' }]",
      /mode must be octal/,
    ],
    [
      "a non-octal mode number",
      "base: debian/bookworm\nfiles: [{ src: a, dest: /a, mode: 0888 }]",
      /files\[0\]\.mode: mode must be octal/,
    ],
    [
      "a mode of more than four digits",
      "base: debian/bookworm\nfiles: [{ src: a, dest: /a, mode: 10644 }]",
      /mode must be octal/,
    ],
    ["env values that are not strings", "base: debian/bookworm\nenv: { PORT: 8080 }", /env\.PORT/],
    [
      "env names that are not identifiers",
      "base: debian/bookworm\nenv: { 'A-B': x }",
      /env names must be shell identifiers/,
    ],
    ["empty commands", "base: debian/bookworm\ncommands: ['']", /commands\[0\]: a command must not be empty/],
    ["broken YAML", "base: [debian", /not valid YAML/],
    ["duplicate keys", "base: debian/bookworm\nbase: debian/trixie", /not valid YAML: Map keys must be unique/],
  ])("rejects %s", (_what, yaml, message) => {
    const text = parseError(yaml);
    expect(text).toMatch(message);
    expect(text.startsWith("t.yaml: ")).toBe(true);
  });
});

describe("canonicalJson", () => {
  it("sorts keys at every level and keeps array order", () => {
    expect(canonicalJson({ b: 1, a: { d: [2, 1], c: null } })).toBe('{"a":{"c":null,"d":[2,1]},"b":1}');
  });
});

describe("loadTemplate and the content hash", () => {
  let dir: string;
  const write = async (rel: string, text: string): Promise<void> => {
    await mkdir(path.dirname(path.join(dir, rel)), { recursive: true });
    await writeFile(path.join(dir, rel), text);
  };
  const hashOf = async (name: string): Promise<string> => (await loadTemplate(dir, name)).hash;

  beforeEach(async () => {
    dir = await mkdtemp(path.join(tmpdir(), "bothy-spec-"));
    await write("base/template.yaml", "base: debian/bookworm\npackages: [bash]\nenv: { A: '1', B: '2' }\n");
    await write("child/template.yaml", "from: base\nfiles: [{ src: motd, dest: /etc/motd }]\nenv: { B: child }\n");
    await write("child/motd", "hello\n");
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("loads the repository's own templates", async () => {
    const seed = await loadTemplate(repoTemplates, "seed");
    const runtime = await loadTemplate(repoTemplates, "code-runtime");
    expect(seed.def.base).toBe("debian/bookworm");
    expect(runtime.parent?.hash).toBe(seed.hash);
    expect(runtime.env["LANG"]).toBe("C.UTF-8");
    expect(seed.hash).toMatch(/^[0-9a-f]{64}$/);
  });

  it("merges env down the chain, the child winning", async () => {
    expect((await loadTemplate(dir, "child")).env).toEqual({ A: "1", B: "child" });
  });

  it("is stable under comments, key order and YAML style", async () => {
    const before = await hashOf("base");
    await write(
      "base/template.yaml",
      "# a comment\nenv:\n  B: '2'\n  A: '1'\npackages:\n  - bash\n  - bash\nbase: debian/bookworm\n",
    );
    expect(await hashOf("base")).toBe(before);
  });

  it("is the same for a copy under another name", async () => {
    await write("copy/template.yaml", "base: debian/bookworm\npackages: [bash]\nenv: { A: '1', B: '2' }\n");
    expect(await hashOf("copy")).toBe(await hashOf("base"));
  });

  it("changes with the definition, a referenced file's bytes, and the parent", async () => {
    const base = await hashOf("base");
    const child = await hashOf("child");
    await write("child/motd", "hello!\n");
    const childAfterFile = await hashOf("child");
    expect(childAfterFile).not.toBe(child);
    await write("base/template.yaml", "base: debian/bookworm\npackages: [bash, curl]\nenv: { A: '1', B: '2' }\n");
    expect(await hashOf("base")).not.toBe(base);
    expect(await hashOf("child")).not.toBe(childAfterFile);
  });

  it("ignores files in the folder that no entry references", async () => {
    const before = await hashOf("child");
    await write("child/notes.txt", "unrelated");
    expect(await hashOf("child")).toBe(before);
  });

  it("rejects bad names, missing definitions, missing parents and cycles", async () => {
    await expect(loadTemplate(dir, "../etc")).rejects.toMatchObject({ code: "invalid_template_name" });
    await expect(loadTemplate(dir, "nope")).rejects.toMatchObject({ code: "template_not_found" });
    await write("orphan/template.yaml", "from: nope\n");
    await expect(loadTemplate(dir, "orphan")).rejects.toMatchObject({
      code: "template_not_found",
      message: /No template "nope" \(from "orphan"\)/,
    });
    await write("a/template.yaml", "from: b\n");
    await write("b/template.yaml", "from: a\n");
    await expect(loadTemplate(dir, "a")).rejects.toThrow(/cycle: a -> b -> a/);
  });

  it("rejects files that are missing, not regular, or symlinked out of the folder", async () => {
    await write("f/template.yaml", "base: debian/bookworm\nfiles: [{ src: missing, dest: /m }]\n");
    await expect(loadTemplate(dir, "f")).rejects.toThrow(/"missing" cannot be read \(ENOENT\)/);
    await write("f/template.yaml", "base: debian/bookworm\nfiles: [{ src: sub, dest: /m }]\n");
    await mkdir(path.join(dir, "f/sub"));
    await expect(loadTemplate(dir, "f")).rejects.toThrow(/"sub" is not a regular file/);
    await write("f/template.yaml", "base: debian/bookworm\nfiles: [{ src: link, dest: /m }]\n");
    await symlink("/etc/hostname", path.join(dir, "f/link"));
    await expect(loadTemplate(dir, "f")).rejects.toThrow(/"link" lies outside the template's folder/);
  });
});
