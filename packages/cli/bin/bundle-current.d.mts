/** Whether dist/ was built from the files as they are now (see bundle-current.mjs). */
export function bundleIsCurrent(cliDir: string): boolean;
/** Whether this command line runs from the bundle: an API command, a current bundle, no BOTHY_CLI_SOURCE=1. */
export function runsFromBundle(cliDir: string, argv: readonly string[], env?: NodeJS.ProcessEnv): boolean;
