/**
 * The steps that turn a template definition into a root tree: debootstrap, or an overlay over
 * the parent's layers whose upper directory collects what this template changes; then apt,
 * files, commands, cleanup. Everything here runs as root against a tree that is still in the
 * store's temporary area; the store decides what becomes a layer and when it counts as built.
 */
import { spawn } from "node:child_process";
import {
  chmod,
  copyFile,
  constants,
  lstat,
  mkdir,
  readFile,
  readdir,
  rename,
  rm,
  unlink,
  writeFile,
} from "node:fs/promises";
import path from "node:path";
import type { Readable } from "node:stream";
import { BothyError } from "@bothy/protocol";
import { run } from "../util/host-command.ts";
import type { LoadedTemplate } from "./template-spec.ts";

export interface BuildProgress {
  /** 1-based index of the current step. */
  step: number;
  steps: number;
  title: string;
  /** One line of a subprocess's output, when the event carries one. */
  line?: string;
}

export interface BuildStep {
  title: string;
  run: (emitLine: (line: string) => void) => Promise<void>;
}

export interface BuildInputs {
  template: LoadedTemplate;
  /** Where the steps see the whole tree; must not exist yet. */
  tree: string;
  /**
   * For `from:`: the parent's layers (overlayfs lower directories, top first) and where this
   * build's own layer (the overlay's upper directory) and overlayfs's work directory go.
   */
  overParent: { lowerDirs: readonly string[]; upper: string; work: string } | undefined;
  mirror: string;
  signal: AbortSignal;
}

/** A clean environment for the chroot: nothing of the host's (its PATH, its secrets) leaks in. */
const CHROOT_ENV: Record<string, string> = {
  PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
  HOME: "/root",
  LANG: "C.UTF-8",
  DEBIAN_FRONTEND: "noninteractive",
};

const KILL_GRACE_MS = 5_000;

/**
 * Runs a host program with an argument array, forwarding each output line. It runs in its own
 * process group so an abort also stops what it started (debootstrap's dpkg, apt's http workers);
 * the promise settles only when every holder of its output pipes has gone. A failure names the
 * command and its exit; the output it printed has gone to `onLine`.
 */
export function runStreaming(
  file: string,
  args: readonly string[],
  opts: { env: NodeJS.ProcessEnv; signal: AbortSignal; onLine: (line: string) => void },
): Promise<void> {
  opts.signal.throwIfAborted();
  return new Promise((resolve, reject) => {
    const child = spawn(file, args, { env: opts.env, stdio: ["ignore", "pipe", "pipe"], detached: true });
    const feed = (stream: Readable): void => {
      let rest = "";
      stream.setEncoding("utf8");
      stream.on("data", (chunk: string) => {
        const parts = (rest + chunk).split(/\r\n|\r|\n/);
        rest = parts.pop() ?? "";
        for (const line of parts) emit(line);
      });
      stream.on("end", () => rest !== "" && emit(rest));
    };
    const emit = (line: string): void => {
      if (line.trim() !== "") opts.onLine(line);
    };
    const killGroup = (sig: NodeJS.Signals): void => {
      if (child.pid === undefined) return;
      try {
        process.kill(-child.pid, sig);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== "ESRCH") throw err;
      }
    };
    let killTimer: NodeJS.Timeout | undefined;
    const onAbort = (): void => {
      killGroup("SIGTERM");
      killTimer = setTimeout(() => killGroup("SIGKILL"), KILL_GRACE_MS);
    };
    opts.signal.addEventListener("abort", onAbort, { once: true });
    feed(child.stdout);
    feed(child.stderr);
    child.on("error", (err) => {
      opts.signal.removeEventListener("abort", onAbort);
      reject(new BothyError("template_build_failed", `Could not start ${file}: ${err.message}`, { cause: err }));
    });
    child.on("close", (code, sig) => {
      opts.signal.removeEventListener("abort", onAbort);
      clearTimeout(killTimer);
      if (opts.signal.aborted) return reject(opts.signal.reason);
      if (code === 0) return resolve();
      const how = code === null ? `was killed by ${sig ?? "a signal"}` : `exited with code ${code}`;
      reject(new BothyError("template_build_failed", `${[file, ...args].join(" ")} ${how}`));
    });
  });
}

function decodeMountPath(field: string): string {
  return field.replace(/\\([0-7]{3})/g, (_, oct: string) => String.fromCharCode(parseInt(oct, 8)));
}

/** Mount points at or below `dir` (which must be a real path), deepest first; `below`: not `dir` itself. */
export async function mountsUnder(dir: string, below = false): Promise<string[]> {
  const info = await readFile("/proc/self/mountinfo", "utf8");
  const points = info
    .split("\n")
    .map((line) => line.split(" ")[4])
    .filter((p): p is string => p !== undefined)
    .map(decodeMountPath)
    .filter((p) => (p === dir && !below) || p.startsWith(dir + "/"));
  return [...new Set(points)].sort((a, b) => b.length - a.length);
}

/**
 * Unmounts everything at or below `dir` (with `below`, keeps a mount at `dir` itself: a child
 * template's overlay): what a chroot step mounted, and what a killed debootstrap left behind. A
 * busy mount is detached lazily, so it is gone from the tree before anything deletes it.
 */
export async function unmountUnder(dir: string, below = false): Promise<void> {
  for (const point of await mountsUnder(dir, below)) {
    // A lazy unmount only when the plain one fails (busy): if that fails too, its error stands.
    await run("umount", [point]).catch(() => run("umount", ["--lazy", point]));
  }
  const left = await mountsUnder(dir, below);
  if (left.length > 0)
    throw new BothyError("template_build_failed", `Could not unmount ${left.join(", ")}; remove them by hand.`);
}

/**
 * Deletes a build tree. It unmounts first and `rm --one-file-system` would still not cross into
 * a mount, because the tree bind-mounts the host's /dev while it builds.
 */
export async function removeTree(dir: string): Promise<void> {
  await unmountUnder(dir);
  await run("rm", ["-rf", "--one-file-system", "--", dir], { timeoutMs: 10 * 60_000 });
}

async function exists(p: string): Promise<boolean> {
  try {
    await lstat(p);
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return false;
    throw err;
  }
}

/**
 * Runs `fn` with the tree prepared for chroot work: /proc, /sys and the host's /dev mounted, the
 * host's resolv.conf in place of the tree's own, and a policy-rc.d so packages start no daemons.
 * Everything is undone in `finally`, whatever `fn` did.
 */
async function inChrootSession(tree: string, fn: () => Promise<void>): Promise<void> {
  const resolv = path.join(tree, "etc/resolv.conf");
  const savedResolv = path.join(tree, "etc/.resolv.conf.bothy-saved");
  const policy = path.join(tree, "usr/sbin/policy-rc.d");
  const hadResolv = await exists(resolv);
  const hadPolicy = await exists(policy);
  let savedOwn = false;
  let wrotePolicy = false;
  try {
    await run("mount", ["-t", "proc", "proc", path.join(tree, "proc")]);
    await run("mount", ["-t", "sysfs", "sysfs", path.join(tree, "sys")]);
    await run("mount", ["--bind", "/dev", path.join(tree, "dev")]);
    // rename, not copy: the tree's own may be a symlink, and must come back as one.
    if (hadResolv) {
      await rename(resolv, savedResolv);
      savedOwn = true;
    }
    await copyFile("/etc/resolv.conf", resolv, constants.COPYFILE_EXCL);
    if (!hadPolicy) {
      await writeFile(policy, "#!/bin/sh\n# bothy template build: start no services\nexit 101\n", { mode: 0o755 });
      wrotePolicy = true;
    }
    await fn();
  } finally {
    await unmountUnder(tree, true);
    if (wrotePolicy) await rm(policy, { force: true });
    if (savedOwn || !hadResolv) await rm(resolv, { force: true });
    if (savedOwn) await rename(savedResolv, resolv);
  }
}

function chroot(
  inputs: BuildInputs,
  args: readonly string[],
  env: Record<string, string>,
  onLine: (l: string) => void,
): Promise<void> {
  return runStreaming("chroot", [inputs.tree, ...args], { env, signal: inputs.signal, onLine });
}

/** The ordered steps for one template; the store adds its own `finalize`. */
export function planBuild(inputs: BuildInputs): BuildStep[] {
  const { template: t, tree } = inputs;
  const steps: BuildStep[] = [];
  const aptEnv = CHROOT_ENV;
  const commandEnv = { ...CHROOT_ENV, ...t.env };

  if (t.def.base !== undefined) {
    const suite = t.def.base.slice("debian/".length);
    steps.push({
      title: "debootstrap",
      run: async (onLine) => {
        await runStreaming("debootstrap", ["--variant=minbase", "--components=main", suite, tree, inputs.mirror], {
          env: { ...process.env, ...CHROOT_ENV },
          signal: inputs.signal,
          onLine,
        });
        // debootstrap copies the build host's resolv.conf and hostname; a template carries neither.
        await writeFile(path.join(tree, "etc/resolv.conf"), "# provided by the sandbox runtime\n");
        await writeFile(path.join(tree, "etc/hostname"), "bothy\n");
      },
    });
  } else {
    const over = inputs.overParent;
    if (over === undefined) throw new Error(`planBuild: "${t.name}" needs its parent's layers`);
    steps.push({
      title: "layer over parent",
      run: async (onLine) => {
        // The steps below write through the overlay: new and changed files land in `upper`, a
        // removed one becomes a whiteout there. Nothing of the parent is copied.
        await Promise.all([tree, over.upper, over.work].map((d) => mkdir(d, { mode: 0o755 })));
        const options = `lowerdir=${over.lowerDirs.join(":")},upperdir=${over.upper},workdir=${over.work}`;
        onLine(`overlay over ${over.lowerDirs.length} layer(s)`);
        await run("mount", ["-t", "overlay", "overlay", "-o", options, tree]);
      },
    });
  }

  if (t.def.packages.length > 0) {
    steps.push({
      title: "apt install",
      run: (onLine) =>
        inChrootSession(tree, async () => {
          const apt = [
            "apt-get",
            "-q",
            "-o",
            "Dpkg::Use-Pty=0",
            "-o",
            "Acquire::Retries=3",
            "-o",
            "Acquire::Languages=none",
          ];
          await chroot(inputs, [...apt, "update"], aptEnv, onLine);
          await chroot(
            inputs,
            [...apt, "install", "-y", "--no-install-recommends", "--", ...t.def.packages],
            aptEnv,
            onLine,
          );
        }),
    });
  }

  if (t.files.length > 0) {
    steps.push({
      title: "files",
      run: async (onLine) => {
        for (const [i, f] of t.files.entries()) {
          onLine(`${path.relative(t.dir, f.srcPath)} -> ${f.dest}`);
          // Staged at the tree's top, then installed from inside the chroot: a symlink in the
          // tree (say /etc -> /host/etc) then resolves inside the tree, never on the host.
          const staged = `.bothy-file-${i}`;
          await copyFile(f.srcPath, path.join(tree, staged), constants.COPYFILE_EXCL);
          try {
            await chroot(
              inputs,
              ["install", "-D", "-T", "-m", f.mode.toString(8), `/${staged}`, f.dest],
              aptEnv,
              onLine,
            );
          } finally {
            await unlink(path.join(tree, staged));
          }
        }
      },
    });
  }

  if (t.def.commands.length > 0) {
    steps.push({
      title: "commands",
      run: (onLine) =>
        inChrootSession(tree, async () => {
          for (const command of t.def.commands) {
            onLine(`$ ${command}`);
            await chroot(inputs, ["/bin/sh", "-c", command], commandEnv, onLine);
          }
        }),
    });
  }

  steps.push({
    title: "cleanup",
    run: async () => {
      // What apt rebuilds on its next `update`: downloaded packages, indexes, binary caches.
      await clearDir(path.join(tree, "var/cache/apt/archives"), (n) => n.endsWith(".deb"));
      await clearDir(path.join(tree, "var/cache/apt/archives/partial"), () => true);
      await clearDir(path.join(tree, "var/cache/apt"), (n) => n.endsWith(".bin"));
      await clearDir(path.join(tree, "var/lib/apt/lists"), () => true);
      await chmod(tree, 0o755);
    },
  });
  return steps;
}

async function clearDir(dir: string, match: (name: string) => boolean): Promise<void> {
  let names: string[];
  try {
    names = await readdir(dir);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return;
    throw err;
  }
  for (const name of names) {
    if (match(name) && name !== "partial") await rm(path.join(dir, name), { recursive: true, force: true });
  }
}
