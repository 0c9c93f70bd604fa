import { describe, expect, it } from "vitest";
import { ERROR_CODES, ERROR_STATUS } from "@bothy/protocol";
import {
  AuthenticationError,
  ConflictError,
  errorFromCode,
  errorFromProblem,
  InvalidArgumentError,
  NotFoundError,
  NotSupportedError,
  RateLimitError,
  SandboxError,
  TimeoutError,
} from "../src/index.ts";

describe("typed errors from problem codes", () => {
  it("maps every server code to a SandboxError subclass that keeps code and status", () => {
    for (const code of ERROR_CODES) {
      const err = errorFromCode(code, "m", ERROR_STATUS[code]);
      expect(err).toBeInstanceOf(SandboxError);
      expect(err).toMatchObject({ code, status: ERROR_STATUS[code], message: "m" });
      expect(err.name).toBe(err.constructor.name);
    }
    expect(errorFromCode("sandbox_not_found", "m")).toBeInstanceOf(NotFoundError);
    expect(errorFromCode("invalid_request", "m")).toBeInstanceOf(InvalidArgumentError);
    expect(errorFromCode("sandbox_not_running", "m")).toBeInstanceOf(ConflictError);
    expect(errorFromCode("capacity_exhausted", "m")).toBeInstanceOf(RateLimitError);
    expect(errorFromCode("not_supported", "m")).toBeInstanceOf(NotSupportedError);
  });

  it("classifies codes it does not know by name, then by HTTP status", () => {
    expect(errorFromCode("budget_exhausted", "m", 402)).toBeInstanceOf(RateLimitError);
    expect(errorFromCode("rate_limited", "m", 429)).toBeInstanceOf(RateLimitError);
    expect(errorFromCode("invalid_api_key", "m", 401)).toBeInstanceOf(AuthenticationError);
    expect(errorFromCode("something_new", "m", 403)).toBeInstanceOf(AuthenticationError);
    expect(errorFromCode("request_deadline", "m", 500)).toBeInstanceOf(TimeoutError);
    const plain = errorFromCode("something_new", "m", 500);
    expect(plain.constructor).toBe(SandboxError);
  });

  it("reads problem+json bodies and survives bodies that are not", () => {
    const e = errorFromProblem(
      404,
      JSON.stringify({
        type: "x",
        title: "Sandbox not found",
        status: 404,
        code: "sandbox_not_found",
        detail: "No sandbox sbx_x.",
      }),
    );
    expect(e).toBeInstanceOf(NotFoundError);
    expect(e.message).toBe("No sandbox sbx_x.");
    const html = errorFromProblem(502, "<html>bad gateway</html>");
    expect(html).toMatchObject({ code: "http_502", message: "<html>bad gateway</html>" });
  });
});
