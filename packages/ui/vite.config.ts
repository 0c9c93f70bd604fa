import preact from "@preact/preset-vite";
import { defineConfig } from "vite";

// Served by the bothy server at /ui/ (packages/server/src/api/ui-routes.ts): every asset ships in
// dist/, none from a CDN, and no script is inlined (the server's CSP allows none).
export default defineConfig({
  base: "/ui/",
  plugins: [preact({ prerender: { enabled: false } })],
  build: {
    outDir: "dist",
    emptyOutDir: true,
    assetsInlineLimit: 0,
    modulePreload: { polyfill: false },
    chunkSizeWarningLimit: 600,
  },
});
