import { stateChangeCommand } from "./pause.ts";

export const resumeCommand = stateChangeCommand(
  "resume",
  "resume a paused sandbox",
  `usage: bothy resume ID [--json]

Resumes a paused sandbox where it left off.
`,
);
