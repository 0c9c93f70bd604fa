/**
 * Which drivers may share a volume (volume-service.ts `shareRefusal`): gVisor sandboxes share the
 * host's one mount, one writer and any readers; a VM's disk is the image itself, so a VM reader
 * stands only beside other VM readers, a VM writer alone, and an image a VM wrote is never mounted
 * by the host's kernel again.
 */
import { describe, expect, it } from "vitest";
import { shareRefusal } from "../src/volumes/volume-service.ts";

type Claim = { sandbox_id: string; volume_id: string; path: string; read_only: number; driver: string };
const claim = (sandbox_id: string, driver: string, readOnly: boolean): Claim => ({
  sandbox_id,
  volume_id: "vol_aaaaaaaaaaaaaaaaaaaa",
  path: "/v",
  read_only: readOnly ? 1 : 0,
  driver,
});

/** The code of the refusal a `driver` mount (read-only or not) gets beside `live`, or "ok". */
const verdict = (driver: string, readOnly: boolean, live: Claim[], vmWritten = false): string =>
  shareRefusal("v", driver, readOnly, live, vmWritten)?.code ?? "ok";

describe("volume sharing between drivers", () => {
  it("lets gVisor sandboxes share one writer and any readers", () => {
    expect(verdict("gvisor", false, [])).toBe("ok");
    expect(verdict("gvisor", true, [claim("g1", "gvisor", false), claim("g2", "gvisor", true)])).toBe("ok");
    expect(verdict("gvisor", false, [claim("g1", "gvisor", false)])).toBe("volume_in_use");
  });

  it("lets QEMU readers share an image with each other only", () => {
    expect(verdict("qemu", true, [claim("q1", "qemu", true), claim("q2", "qemu", true)])).toBe("ok");
    expect(verdict("qemu", true, [claim("q1", "qemu", false)])).toBe("volume_share_unsafe");
    expect(verdict("qemu", true, [claim("g1", "gvisor", false)])).toBe("volume_share_unsafe");
    expect(verdict("qemu", true, [claim("g1", "gvisor", true)])).toBe("volume_share_unsafe");
  });

  it("gives a QEMU writer the image alone", () => {
    expect(verdict("qemu", false, [])).toBe("ok");
    expect(verdict("qemu", false, [], true)).toBe("ok");
    expect(verdict("qemu", false, [claim("q1", "qemu", true)])).toBe("volume_share_unsafe");
    expect(verdict("qemu", false, [claim("g1", "gvisor", true)])).toBe("volume_share_unsafe");
    expect(verdict("qemu", false, [claim("x", "qemu", false)])).toBe("volume_in_use");
  });

  it("keeps gVisor off an image a VM uses or ever wrote, naming the VMs", () => {
    const refusal = shareRefusal("v", "gvisor", true, [claim("q1", "qemu", true)], false);
    expect(refusal?.code).toBe("volume_share_unsafe");
    expect(refusal?.message).toContain("q1");
    expect(verdict("gvisor", true, [], true)).toBe("volume_share_unsafe");
    expect(verdict("gvisor", false, [], true)).toBe("volume_share_unsafe");
  });
});
