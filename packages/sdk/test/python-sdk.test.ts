/**
 * The Python SDK (python/) as a user gets it: the wheel and sdist built offline with Debian's
 * python3-build, the wheel installed into a fresh venv outside the repository, and the sdist's own
 * pytest suite run from there with that venv's Python against a real `bothy serve` with real
 * sandboxes. The server runs in a network lab of its own (helpers/net-lab.ts), so the suite can
 * hold an egress request and approve it from Python. pytest's exit code decides.
 */
import { execFile } from "node:child_process";
import { mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { api } from "../../server/test/helpers/client.ts";
import { useNetLab } from "../../server/test/helpers/net-lab.ts";
import { NAMES, PUBLIC_HTTP } from "../../server/test/helpers/net-topology.ts";

const run = promisify(execFile);
const REPO = fileURLToPath(new URL("../../..", import.meta.url));
const PACKAGE = join(REPO, "python");
/** Debian's interpreter, where scripts/install-deps puts httpx, websockets, pytest and build. */
const PYTHON = "/usr/bin/python3";
const MODULES = ["httpx", "websockets", "pytest", "pytest_asyncio", "build", "hatchling", "venv"];
/** Building, the venv (with pip) and the install: about 20 s here; the suite well under two minutes. */
const SETUP_DEADLINE_MS = 180_000;
const PYTEST_DEADLINE_MS = 300_000;

async function missingModules(): Promise<string | undefined> {
  if (process.getuid?.() !== 0) return "root (sandboxes and the network lab)";
  const probe = `import importlib.util, sys; print(",".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))`;
  try {
    const { stdout } = await run(PYTHON, ["-c", probe, ...MODULES]);
    const missing = stdout.trim();
    return missing ? `the Python modules ${missing} (scripts/install-deps installs them)` : undefined;
  } catch {
    return `${PYTHON} (Debian's python3; scripts/install-deps)`;
  }
}

const missing = await missingModules();
const title = `the Python SDK: built, installed in a venv, its pytest suite against a real server [gvisor]${missing ? ` [skipped: needs ${missing}]` : ""}`;

describe.skipIf(missing !== undefined)(title, () => {
  const lab = useNetLab("pysdk");
  let dir = "";
  let venvPython = "";
  let suite = "";
  let dist: string[] = [];

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "bothy-pysdk-"));
    expect(relative(REPO, dir).startsWith("..")).toBe(true);
    // Offline: Debian's hatchling, no isolated build environment (PyPI is not reachable). Its
    // declared `editables` is only for editable installs, which Debian does not package.
    await run(
      PYTHON,
      ["-m", "build", "--no-isolation", "--skip-dependency-check", "--outdir", join(dir, "dist"), PACKAGE],
      {
        timeout: SETUP_DEADLINE_MS,
      },
    );
    dist = (await readdir(join(dir, "dist"))).sort();
    await run(PYTHON, ["-m", "venv", "--system-site-packages", join(dir, "venv")], { timeout: SETUP_DEADLINE_MS });
    venvPython = join(dir, "venv", "bin", "python");
    // No index: the declared httpx and websockets must be satisfied by what is installed (Debian's).
    await run(
      venvPython,
      ["-m", "pip", "install", "--no-index", "--no-cache-dir", join(dir, "dist", "bothy-0.1.0-py3-none-any.whl")],
      {
        timeout: SETUP_DEADLINE_MS,
      },
    );
    await run("tar", ["-xzf", join(dir, "dist", "bothy-0.1.0.tar.gz"), "-C", dir]);
    suite = join(dir, "bothy-0.1.0");
  });

  afterAll(async () => {
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it("builds a wheel and an sdist that carry the typed package, its README and its tests", async () => {
    expect(dist).toEqual(["bothy-0.1.0-py3-none-any.whl", "bothy-0.1.0.tar.gz"]);
    const wheel = (await run(venvPython, ["-m", "zipfile", "-l", join(dir, "dist", dist[0] ?? "")])).stdout;
    expect(wheel).toContain("bothy/py.typed");
    expect(wheel).not.toContain("tests/");
    const sdist = (await readdir(suite)).sort();
    expect(sdist).toEqual(expect.arrayContaining(["README.md", "pyproject.toml", "src", "tests"]));
  });

  it(
    "runs the pytest suite from outside the repository against the installed wheel",
    async () => {
      const env: NodeJS.ProcessEnv = {
        PATH: process.env["PATH"],
        HOME: process.env["HOME"],
        BOTHY_URL: lab.base,
        BOTHY_API_KEY: process.env["BOTHY_API_KEY"],
        BOTHY_EXPECT_SDK_UNDER: join(dir, "venv"),
        BOTHY_PROTOCOL_ERRORS_TS: join(REPO, "packages/protocol/src/errors.ts"),
        BOTHY_TEST_EGRESS_HOST: NAMES.api,
        BOTHY_TEST_EGRESS_OTHER_HOST: NAMES.other,
        BOTHY_TEST_EGRESS_ADDRESS: PUBLIC_HTTP,
        // The desktop template is built by the test setup already; its sandbox costs ~20 s here.
        BOTHY_TEST_DESKTOP: "1",
      };
      let out = "";
      let code = 0;
      try {
        const r = await run(venvPython, ["-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider", "tests"], {
          cwd: suite,
          env,
          timeout: PYTEST_DEADLINE_MS,
          maxBuffer: 16 * 1024 * 1024,
        });
        out = r.stdout + r.stderr;
      } catch (err) {
        const e = err as { code?: unknown; stdout?: string; stderr?: string };
        if (typeof e.code !== "number") throw err;
        code = e.code;
        out = `${e.stdout ?? ""}${e.stderr ?? ""}`;
      }
      expect(code, out).toBe(0);
      // These must have run, not skipped: the installed package and the held egress request.
      expect(out).toMatch(/test_installed\.py::test_the_installed_package_is_the_one_under_test PASSED/);
      expect(out).toMatch(/test_egress\.py::test_a_held_request_is_watched_and_approved_from_python PASSED/);
      expect(out).toMatch(/test_errors_unit\.py::test_every_protocol_code_has_a_class PASSED/);
      expect(out).toMatch(/test_desktop\.py::test_screenshot_mouse_keyboard_and_viewer_link PASSED/);
      // The suite killed every sandbox it made (some may still be finishing their teardown).
      const left = (await api(lab.base, "GET", "/sandboxes")).json["sandboxes"] as Array<{ state: string }>;
      expect(left.filter((s) => s.state !== "deleting")).toEqual([]);
    },
    PYTEST_DEADLINE_MS + 60_000,
  );
});
