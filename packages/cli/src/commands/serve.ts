import { createLogger, loadConfig, startServer, TemplateStore } from "@bothy/server";
import { templateBuild } from "./template-build.ts";

/** `bothy serve`: builds the default template on first run, then serves until SIGINT/SIGTERM. */
export async function serve(_args: string[]): Promise<number> {
  const config = loadConfig();
  const store = new TemplateStore({ sourceDir: config.templateSources, storeDir: config.templatesDir });
  if (!(await store.resolve("seed"))) {
    process.stderr.write("bothy: building the default template `seed` (first run; a few minutes)\n");
    const code = await templateBuild(["seed"]);
    if (code !== 0) return code;
  }
  // A start-up step that waits on nothing that can wake it would let Node exit 0 in silence.
  const stalled = (): void => {
    process.stderr.write(
      "bothy: start-up stalled (a step waited on nothing that could finish it); this is a bug, please report it\n",
    );
    process.exit(1);
  };
  process.once("beforeExit", stalled);
  const server = await startServer(config, createLogger(config));
  process.off("beforeExit", stalled);
  void server.manager.warm("seed");
  await new Promise<void>((resolve) => {
    const stop = (signal: string): void => {
      process.stderr.write(`bothy: ${signal}, stopping sandboxes and exiting\n`);
      resolve();
    };
    process.once("SIGINT", () => stop("SIGINT"));
    process.once("SIGTERM", () => stop("SIGTERM"));
  });
  await server.close();
  return 0;
}
