import { accessSync, constants } from "node:fs";
import { delimiter, join } from "node:path";
import { DRIVER_NAMES, type DriverName } from "@bothy/protocol";

export interface TestDriver {
  name: DriverName;
  /** Why this machine cannot run the driver's tests, or undefined when it can. */
  missing: string | undefined;
}

function onPath(program: string): boolean {
  return (process.env["PATH"] ?? "").split(delimiter).some((dir) => {
    try {
      accessSync(join(dir, program), constants.X_OK);
      return true;
    } catch {
      return false;
    }
  });
}

const NEEDS: Record<DriverName, Array<[string, string]>> = {
  gvisor: [["runsc", "runsc (apt-get install runsc)"]],
  qemu: [
    ["qemu-system-x86_64", "qemu-system-x86_64 (apt-get install qemu-system-x86)"],
    ["qemu-img", "qemu-img (apt-get install qemu-utils)"],
    ["gcc", "gcc and libc6-dev for the guest helper"],
    ["mkfs.ext4", "mkfs.ext4 (e2fsprogs)"],
    ["apt-get", "apt-get, to fetch linux-image-cloud-amd64"],
  ],
};

/**
 * The drivers the integration tests run against: `BOTHY_TEST_DRIVERS` (comma-separated), or all.
 * A driver the run names (or every driver, when it names none) must be runnable here: one whose
 * tools are missing fails the test file at load, saying what it needs, instead of skipping its
 * tests (a green run means they ran). Leave a driver out of BOTHY_TEST_DRIVERS to not test it;
 * the tests that need it are then skipped as test/allowed-skips.json allows.
 */
export function testDrivers(): TestDriver[] {
  const wanted = (process.env["BOTHY_TEST_DRIVERS"] ?? DRIVER_NAMES.join(","))
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean);
  return DRIVER_NAMES.filter((d) => wanted.includes(d)).map((name) => {
    const missing = driverMissing(name);
    if (missing !== undefined)
      throw new Error(
        `BOTHY_TEST_DRIVERS selects ${name}${process.env["BOTHY_TEST_DRIVERS"] === undefined ? " (unset: every driver)" : ""}, ` +
          `but this machine lacks ${missing}: install it, or leave ${name} out (e.g. BOTHY_TEST_DRIVERS=${DRIVER_NAMES.filter((d) => d !== name).join(",")}).`,
      );
    return { name, missing };
  });
}

/**
 * `name` as the run selects it: for a suite that needs that one driver. Left out of
 * BOTHY_TEST_DRIVERS, it is missing for that reason, and the suite is skipped as listed.
 */
export function testDriver(name: DriverName): TestDriver {
  return testDrivers().find((d) => d.name === name) ?? { name, missing: `BOTHY_TEST_DRIVERS to include ${name}` };
}

/** What this machine lacks to run `name`'s sandboxes, or undefined when it has it all. */
export function driverMissing(name: DriverName): string | undefined {
  const lacking = NEEDS[name].filter(([program]) => !onPath(program)).map(([, what]) => what);
  if (process.getuid?.() !== 0) lacking.push("root");
  return lacking.length > 0 ? lacking.join(", ") : undefined;
}

/** A describe title that says why it is skipped, when it is. */
export function driverTitle(d: TestDriver, title: string): string {
  return d.missing ? `${title} [${d.name}: skipped, needs ${d.missing}]` : `${title} [${d.name}]`;
}
