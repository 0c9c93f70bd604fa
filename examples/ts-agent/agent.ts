/**
 * A minimal tool-using agent loop: the model sees the task and every tool result so far and
 * answers either the next tool call or its final answer; the loop runs each call in the sandbox.
 * The model is any function of that shape: `stub-model.ts` plays a script (for tests, offline);
 * README.md shows a real model's client in its place.
 */
import type { Sandbox } from "@bothy/sdk";
import { runTool, type ToolCall, type ToolResult } from "./tools.ts";

export type Message =
  | { role: "user"; content: string }
  | { role: "assistant"; call: ToolCall }
  | { role: "tool"; tool: ToolCall["tool"]; result: ToolResult };

export type ModelTurn = { call: ToolCall } | { final: string };

/** What the loop needs of a model: the conversation so far in, the next turn out. */
export type Model = (messages: readonly Message[]) => Promise<ModelTurn>;

export interface AgentRun {
  final: string;
  messages: Message[];
}

export async function runAgent(model: Model, sandbox: Sandbox, task: string, maxSteps = 20): Promise<AgentRun> {
  const messages: Message[] = [{ role: "user", content: task }];
  for (let step = 0; step < maxSteps; step++) {
    const turn = await model(messages);
    if ("final" in turn) return { final: turn.final, messages };
    messages.push({ role: "assistant", call: turn.call });
    messages.push({ role: "tool", tool: turn.call.tool, result: await runTool(sandbox, turn.call) });
  }
  throw new Error(`The model gave no final answer within ${maxSteps} steps.`);
}
