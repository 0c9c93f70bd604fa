/**
 * Built templates on disk, keyed by content hash: `<storeDir>/<name>/<hash>/meta.json`, naming
 * the build's layer in the layer store (`<storeDir>/layers/`, layer-store.ts). A base template's
 * layer is its whole tree; a child's holds only what its steps changed over its parent's chain.
 * A build happens under `<storeDir>/.tmp/`; its layer is published and its meta.json renamed into
 * place only once complete, so a meta.json always names a whole chain. One build per template at
 * a time: shared within a process, serialized across processes by a lock file.
 */
import { randomBytes } from "node:crypto";
import { chmod, mkdir, mkdtemp, readFile, readdir, realpath, rename, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import { BothyError } from "@bothy/protocol";
import { z } from "zod";
import { LayerStore } from "./layer-store.ts";
import { planBuild, removeTree, unmountUnder, type BuildProgress } from "./template-builder.ts";
import { acquireLock } from "./template-lock.ts";
import { loadTemplate, TEMPLATE_FILE, TEMPLATE_FORMAT_VERSION, type LoadedTemplate } from "./template-spec.ts";

export type { BuildProgress } from "./template-builder.ts";

export interface BuiltTemplate {
  name: string;
  hash: string;
  /**
   * The build's own layer tree, which stands for the whole chain (drivers read the chain with
   * `lowerDirsOf`); read-only. For a base template, and a build from before layers, the whole tree.
   */
  rootfs: string;
  /** The overlayfs lower directories of the whole tree, top first (`rootfs` is the first). */
  layers: string[];
  /** Environment every command in a sandbox of this template gets. */
  env: Record<string, string>;
  builtAt: string;
}

export interface TemplateStoreOptions {
  /** The repository's `templates/` folder, holding `<name>/template.yaml`. */
  sourceDir: string;
  /** Where builds live, e.g. `$BOTHY_HOME/templates`. */
  storeDir: string;
  /** Debian mirror for debootstrap; default `$BOTHY_DEBIAN_MIRROR` or deb.debian.org. */
  mirror?: string;
}

export interface BuildOptions {
  onProgress?: (ev: BuildProgress) => void;
  signal?: AbortSignal;
  /** Rebuild even when a build for the current hash exists (the parent is still taken from cache). */
  force?: boolean;
}

const DEFAULT_MIRROR = "http://deb.debian.org/debian";
const ERROR_TAIL_LINES = 15;

const metaSchema = z.object({
  formatVersion: z.number(),
  name: z.string(),
  hash: z.string(),
  env: z.record(z.string(), z.string()),
  builtAt: z.string(),
  parent: z.object({ name: z.string(), hash: z.string() }).nullable(),
  base: z.string().nullable(),
  packages: z.array(z.string()),
  buildSeconds: z.number(),
  /** The build's layer; absent in builds from before layers, whose whole tree is `rootfs/` beside. */
  layer: z.string().optional(),
});
type TemplateMeta = z.infer<typeof metaSchema>;

interface Flight {
  promise: Promise<BuiltTemplate>;
  controller: AbortController;
  listeners: Set<(ev: BuildProgress) => void>;
  waiters: number;
}

export class TemplateStore {
  readonly sourceDir: string;
  readonly storeDir: string;
  readonly mirror: string;
  readonly layers: LayerStore;
  private readonly flights = new Map<string, Flight>();

  constructor(opts: TemplateStoreOptions) {
    this.sourceDir = path.resolve(opts.sourceDir);
    this.storeDir = path.resolve(opts.storeDir);
    this.mirror = opts.mirror ?? process.env["BOTHY_DEBIAN_MIRROR"] ?? DEFAULT_MIRROR;
    this.layers = new LayerStore(this.storeDir);
  }

  /** The built template for the current definition, or undefined when it must be built. */
  async resolve(name: string): Promise<BuiltTemplate | undefined> {
    return this.readBuilt(await loadTemplate(this.sourceDir, name));
  }

  /** The build of `name` with this hash, if it is still on disk (a sandbox made from an older definition). */
  resolveBuild(name: string, hash: string): Promise<BuiltTemplate | undefined> {
    return this.readBuilt({ name, hash });
  }

  /** Builds `name` (and its parents), or returns the build for the current hash. */
  async build(name: string, opts: BuildOptions = {}): Promise<BuiltTemplate> {
    opts.signal?.throwIfAborted();
    return this.buildLoaded(await loadTemplate(this.sourceDir, name), opts);
  }

  /** Every template with a definition; `error` says why one cannot be loaded. */
  async list(): Promise<Array<{ name: string; built: BuiltTemplate | undefined; error?: string }>> {
    const entries = await readdir(this.sourceDir, { withFileTypes: true });
    const names = entries
      .filter((e) => e.isDirectory())
      .map((e) => e.name)
      .sort();
    const out: Array<{ name: string; built: BuiltTemplate | undefined; error?: string }> = [];
    for (const name of names) {
      if (!(await hasDefinition(this.sourceDir, name))) continue;
      try {
        out.push({ name, built: await this.resolve(name) });
      } catch (err) {
        out.push({ name, built: undefined, error: err instanceof Error ? err.message : String(err) });
      }
    }
    return out;
  }

  private buildLoaded(t: LoadedTemplate, opts: BuildOptions): Promise<BuiltTemplate> {
    const key = `${t.name}@${t.hash}${opts.force === true ? "!" : ""}`;
    let flight = this.flights.get(key);
    if (flight === undefined) {
      const controller = new AbortController();
      const listeners = new Set<(ev: BuildProgress) => void>();
      const emit = (ev: BuildProgress): void => listeners.forEach((l) => l(ev));
      const started: Flight = {
        controller,
        listeners,
        waiters: 0,
        promise: this.runBuild(t, opts.force === true, controller.signal, emit).finally(() => {
          if (this.flights.get(key) === started) this.flights.delete(key);
        }),
      };
      // Callers that all gave up leave nobody to observe the rejection.
      started.promise.catch(() => undefined);
      this.flights.set(key, started);
      flight = started;
    }
    return this.join(key, flight, opts);
  }

  /** Attaches one caller to a shared build; the build is aborted only when every caller aborted. */
  private join(key: string, flight: Flight, opts: BuildOptions): Promise<BuiltTemplate> {
    const listener = opts.onProgress;
    if (listener !== undefined) flight.listeners.add(listener);
    flight.waiters++;
    return new Promise<BuiltTemplate>((resolve, reject) => {
      let settled = false;
      const leave = (): void => {
        settled = true;
        if (listener !== undefined) flight.listeners.delete(listener);
        opts.signal?.removeEventListener("abort", onAbort);
        flight.waiters--;
      };
      const onAbort = (): void => {
        if (settled) return;
        leave();
        const reason: unknown = opts.signal?.reason;
        if (flight.waiters > 0) return reject(reason);
        // The last caller aborts the build itself, and hears back only once its tree is removed:
        // a CLI that exits on the rejection must not cut the cleanup short.
        if (this.flights.get(key) === flight) this.flights.delete(key);
        flight.controller.abort(reason);
        flight.promise.then(
          () => reject(reason),
          () => reject(reason),
        );
      };
      opts.signal?.addEventListener("abort", onAbort, { once: true });
      flight.promise.then(
        (built) => settled || (leave(), resolve(built)),
        (err: unknown) => settled || (leave(), reject(err)),
      );
      if (opts.signal?.aborted === true) onAbort();
    });
  }

  private async runBuild(
    t: LoadedTemplate,
    force: boolean,
    signal: AbortSignal,
    emit: (ev: BuildProgress) => void,
  ): Promise<BuiltTemplate> {
    if (!force) {
      const cached = await this.readBuilt(t);
      if (cached !== undefined) return cached;
    }
    if (process.getuid?.() !== 0) {
      throw new BothyError(
        "not_supported",
        `Template "${t.name}" is not built, and building needs root (debootstrap, mount, chroot): run \`sudo bothy template build ${t.name}\`.`,
      );
    }
    const parent =
      t.parent === undefined
        ? undefined
        : await this.buildLoaded(t.parent, {
            signal,
            onProgress: (ev) => emit({ ...ev, title: `${t.parent?.name ?? ""}: ${ev.title}` }),
          });

    await mkdir(path.join(this.storeDir, ".tmp"), { recursive: true });
    await mkdir(path.join(this.storeDir, ".locks"), { recursive: true });
    const release = await acquireLock(path.join(this.storeDir, ".locks", `${t.name}.lock`), signal, (holder) =>
      emit({ step: 0, steps: 0, title: "waiting", line: `another build of "${t.name}" is running (pid ${holder})` }),
    );
    try {
      // The process that held the lock may have just built this very hash.
      if (!force) {
        const cached = await this.readBuilt(t);
        if (cached !== undefined) return cached;
      }
      await this.removeStaleTemps(t.name);
      return await this.buildInto(t, parent, signal, emit);
    } finally {
      await release();
    }
  }

  private async buildInto(
    t: LoadedTemplate,
    parent: BuiltTemplate | undefined,
    signal: AbortSignal,
    emit: (ev: BuildProgress) => void,
  ): Promise<BuiltTemplate> {
    const started = Date.now();
    // realpath: mount points in /proc/self/mountinfo are real paths, and cleanup matches on them.
    const work = await realpath(await mkdtemp(path.join(this.storeDir, ".tmp", `${t.name}.`)));
    const tree = path.join(work, "rootfs");
    const upper = path.join(work, "upper");
    const finalDir = this.buildDir(t.name, t.hash);
    try {
      const overParent = parent && { lowerDirs: parent.layers, upper, work: path.join(work, "work") };
      const steps = planBuild({ template: t, tree, overParent, mirror: this.mirror, signal });
      steps.push({
        title: "finalize",
        run: async () => {
          // A child's layer is the overlay's upper directory: unmounted first, so nothing
          // writes it any more; a base template's layer is its whole tree.
          if (overParent !== undefined) await unmountUnder(tree);
          signal.throwIfAborted();
          await mkdir(path.dirname(finalDir), { recursive: true });
          await this.layers.locked(signal, async () => {
            const layer = await this.layers.publish(
              overParent === undefined ? tree : upper,
              parent === undefined ? null : layerIdOf(parent),
              t.name,
            );
            const meta: TemplateMeta = {
              formatVersion: TEMPLATE_FORMAT_VERSION,
              name: t.name,
              hash: t.hash,
              env: t.env,
              builtAt: new Date().toISOString(),
              parent: t.parent === undefined ? null : { name: t.parent.name, hash: t.parent.hash },
              base: t.def.base ?? null,
              packages: t.def.packages,
              buildSeconds: Math.round((Date.now() - started) / 100) / 10,
              layer: layer.id,
            };
            await writeFile(path.join(work, "meta.json"), `${JSON.stringify(meta, null, 2)}\n`);
            await chmod(work, 0o755);
            // What is left of the build (overlayfs's work dir) goes; only meta.json moves in.
            for (const entry of await readdir(work)) {
              if (entry !== "meta.json") await removeTree(path.join(work, entry));
            }
            await this.moveIntoPlace(t.name, work, finalDir);
          });
        },
      });
      for (const [i, step] of steps.entries()) {
        signal.throwIfAborted();
        const ev = { step: i + 1, steps: steps.length, title: step.title };
        emit(ev);
        // The step's last lines go into the error: a failed command's own output is often empty
        // while the line that explains it came just before.
        const tail: string[] = [];
        try {
          await step.run((line) => {
            tail.push(line);
            if (tail.length > ERROR_TAIL_LINES) tail.shift();
            emit({ ...ev, line });
          });
        } catch (err) {
          if (signal.aborted) throw signal.reason;
          const message = `Building template "${t.name}" failed at step ${ev.step}/${ev.steps} (${ev.title}): ${err instanceof Error ? err.message : String(err)}`;
          throw new BothyError(
            "template_build_failed",
            tail.length > 0 ? `${message}; last output:\n${tail.join("\n")}` : message,
            {
              cause: err,
              details: { template: t.name, step: ev.title, output: tail },
            },
          );
        }
      }
    } catch (err) {
      await removeTree(work).catch((cleanupErr: unknown) => {
        // Rare (a mount that will not go away), and the operator must act: say both.
        const why = cleanupErr instanceof Error ? cleanupErr.message : String(cleanupErr);
        throw new BothyError(
          "template_build_failed",
          `${err instanceof Error ? err.message : String(err)}; removing ${work} failed too: ${why}`,
          { cause: err },
        );
      });
      throw err;
    }
    const built = await this.readBuilt(t);
    if (built === undefined) throw new Error(`template "${t.name}" was built but ${finalDir} cannot be read back`);
    return built;
  }

  /** rename is atomic; a forced rebuild first moves the old build aside, then deletes it. */
  private async moveIntoPlace(name: string, work: string, finalDir: string): Promise<void> {
    const old = path.join(this.storeDir, ".tmp", `${name}.replaced-${randomBytes(4).toString("hex")}`);
    let replaced = false;
    try {
      await rename(finalDir, old);
      replaced = true;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
    }
    await rename(work, finalDir);
    if (replaced) await removeTree(old);
  }

  /** Temp dirs of this template that no build owns any more: we hold its lock, so they are a crashed build's. */
  private async removeStaleTemps(name: string): Promise<void> {
    const tmp = await realpath(path.join(this.storeDir, ".tmp"));
    for (const entry of await readdir(tmp)) {
      // `.` cannot occur in a template name, so `seed.` never matches `seed-2.`'s temps.
      if (entry.startsWith(`${name}.`)) await removeTree(path.join(tmp, entry));
    }
  }

  private buildDir(name: string, hash: string): string {
    return path.join(this.storeDir, name, hash);
  }

  private async readBuilt(t: { name: string; hash: string }): Promise<BuiltTemplate | undefined> {
    const dir = this.buildDir(t.name, t.hash);
    let text: string;
    try {
      text = await readFile(path.join(dir, "meta.json"), "utf8");
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
      throw err;
    }
    const meta = metaSchema.parse(JSON.parse(text));
    // A layer removed by hand leaves a build that is not there: built again on demand.
    if (meta.layer !== undefined && (await this.layers.read(meta.layer)) === undefined) return undefined;
    const layers =
      meta.layer === undefined ? [path.join(dir, "rootfs")] : (await this.layers.chain(meta.layer)).map((l) => l.tree);
    const rootfs = layers[0] ?? path.join(dir, "rootfs");
    return { name: t.name, hash: t.hash, rootfs, layers, env: meta.env, builtAt: meta.builtAt };
  }

  /**
   * Removes layers no build on disk names (directly or as an ancestor) and none mounted now:
   * what a forced rebuild replaced, or a build that crashed between publishing its layer and its
   * meta.json. `alsoKeep`: layers named elsewhere (those snapshots lie over). Returns the ids removed.
   */
  async removeOrphanLayers(
    signal: AbortSignal = new AbortController().signal,
    alsoKeep: () => Iterable<string> | Promise<Iterable<string>> = () => [],
  ): Promise<string[]> {
    return this.layers.removeOrphans(async () => [...(await this.namedLayers()), ...(await alsoKeep())], signal);
  }

  /** The layer each build's meta.json names. */
  private async namedLayers(): Promise<string[]> {
    const out: string[] = [];
    for (const name of await readdirOrEmpty(this.storeDir)) {
      if (name.startsWith(".") || name === "layers") continue;
      for (const hash of await readdirOrEmpty(path.join(this.storeDir, name))) {
        let text: string;
        try {
          text = await readFile(path.join(this.storeDir, name, hash, "meta.json"), "utf8");
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code === "ENOENT" || (err as NodeJS.ErrnoException).code === "ENOTDIR")
            continue;
          throw err;
        }
        const layer = metaSchema.parse(JSON.parse(text)).layer;
        if (layer !== undefined) out.push(layer);
      }
    }
    return out;
  }
}

/** The layer id of a build, read from its tree's path (`<store>/layers/<id>/tree`). */
function layerIdOf(built: BuiltTemplate): string {
  if (path.basename(built.rootfs) !== "tree")
    throw new Error(`template "${built.name}" was built before layers: rebuild it (bothy template build --force)`);
  return path.basename(path.dirname(built.rootfs));
}

async function readdirOrEmpty(dir: string): Promise<string[]> {
  try {
    return await readdir(dir);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT" || (err as NodeJS.ErrnoException).code === "ENOTDIR")
      return [];
    throw err;
  }
}

async function hasDefinition(sourceDir: string, name: string): Promise<boolean> {
  try {
    return (await stat(path.join(sourceDir, name, TEMPLATE_FILE))).isFile();
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return false;
    throw err;
  }
}
