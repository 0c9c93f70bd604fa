/**
 * The dashboard's weight as a browser downloads it: each built file of packages/ui/dist/assets
 * raw and gzipped, and the UI's own JavaScript (without xterm.js, which loads with the terminal
 * only) against the 150 KB gzip goal. Run `npm run build` first; `npx tsx bench/ui-size.ts`.
 */
import { readdir, readFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { gzipSync } from "node:zlib";

const ASSETS = fileURLToPath(new URL("../packages/ui/dist/assets/", import.meta.url));
const GOAL_KB = 150;
/** Chunks of libraries loaded with one view only, not counted as the UI's own code. */
const LIBRARIES = /^(xterm|addon-fit)-/;

const files = (await readdir(ASSETS)).sort();
let own = 0;
console.log("file".padEnd(32), "raw KB".padStart(8), "gzip KB".padStart(8));
for (const name of files) {
  const body = await readFile(`${ASSETS}${name}`);
  const gz = gzipSync(body, { level: 9 }).length;
  if (name.endsWith(".js") && !LIBRARIES.test(name)) own += gz;
  console.log(name.padEnd(32), (body.length / 1024).toFixed(1).padStart(8), (gz / 1024).toFixed(1).padStart(8));
}
console.log(
  `UI's own JavaScript: ${(own / 1024).toFixed(1)} KB gzip (goal < ${GOAL_KB} KB, ${((own / 1024 / GOAL_KB) * 100).toFixed(0)}% of it)`,
);
