// Bundles the agent into one file that runs on the template's Node (bookworm ships Node 18).
import { build } from "esbuild";
import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

const here = fileURLToPath(new URL(".", import.meta.url));
const bundle = {
  bundle: true,
  platform: "node",
  target: "node18",
  format: "esm",
  // @bothy/protocol from its sources (its export condition), not from a dist/ built earlier.
  conditions: ["@bothy/source"],
  minify: true,
  legalComments: "none",
  logLevel: "warning",
};
await build({ ...bundle, entryPoints: [`${here}src/main.ts`], outfile: `${here}dist/agent.mjs` });
// The same agent as one script for a V8 startup snapshot, which the server builds with the Node
// that runs the agent in gVisor (server/src/drivers/agent-snapshot.ts): `--build-snapshot` takes
// a single CommonJS script.
await build({
  ...bundle,
  target: "node20",
  format: "cjs",
  entryPoints: [`${here}src/snapshot-main.ts`],
  outfile: `${here}dist/agent-snapshot.cjs`,
});
// The image downscaler the agent tools copy into a sandbox to run there (see image-shrink.ts).
await build({
  ...bundle,
  entryPoints: [`${here}src/image-shrink-main.ts`],
  outfile: `${here}dist/image-shrink.mjs`,
  // pngjs is CommonJS: give the ESM bundle a require for its Node built-ins.
  banner: {
    js: 'import { createRequire as bothyRequire } from "node:module"; const require = bothyRequire(import.meta.url);',
  },
});

// The desktop's helper (start, the screenshot server), copied into sandboxes of the desktop template (see desktop-main.ts).
await build({
  ...bundle,
  entryPoints: [`${here}src/desktop-main.ts`],
  outfile: `${here}dist/desktop.mjs`,
  banner: {
    js: 'import { createRequire as bothyRequire } from "node:module"; const require = bothyRequire(import.meta.url);',
  },
});

// gVisor compatibility shim, preloaded into every process of a gVisor sandbox (see the C file).
// Built here with the host's compiler: the host and the templates are both Debian bookworm.
execFileSync(
  "gcc",
  ["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", `${here}dist/statx-compat.so`, `${here}native/statx-compat.c`],
  { stdio: "inherit" },
);
writeFileSync(`${here}dist/ld.so.preload`, "/opt/bothy/statx-compat.so\n");
// PID 1 of gVisor sandboxes: the host channel's native front, starts the agent on demand and
// reaps orphans (see the C files).
execFileSync(
  "gcc",
  [
    "-static",
    "-O2",
    "-Wall",
    "-Werror",
    "-o",
    `${here}dist/bothy-init`,
    ...["bothy-init.c", "agent-start.c", "front.c", "frames.c"].map((f) => `${here}native/${f}`),
  ],
  { stdio: "inherit" },
);
// The front's frame reader and header classifier alone, for their unit test (native-frames.unit.test.ts).
execFileSync(
  "gcc",
  [
    "-O2",
    "-Wall",
    "-Werror",
    "-o",
    `${here}dist/frames-check`,
    `${here}native/frames-check.c`,
    `${here}native/frames.c`,
  ],
  { stdio: "inherit" },
);
// The guest helper (identity, disk growth, the command spawner), for gVisor sandboxes; the QEMU
// initramfs compiles its own from the same sources (server/src/images/initramfs.ts).
execFileSync(
  "gcc",
  [
    "-static",
    "-O2",
    "-Wall",
    "-Werror",
    "-o",
    `${here}dist/bothy-helper`,
    `${here}native/bothy-helper.c`,
    `${here}native/spawner.c`,
  ],
  { stdio: "inherit" },
);
// The host's waiter on a gVisor container in place of a resident `runsc run` (see the C file):
// it runs on the host, beside the server, and is built here with the other native programs.
execFileSync(
  "gcc",
  ["-static", "-O2", "-Wall", "-Werror", "-o", `${here}dist/runsc-waiter`, `${here}native/runsc-waiter.c`],
  { stdio: "inherit" },
);
