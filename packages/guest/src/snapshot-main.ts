// The agent's entry for a V8 startup snapshot (`node --build-snapshot`, see the server's
// drivers/agent-snapshot.ts): loading every module, the protocol's schemas above all, is done
// once on the host, and a sandbox's Node starts from the heap it left, straight into startAgent.
import { startupSnapshot } from "node:v8";
import { encodeFrame, FrameDecoder, hostFrame, PROTOCOL_GENERATION } from "@bothy/protocol";
import { startAgent } from "./agent.ts";

/**
 * The frames a new agent reads first, decoded and parsed once while the snapshot is built: their
 * code (the schemas' parsers, the codec) is then compiled in the snapshot, not on a sandbox's
 * start path, where V8's lazy compilation of it cost the first frames milliseconds under ptrace.
 * Pure functions only: nothing here may touch the process, whose state the snapshot must not hold.
 */
function warmUp(): void {
  const decoder = new FrameDecoder();
  const frames = [
    { t: "hello_ack", gen: PROTOCOL_GENERATION },
    { t: "limits", id: 1, max_processes: 1024 },
    { t: "exec", id: 2, cmd: "true", cwd: "/root", env: { A: "b" }, stdin: false },
    { t: "credit", id: 2, bytes: 65536 },
  ];
  for (let round = 0; round < 2; round++)
    for (const header of frames)
      for (const frame of decoder.push(encodeFrame(header, Buffer.alloc(0))))
        if (!hostFrame.safeParse(frame.header).success) throw new Error(`warm-up frame ${header.t} did not parse`);
}

warmUp();
startupSnapshot.setDeserializeMainFunction(startAgent);
