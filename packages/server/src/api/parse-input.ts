import type { z } from "zod";
import { BothyError } from "@bothy/protocol";

/** Parses a request part with its schema; the first problem becomes a 400 naming where it is. */
export function parseInput<T extends z.ZodType>(schema: T, value: unknown, what: string): z.output<T> {
  // No body means the defaults; JSON null is a body of the wrong type.
  const parsed = schema.safeParse(value === undefined ? {} : value);
  if (parsed.success) return parsed.data;
  const issue = parsed.error.issues[0];
  const where = issue?.path.length ? `${issue.path.join(".")}: ` : "";
  throw new BothyError("invalid_request", `${what}: ${where}${issue?.message ?? "invalid"}.`);
}
