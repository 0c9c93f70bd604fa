// The agent's entry for a V8 startup snapshot (`node --build-snapshot`, see the server's
// drivers/agent-snapshot.ts): loading every module, the protocol's schemas above all, is done
// once on the host, and a sandbox's Node starts from the heap it left, straight into startAgent.
import { startupSnapshot } from "node:v8";
import { startAgent } from "./agent.ts";

startupSnapshot.setDeserializeMainFunction(startAgent);
