import { fileURLToPath } from "node:url";
import { TemplateStore } from "../packages/server/src/images/template-store.ts";
import { testTemplatesDir } from "./paths.ts";

/**
 * Integration tests need the `seed`, `charts`, `code-interpreter`, `workspace`, `desktop`, `fullstack` and `workstation` templates. They are built
 * once into a persistent
 * cache (keyed by the template's content hash), so only the first run on a machine pays for debootstrap and apt.
 */
export default async function setup(): Promise<void> {
  const store = new TemplateStore({
    sourceDir: fileURLToPath(new URL("../templates", import.meta.url)),
    storeDir: testTemplatesDir(),
  });
  // charts (seed + matplotlib and pandas, ~70 s) is for the agent tools' flow tests; workspace
  // (~3 min, 2.6 GB) is the conversations' default computer, checked by workspace-template.test.ts;
  // code-interpreter (charts + ipykernel, ~2 min) serves @e2b/code-interpreter in e2b-code-interpreter.test.ts;
  // desktop (seed + Xvfb, Chromium, x11vnc; ~64 s, 1.1 GB) is for desktop.test.ts.
  // fullstack (code-runtime + PostgreSQL, Redis, build tools, Podman; 55-100 s over code-runtime, 1.2 GB)
  // is for fullstack-template.test.ts.
  // workstation (fullstack + desktop's packages and Python's psycopg2 and redis; layered on the built
  // fullstack) is for workstation.test.ts.
  for (const name of ["seed", "charts", "code-interpreter", "workspace", "desktop", "fullstack", "workstation"]) {
    if (await store.resolve(name)) continue;
    process.stderr.write(`building template ${name} into ${testTemplatesDir()} (first run only)\n`);
    await store.build(name, {
      onProgress: (ev) => {
        if (ev.line === undefined) process.stderr.write(`[${ev.step}/${ev.steps}] ${ev.title}\n`);
      },
    });
  }
}
