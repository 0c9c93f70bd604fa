/**
 * bench/disk-chain: what a template's QEMU disks take on the host, as a qcow2 chain that follows
 * its layers (images/disk-chain.ts: the base a raw ext4, each child only the clusters its layer
 * changed) against one whole raw ext4 image per template (how QEMU stored them before: each child
 * held its parents' files again). Prints each layer's figures and the totals; no pass/fail.
 *
 *   npx tsx bench/disk-chain.ts [TEMPLATE_OR_LAYER_ID] [STORE_DIR]
 *
 * Default: `workstation` in the tests' template cache (build it first). Both kinds of image are
 * made on first use and kept beside each layer's tree, like the server's own.
 */
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import path from "node:path";
import { promisify } from "node:util";
import { TemplateStore } from "../packages/server/src/index.ts";
import { ensureDiskImage } from "../packages/server/src/images/disk-chain.ts";
import { ensureExt4Image } from "../packages/server/src/images/ext4-image.ts";
import { LayerStore } from "../packages/server/src/images/layer-store.ts";
import { testTemplatesDir } from "../test/paths.ts";
import { header, repoRoot } from "./bench-util.ts";

const pexec = promisify(execFile);
const name = process.argv[2] ?? "workstation";
const storeDir = process.argv[3] ?? testTemplatesDir();
const mib = (b: number): string => `${(b / 1024 / 1024).toFixed(0)} MiB`;
/** Bytes a file takes on the host's disk (its allocated blocks; images are sparse). */
const allocated = async (file: string): Promise<number> =>
  Number((await pexec("du", ["-B1", file])).stdout.split(/\s/)[0]);

console.log(await header());
const layers = new LayerStore(storeDir);
let top = name;
if (!existsSync(path.join(layers.dir, name))) {
  const built = await new TemplateStore({ sourceDir: `${repoRoot}templates`, storeDir }).resolve(name);
  if (!built) {
    console.error(`${name} is not built in ${storeDir}: build it (bothy template build ${name}) first`);
    process.exit(1);
  }
  top = path.basename(path.dirname(built.rootfs));
}
const chain = (await layers.chain(top)).reverse();
let wholeTotal = 0;
let chainTotal = 0;
console.log("layer | whole image (before) | chain member (now) | chain member made in");
for (const layer of chain) {
  const t0 = Date.now();
  const member = await ensureDiskImage(layer.tree);
  const ms = Date.now() - t0;
  const whole = await allocated(await ensureExt4Image(layer.tree));
  const own = await allocated(member.path);
  wholeTotal += whole;
  chainTotal += own;
  console.log(`${layer.id} | ${mib(whole)} | ${mib(own)} ${member.format} | ${(ms / 1000).toFixed(1)} s`);
}
console.log(
  `all ${chain.length} templates: ${mib(wholeTotal)} as whole images, ${mib(chainTotal)} as one chain ` +
    `(${(chainTotal / wholeTotal).toFixed(2)}x)`,
);
