import { cpus, totalmem } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { z } from "zod";

const int = (def: number) => z.coerce.number().int().positive().default(def);

const envSchema = z.object({
  BOTHY_HOST: z.string().default("127.0.0.1"),
  BOTHY_PORT: z.coerce.number().int().min(0).max(65535).default(8080),
  BOTHY_HOME: z.string().default("/var/lib/bothy"),
  BOTHY_TEMPLATES_DIR: z.string().optional(),
  BOTHY_MAX_VCPU: int(cpus().length),
  BOTHY_MAX_MEMORY_MIB: int(Math.max(1024, Math.floor(totalmem() / 1024 / 1024 / 2))),
  BOTHY_MAX_SANDBOXES: int(64),
  BOTHY_POOL_SIZE: z.coerce.number().int().min(0).max(32).default(1),
  BOTHY_LOG_LEVEL: z.enum(["fatal", "error", "warn", "info", "debug", "trace", "silent"]).default("info"),
  BOTHY_BOOT_TIMEOUT_S: int(60),
  BOTHY_WEBHOOK_URL: z.url({ protocol: /^https?$/ }).optional(),
  BOTHY_WEBHOOK_RETRY_MS: int(1000),
  BOTHY_COMMAND_REPLAY_BYTES: int(1024 * 1024),
});

export interface Config {
  host: string;
  port: number;
  home: string;
  templatesDir: string;
  templateSources: string;
  agentPath: string;
  limits: { minVcpu: number; maxVcpu: number; minMemoryMib: number; maxMemoryMib: number; maxSandboxes: number };
  poolSize: number;
  logLevel: z.infer<typeof envSchema>["BOTHY_LOG_LEVEL"];
  bootTimeoutMs: number;
  bodyLimitBytes: number;
  webhook: { url: string; retryBaseMs: number } | undefined;
  commandReplayBytes: number;
}

const repoRoot = fileURLToPath(new URL("../../../", import.meta.url));

/** Reads the configuration from the environment; a bad value stops start-up with its name. */
export function loadConfig(env: NodeJS.ProcessEnv = process.env, overrides: Partial<Config> = {}): Config {
  const parsed = envSchema.safeParse(env);
  if (!parsed.success) {
    const issues = parsed.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`).join("; ");
    throw new Error(`Invalid configuration: ${issues}`);
  }
  const e = parsed.data;
  return {
    host: e.BOTHY_HOST,
    port: e.BOTHY_PORT,
    home: e.BOTHY_HOME,
    templatesDir: e.BOTHY_TEMPLATES_DIR ?? join(e.BOTHY_HOME, "templates"),
    templateSources: join(repoRoot, "templates"),
    agentPath: join(repoRoot, "packages/guest/dist/agent.mjs"),
    limits: { minVcpu: 1, maxVcpu: e.BOTHY_MAX_VCPU, minMemoryMib: 128, maxMemoryMib: e.BOTHY_MAX_MEMORY_MIB, maxSandboxes: e.BOTHY_MAX_SANDBOXES },
    poolSize: e.BOTHY_POOL_SIZE,
    logLevel: e.BOTHY_LOG_LEVEL,
    bootTimeoutMs: e.BOTHY_BOOT_TIMEOUT_S * 1000,
    bodyLimitBytes: 1024 * 1024,
    webhook: e.BOTHY_WEBHOOK_URL === undefined ? undefined : { url: e.BOTHY_WEBHOOK_URL, retryBaseMs: e.BOTHY_WEBHOOK_RETRY_MS },
    commandReplayBytes: e.BOTHY_COMMAND_REPLAY_BYTES,
    ...overrides,
  };
}
