import { join } from "node:path";
import { LayerStore } from "../images/layer-store.ts";
import { run } from "../util/host-command.ts";

/**
 * The server's own layer store for snapshots, `$BOTHY_HOME/snapshots/layers/`: apart from the
 * templates' (BOTHY_TEMPLATES_DIR may be shared by several servers, whose sweeps know nothing of
 * this server's snapshots). A snapshot's layer names its parent there by `parentDir`.
 */
export function snapshotLayerStore(home: string): LayerStore {
  return new LayerStore(join(home, "snapshots"));
}

/** Where captures are assembled before their layer is published (outside `layers/`, which the sweep owns). */
export function snapshotStagingDir(home: string): string {
  return join(home, "snapshots", ".staging");
}

/** Bytes of the files under `dir` (apparent sizes, as `du -sb`). */
export async function treeBytes(dir: string): Promise<number> {
  const { stdout } = await run("du", ["-sb", "--", dir], { timeoutMs: 5 * 60_000 });
  const bytes = Number(stdout.split("\t")[0]);
  if (!Number.isFinite(bytes)) throw new Error(`du gave no size for ${dir}: ${stdout.slice(0, 200)}`);
  return bytes;
}
