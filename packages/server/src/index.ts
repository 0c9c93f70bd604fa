export { loadConfig, type Config } from "./config.ts";
export { startServer, createLogger, type BothyServer } from "./server.ts";
export { TemplateStore, type BuiltTemplate, type BuildProgress } from "./images/template-store.ts";
export { openStore, type LedgerStore } from "./ledger/store.ts";
export { GvisorDriver } from "./drivers/gvisor-driver.ts";
export {
  describeLayout,
  hostCgroupLayout,
  HOST_LIMITS_ENV,
  limitsProblem,
  parseCgroupLayout,
  sandboxCgroupDirs,
  type CgroupLayout,
} from "./drivers/host-cgroups.ts";
