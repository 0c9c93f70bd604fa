/** One CLI command: its usage text and what it does; `run` answers the process exit status. */
export interface Command {
  /** How it is typed after `bothy`, e.g. "template build". */
  name: string;
  /** One line for `bothy --help`. */
  summary: string;
  usage: string;
  run(args: string[]): Promise<number>;
}
