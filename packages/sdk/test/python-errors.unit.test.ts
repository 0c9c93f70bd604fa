/**
 * The Python SDK's error table (python/src/bothy/errors.py) against the protocol's registry: every
 * code has a Python exception class, none is left over, and a "not found" code is a NotFoundError
 * there too. Needs only python3 (the table imports nothing beyond the standard library).
 */
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { ERROR_CODES, ERROR_STATUS } from "@bothy/protocol";

const run = promisify(execFile);
const SRC = fileURLToPath(new URL("../../../python/src", import.meta.url));
const DUMP = `
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("errors", sys.argv[1] + "/bothy/errors.py")
errors = importlib.util.module_from_spec(spec)
spec.loader.exec_module(errors)
print(json.dumps({code: cls.__name__ for code, cls in errors.ERROR_CLASSES.items()}))
`;

async function pythonTable(): Promise<Record<string, string> | undefined> {
  try {
    return JSON.parse((await run("python3", ["-c", DUMP, SRC])).stdout) as Record<string, string>;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw err;
  }
}

const table = await pythonTable();

describe.skipIf(table === undefined)(
  `the Python SDK's error classes${table ? "" : " [skipped: needs python3]"}`,
  () => {
    it("has a class for every protocol error code and none the protocol lacks", () => {
      const python = Object.keys(table ?? {});
      expect(ERROR_CODES.filter((c) => !python.includes(c))).toEqual([]);
      expect(python.filter((c) => !(ERROR_CODES as readonly string[]).includes(c))).toEqual([]);
    });

    it("raises NotFoundError for every 404 code and AuthenticationError for 401", () => {
      for (const code of ERROR_CODES) {
        if (ERROR_STATUS[code] === 404) expect([code, table?.[code]]).toEqual([code, "NotFoundError"]);
        if (ERROR_STATUS[code] === 401) expect([code, table?.[code]]).toEqual([code, "AuthenticationError"]);
      }
    });
  },
);
