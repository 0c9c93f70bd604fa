/** Where test runs keep built templates between runs (override with BOTHY_TEST_TEMPLATES_DIR). */
export function testTemplatesDir(): string {
  return process.env["BOTHY_TEST_TEMPLATES_DIR"] ?? "/var/cache/bothy-test/templates";
}

/** Where test runs keep the unpacked QEMU guest kernel between runs. */
export function testKernelDir(): string {
  return process.env["BOTHY_TEST_KERNEL_DIR"] ?? "/var/cache/bothy-test/kernel";
}
