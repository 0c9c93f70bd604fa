import type { SandboxRow } from "../../src/ledger/ledger.ts";
import type { LedgerStore } from "../../src/ledger/store.ts";

/** A running seed sandbox's row on the fake driver, 1 vCPU, 256 MiB: what tests insert by default. */
export const TEST_SANDBOX_ROW = {
  template: "seed",
  template_hash: "h",
  driver: "fake",
  acceleration: "none",
  vcpu: 1,
  memory_mib: 256,
  state: "running",
} as const;

/** A running seed sandbox's row (fake driver, 1 vCPU, 256 MiB) in `ledger`, `row` on top. */
export function insertTestSandbox(
  ledger: LedgerStore,
  row: Partial<Parameters<LedgerStore["insertSandbox"]>[0]> & { id: string },
): Promise<SandboxRow> {
  return ledger.insertSandbox({ ...TEST_SANDBOX_ROW, ...row });
}
