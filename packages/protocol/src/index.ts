export * from "./errors.ts";
export * from "./codec.ts";
export * from "./guest-frames.ts";
export * from "./api.ts";
export * from "./tools-api.ts";
export * from "./api-responses.ts";
export * from "./desktop-api.ts";
export * from "./auth-api.ts";
