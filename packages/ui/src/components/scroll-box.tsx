/**
 * A wide table's box on a narrow screen: it scrolls sideways inside itself, never the page, and is
 * a named region that takes focus, so a keyboard can scroll it too.
 */
import type { ComponentChildren } from "preact";

export function ScrollBox({ label, children }: { label: string; children: ComponentChildren }) {
  return (
    <div class="scroll" role="region" aria-label={label} tabIndex={0}>
      {children}
    </div>
  );
}
