// The agent's entry on the template's own Node (QEMU guests, and gVisor without a startup snapshot).
import { startAgent } from "./agent.ts";

startAgent();
