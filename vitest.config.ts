import { defaultClientConditions, defaultServerConditions } from "vite";
import { defineConfig } from "vitest/config";

// Tests run the workspace packages from their TypeScript sources (the "@bothy/source" export
// condition), not from the dist/ that a build left behind.
const sourceFirst = {
  resolve: { conditions: ["@bothy/source", ...defaultClientConditions] },
  ssr: { resolve: { conditions: ["@bothy/source", ...defaultServerConditions] } },
};

export default defineConfig({
  test: {
    // After every run: each skipped test and why; a skip test/allowed-skips.json does not name fails the run.
    reporters: ["default", "./test/skip-report.ts"],
    projects: [
      {
        ...sourceFirst,
        test: {
          name: "unit",
          include: ["packages/*/test/**/*.unit.test.ts"],
        },
      },
      {
        ...sourceFirst,
        test: {
          name: "integration",
          include: ["packages/*/test/**/*.test.ts"],
          exclude: ["packages/*/test/**/*.unit.test.ts"],
          globalSetup: ["test/global-setup.ts"],
          // Every server and client of a test file shares one admin key (test/auth-setup.ts).
          setupFiles: ["test/auth-setup.ts"],
          testTimeout: 120_000,
          hookTimeout: 600_000,
          // Sandboxes are real and this machine has 2 cores: one file at a time.
          fileParallelism: false,
        },
      },
    ],
  },
});
