import { execFile } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { testDrivers } from "./helpers/drivers.ts";
import { judgeSkips, loadAllowedSkips, selectedDrivers, type AllowedSkip } from "../../../test/skip-policy.ts";

const pexec = promisify(execFile);
const repo = fileURLToPath(new URL("../../../", import.meta.url));

describe("which skips a run may have", () => {
  const entries: AllowedSkip[] = [
    { file: "a.test.ts", reason: "needs PyPI" },
    { file: "b.test.ts", test: "x [gvisor] > pauses", reason: "QEMU only" },
    { file: "c.test.ts", test: "QEMU > boots", reason: "qemu left out", unlessDriver: "qemu" },
  ];
  const t = (file: string, name: string) => ({ file, name, note: undefined });

  it("allows a listed skip with its reason and refuses any other", () => {
    const v = judgeSkips(
      [t("a.test.ts", "anything"), t("b.test.ts", "x [gvisor] > pauses"), t("b.test.ts", "x [gvisor] > other")],
      entries,
      () => true,
    );
    expect(v.allowed.map((a) => a.reason)).toEqual(["needs PyPI", "QEMU only"]);
    expect(v.unlisted).toEqual([t("b.test.ts", "x [gvisor] > other")]);
  });

  it("allows a driver's skip only while BOTHY_TEST_DRIVERS leaves that driver out", () => {
    const skipped = [t("c.test.ts", "QEMU > boots")];
    const gvisorOnly = selectedDrivers({ BOTHY_TEST_DRIVERS: "gvisor" });
    expect(judgeSkips(skipped, entries, gvisorOnly).unlisted).toEqual([]);
    expect(judgeSkips(skipped, entries, selectedDrivers({ BOTHY_TEST_DRIVERS: "gvisor,qemu" })).unlisted).toEqual(
      skipped,
    );
    expect(judgeSkips(skipped, entries, selectedDrivers({})).unlisted).toEqual(skipped); // unset: every driver
  });

  it("the checked-in list parses and gives every entry a reason", () => {
    const list = loadAllowedSkips(join(repo, "test/allowed-skips.json"));
    expect(list.length).toBeGreaterThan(0);
    for (const entry of list) expect(entry.reason.length).toBeGreaterThan(10);
  });
});

describe("a driver the run names", () => {
  it("fails the test file when its tools are missing, instead of skipping its tests", () => {
    const saved = { path: process.env["PATH"], drivers: process.env["BOTHY_TEST_DRIVERS"] };
    try {
      process.env["PATH"] = "/nonexistent";
      process.env["BOTHY_TEST_DRIVERS"] = "qemu";
      expect(() => testDrivers()).toThrow(/selects qemu, but this machine lacks qemu-system-x86_64.*leave qemu out/);
      delete process.env["BOTHY_TEST_DRIVERS"];
      expect(() => testDrivers()).toThrow(/\(unset: every driver\)/);
      process.env["BOTHY_TEST_DRIVERS"] = "";
      expect(testDrivers()).toEqual([]); // named none: none is tested, nothing is missing
    } finally {
      process.env["PATH"] = saved.path;
      if (saved.drivers === undefined) delete process.env["BOTHY_TEST_DRIVERS"];
      else process.env["BOTHY_TEST_DRIVERS"] = saved.drivers;
    }
  });
});

describe("the skip report in a real vitest run", () => {
  let dir: string;
  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), "bothy-skips-"));
    // `globals`: the fixture's test file needs no import of vitest from outside the repository.
    await writeFile(
      join(dir, "vitest.config.mjs"),
      `export default { test: { globals: true, include: ["*.test.mjs"], reporters: ["default", ${JSON.stringify(join(repo, "test/skip-report.ts"))}] } };\n`,
    );
    await writeFile(
      join(dir, "fixture.test.mjs"),
      `it("runs", () => {});\nit.skip("needs a listed thing", () => {});\nit.skipIf(true)("needs what nobody listed", () => {});\n`,
    );
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  async function run(skips: AllowedSkip[]): Promise<{ code: number; out: string }> {
    await writeFile(join(dir, "allowed.json"), JSON.stringify({ skips }));
    const vitest = join(repo, "node_modules/vitest/vitest.mjs");
    return pexec(process.execPath, [vitest, "run", "--root", dir], {
      cwd: dir,
      env: { ...process.env, BOTHY_ALLOWED_SKIPS: join(dir, "allowed.json"), CI: "1" },
    }).then(
      (r) => ({ code: 0, out: r.stdout }),
      (err: { code: number; stdout: string }) => ({ code: err.code, out: err.stdout }),
    );
  }

  it("prints each skip with its reason, and fails the run on one the list does not name", async () => {
    const listed = { file: "fixture.test.mjs", test: "needs a listed thing", reason: "the machine lacks it" };
    const failing = await run([listed]);
    expect(failing.out).toContain("why: the machine lacks it");
    expect(failing.out).toMatch(/skipped without a reason in .*allowed\.json: 1 tests[\s\S]*needs what nobody listed/);
    expect(failing.code).toBe(1);
    const passing = await run([listed, { file: "fixture.test.mjs", reason: "the whole file may skip" }]);
    expect(passing.out).toContain("skipped: 2 tests");
    expect(passing.code).toBe(0);
  }, 60_000);
});
