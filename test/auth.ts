/** Test-only: a request with this header goes without the key test/auth-setup.ts adds (the header is removed). */
export const ANONYMOUS_HEADER = "x-bothy-test-anonymous";
export const ANONYMOUS: Record<string, string> = { [ANONYMOUS_HEADER]: "1" };

/** The admin key every server of this test file mints and every client sends. */
export function testAdminKey(): string {
  const key = process.env["BOTHY_API_KEY"];
  if (!key) throw new Error("test/auth-setup.ts did not run: add it to the vitest project's setupFiles");
  return key;
}
