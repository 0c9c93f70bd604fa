import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    projects: [
      {
        test: {
          name: "unit",
          include: ["packages/*/test/**/*.unit.test.ts"],
        },
      },
      {
        test: {
          name: "integration",
          include: ["packages/*/test/**/*.test.ts"],
          exclude: ["packages/*/test/**/*.unit.test.ts"],
          globalSetup: ["test/global-setup.ts"],
          testTimeout: 120_000,
          hookTimeout: 600_000,
          // Sandboxes are real and this machine has 2 cores: one file at a time.
          fileParallelism: false,
        },
      },
    ],
  },
});
