/**
 * Checks the dashboard's tests run on any page: nothing reaches past the screen's edge, and every
 * control is reached by Tab with a visible focus ring. The in-page parts are strings (this
 * package's types have no DOM) run by `page.evaluate`.
 */
import type { Page } from "playwright-core";

export const DESKTOP = { width: 1280, height: 800 };
/** A phone's screen (an iPhone 14's CSS pixels). */
export const PHONE = { width: 390, height: 844 };

/**
 * Elements that reach past the viewport's left or right edge, other than inside a box that scrolls
 * or clips sideways (a wide table scrolls within its own box), described for the failure message.
 */
const OVERFLOWING = `(() => {
  const width = document.documentElement.clientWidth;
  const out = [];
  if (document.documentElement.scrollWidth > width)
    out.push("the page scrolls sideways: " + document.documentElement.scrollWidth + " > " + width);
  const clipped = (el) => {
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement)
      if (["auto", "scroll", "hidden"].includes(getComputedStyle(p).overflowX)) return true;
    return false;
  };
  for (const el of document.body.querySelectorAll("*")) {
    const r = el.getBoundingClientRect();
    // Wholly left of the page (xterm.js's measuring span at -9999em): hidden on purpose, never scrolled to.
    if (r.width === 0 || r.height === 0 || r.right < 0 || clipped(el)) continue;
    if (r.right > width + 0.5 || r.left < -0.5)
      out.push(el.tagName.toLowerCase() + "." + el.className + " " + Math.round(r.left) + ".." + Math.round(r.right));
  }
  return out;
})()`;

export const overflowing = (page: Page): Promise<string[]> => page.evaluate<string[]>(OVERFLOWING);

/** Numbers every control the page shows (data-tab) and answers how many there are. */
const NUMBER_CONTROLS = `(() => {
  const all = document.querySelectorAll(
    "a[href], button:not([disabled]), input:not([disabled]), select:not([disabled]), textarea:not([disabled]), summary, [tabindex='0']",
  );
  // checkVisibility: not inside a closed <details> either (its content is laid out but never shown).
  const shown = [...all].filter(
    (el) => el.getClientRects().length > 0 && el.checkVisibility() && !el.closest("fieldset[disabled]"),
  );
  shown.forEach((el, i) => (el.dataset.tab = String(i)));
  return shown.length;
})()`;

/**
 * The focused control's number, whether its focus ring shows (an outline of 2px or more; a
 * control whose input is hidden, as a file picker's or the terminal's, rings the box marked
 * data-focus-ring around it), and whether it is the terminal's input.
 */
const FOCUSED = `(() => {
  const el = document.activeElement;
  if (!el || el === document.body) return null;
  const style = getComputedStyle(el.closest("[data-focus-ring]") ?? el);
  return {
    tab: el.dataset.tab ?? "unnumbered " + el.outerHTML.slice(0, 80),
    ring: style.outlineStyle !== "none" && parseFloat(style.outlineWidth) >= 2,
    terminal: el.closest(".term-box") !== null,
  };
})()`;

export interface TabWalk {
  /** Controls the page shows. */
  controls: number;
  /** The numbers Tab landed on. */
  reached: Set<string>;
  /** Each stop that was not a numbered control with a visible ring, described. */
  problems: string[];
}

/**
 * Presses Tab from the top of the page once per control and twice more, noting where each press
 * lands. In the terminal, Tab is the shell's: the walk presses Escape first, as its hint says.
 */
export async function walkByTab(page: Page): Promise<TabWalk> {
  const controls = await page.evaluate<number>(NUMBER_CONTROLS);
  const reached = new Set<string>();
  const problems: string[] = [];
  await page.locator("body").focus();
  let inTerminal = false;
  for (let i = 0; i < controls + 2; i++) {
    if (inTerminal) await page.keyboard.press("Escape");
    await page.keyboard.press("Tab");
    const focused = await page.evaluate<{ tab: string; ring: boolean; terminal: boolean } | null>(FOCUSED);
    inTerminal = focused?.terminal ?? false;
    if (focused === null) continue;
    if (!/^\d+$/.test(focused.tab)) {
      problems.push(focused.tab);
      continue;
    }
    if (!focused.ring) problems.push(`control ${focused.tab} shows no focus ring`);
    reached.add(focused.tab);
  }
  return { controls, reached, problems };
}
