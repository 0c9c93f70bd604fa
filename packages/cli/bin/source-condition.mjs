// Module hook for running the CLI from a checkout: the workspace packages resolve to their
// TypeScript sources (their "@bothy/source" export condition), as in the tests, not to a dist/
// that may be older than the sources.
export async function resolve(specifier, context, nextResolve) {
  return nextResolve(specifier, { ...context, conditions: [...context.conditions, "@bothy/source"] });
}
