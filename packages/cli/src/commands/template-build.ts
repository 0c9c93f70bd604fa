/**
 * `bothy template build NAME [--force]`: builds a template (and the templates it is built from)
 * into the store, showing progress on stderr and the result on stdout. `bothy template list`:
 * every definition and whether its current hash is built.
 */
import { BothyError } from "@bothy/protocol";
import { loadConfig, TemplateStore } from "@bothy/server";
import { createProgressRenderer } from "../progress.ts";

const USAGE = `usage: bothy template build NAME [--force]

Builds templates/NAME/template.yaml into the template store, or reports the
existing build when the definition is unchanged.

  --force   rebuild even when a build of the current definition exists

Environment: BOTHY_HOME (default /var/lib/bothy), BOTHY_TEMPLATES_DIR (default
$BOTHY_HOME/templates), BOTHY_DEBIAN_MIRROR (default http://deb.debian.org/debian).
`;

/**
 * The same store the server uses: the server's config resolves BOTHY_HOME, BOTHY_TEMPLATES_DIR
 * and the repository's templates/ folder; the store reads BOTHY_DEBIAN_MIRROR.
 */
function templateStoreFromEnv(): TemplateStore {
  const config = loadConfig();
  return new TemplateStore({ sourceDir: config.templateSources, storeDir: config.templatesDir });
}

function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

function parseArgs(args: string[]): { name: string; force: boolean } | string {
  let name: string | undefined;
  let force = false;
  for (const arg of args) {
    if (arg === "--force") force = true;
    else if (arg.startsWith("-")) return `unknown option ${arg}`;
    else if (name === undefined) name = arg;
    else return `unexpected argument ${arg}`;
  }
  return name === undefined ? "a template NAME is required" : { name, force };
}

export async function templateBuild(args: string[]): Promise<number> {
  if (args.includes("--help") || args.includes("-h")) {
    process.stdout.write(USAGE);
    return 0;
  }
  const parsed = parseArgs(args);
  if (typeof parsed === "string") {
    process.stderr.write(`bothy template build: ${parsed}\n\n${USAGE}`);
    return 2;
  }
  const store = templateStoreFromEnv();
  const controller = new AbortController();
  // First Ctrl-C: stop the build and clean up. `once`: a second one kills at once; the
  // half-built tree it leaves is removed by the next build of the same template.
  const onSignal = (sig: NodeJS.Signals): void => {
    process.stderr.write(`\nbothy: ${sig}: stopping the build and removing its tree (again to quit at once)\n`);
    controller.abort(new BothyError("shutting_down", `Build of "${parsed.name}" interrupted; nothing was kept.`));
  };
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  const renderer = createProgressRenderer(process.stderr);
  const started = Date.now();
  let built = false;
  try {
    const result = await store.build(parsed.name, {
      force: parsed.force,
      signal: controller.signal,
      onProgress: (ev) => {
        built ||= ev.steps > 0;
        renderer.update(ev);
      },
    });
    renderer.finish();
    const how = built
      ? `built in ${((Date.now() - started) / 1000).toFixed(1)}s`
      : `up to date (built ${result.builtAt})`;
    process.stdout.write(`${result.name} ${result.hash.slice(0, 12)} ${how}\n${result.rootfs}\n`);
    return 0;
  } catch (err) {
    renderer.finish();
    process.stderr.write(`bothy: ${errorMessage(controller.signal.aborted ? controller.signal.reason : err)}\n`);
    return controller.signal.aborted ? 130 : 1;
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
  }
}

const LIST_USAGE = `usage: bothy template list [--json]\n`;

export async function templateList(args: string[]): Promise<number> {
  if (args.includes("--help") || args.includes("-h")) {
    process.stdout.write(LIST_USAGE);
    return 0;
  }
  const unknown = args.find((a) => a !== "--json");
  if (unknown !== undefined) {
    process.stderr.write(`bothy template list: unexpected argument ${unknown}\n${LIST_USAGE}`);
    return 2;
  }
  let templates;
  try {
    templates = await templateStoreFromEnv().list();
  } catch (err) {
    process.stderr.write(`bothy: ${errorMessage(err)}\n`);
    return 1;
  }
  if (args.includes("--json")) {
    process.stdout.write(`${JSON.stringify({ templates }, null, 2)}\n`);
    return 0;
  }
  const rows = templates.map((t) => [
    t.name,
    t.error !== undefined ? "invalid" : t.built !== undefined ? "built" : "not built",
    t.built?.hash.slice(0, 12) ?? "-",
    t.built?.builtAt ?? t.error ?? "-",
  ]);
  const header = ["NAME", "STATUS", "HASH", "BUILT"];
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  for (const row of [header, ...rows]) {
    // The last column is left unpadded: it holds error messages of any length.
    process.stdout.write(
      `${row.map((cell, i) => (i === row.length - 1 ? cell : cell.padEnd(widths[i] ?? 0))).join("  ")}\n`,
    );
  }
  return 0;
}
