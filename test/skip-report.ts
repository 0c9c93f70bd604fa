import { fileURLToPath } from "node:url";
import type { Reporter, TestModule, Vitest } from "vitest/node";
import { judgeSkips, loadAllowedSkips, selectedDrivers, type SkippedTest } from "./skip-policy.ts";

const DEFAULT_LIST = fileURLToPath(new URL("./allowed-skips.json", import.meta.url));

/**
 * Prints, after every run, each skipped test and why; and fails the run (exit code 1) when a test
 * was skipped that `test/allowed-skips.json` does not name (skip-policy.ts). A run narrowed by
 * name (`-t`) skips the tests it filtered out: it prints them but does not judge them.
 * BOTHY_ALLOWED_SKIPS names another list (the reporter's own test uses one).
 */
export default class SkipReport implements Reporter {
  private filtered = false;

  onInit(vitest: Vitest): void {
    this.filtered = vitest.config.testNamePattern !== undefined;
  }

  onTestRunEnd(testModules: ReadonlyArray<TestModule>): void {
    const skipped: SkippedTest[] = [];
    for (const m of testModules) {
      for (const t of m.children.allTests()) {
        const result = t.result();
        if (result.state !== "skipped") continue;
        skipped.push({ file: m.relativeModuleId, name: t.fullName, note: result.note });
      }
    }
    const out = process.stdout;
    if (skipped.length === 0) {
      out.write("\nskipped: none\n");
      return;
    }
    if (this.filtered) {
      out.write(`\nskipped: ${skipped.length} tests (a run narrowed with -t; skips not checked)\n`);
      return;
    }
    const list = process.env["BOTHY_ALLOWED_SKIPS"] ?? DEFAULT_LIST;
    const verdict = judgeSkips(skipped, loadAllowedSkips(list), selectedDrivers());
    out.write(`\nskipped: ${skipped.length} tests\n`);
    for (const t of verdict.allowed) out.write(`  - ${t.file} > ${t.name}\n      why: ${t.reason}\n`);
    if (verdict.unlisted.length === 0) return;
    out.write(`\nskipped without a reason in ${list}: ${verdict.unlisted.length} tests (the run fails)\n`);
    for (const t of verdict.unlisted)
      out.write(`  - ${t.file} > ${t.name}${t.note === undefined ? "" : ` (note: ${t.note})`}\n`);
    out.write(
      "  Run what they need (a driver named in BOTHY_TEST_DRIVERS must have its tools), or list each with its reason.\n",
    );
    process.exitCode = 1;
  }
}
