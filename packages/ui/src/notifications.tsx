/**
 * The browser's notification for a new held request. Permission is asked only from a click on
 * the toggle (browsers ignore or penalise a prompt on load), and a notification is shown only
 * while the person has it on: the inbox is the page kept open behind others, where a new card is
 * easy to miss.
 */
import { useState } from "preact/hooks";

const STORE = "bothy.notify";

const supported = (): boolean => typeof Notification !== "undefined";
/** Browsers offer notifications to secure contexts only (HTTPS, or localhost). */
const secure = (): boolean => window.isSecureContext;
const wanted = (): boolean =>
  supported() && Notification.permission === "granted" && localStorage.getItem(STORE) === "on";

/** Shows a notification for a new approval when the person asked for them. */
export function notifyApproval(what: string, sandbox: string): void {
  if (!wanted()) return;
  const note = new Notification("bothy: a request waits for you", { body: `${what} from ${sandbox}`, tag: sandbox });
  note.onclick = () => {
    window.focus();
    note.close();
  };
}

export function NotifyToggle() {
  const [on, setOn] = useState(wanted());
  const [denied, setDenied] = useState(supported() && Notification.permission === "denied");
  if (!supported()) return null;
  if (!secure())
    return (
      <p class="notify status">
        Notifications need the dashboard over HTTPS (or on localhost); this browser offers them to secure pages only.
      </p>
    );
  const toggle = async (): Promise<void> => {
    if (on) {
      localStorage.setItem(STORE, "off");
      setOn(false);
      return;
    }
    // Asked on this click only; a browser that has already decided answers at once.
    const permission = await Notification.requestPermission();
    setDenied(permission === "denied");
    if (permission !== "granted") return;
    localStorage.setItem(STORE, "on");
    setOn(true);
  };
  return (
    <p class="notify">
      <button type="button" class="quiet" aria-pressed={on} disabled={denied} onClick={() => void toggle()}>
        {on ? "Notifications on" : "Notify me of new requests"}
      </button>
      {denied && (
        <span class="status"> The browser blocks notifications for this site; allow them in its settings.</span>
      )}
    </p>
  );
}
