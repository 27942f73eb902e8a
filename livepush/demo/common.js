// What every section of the demo page shares: its requests to the demo server, the lines that
// show what a section follows (or its last error), its Start button and its list of events.

export const $ = (id) => document.getElementById(id);

// The states a job or a workflow run ends in: nothing follows them.
export const FINISHED = new Set(["succeeded", "failed", "cancelled"]);

const EVENTS_KEPT = 12;

// A line at the end of a section's list of the events its topic brought; the list keeps the last few.
export function logEvent(list, text) {
  const li = document.createElement("li");
  li.textContent = text;  // textContent: names are data
  list.appendChild(li);
  while (list.children.length > EVENTS_KEPT) list.firstElementChild.remove();
}

// POST to the demo server (same origin only: it refuses a GET and other sites); the JSON
// answer, or an Error carrying the server's one-line reason, or saying that no answer came (the
// demo stopped or restarting). Every section's buttons use it.
export async function post(path) {
  let response;
  try {
    response = await fetch(path, { method: "POST", cache: "no-store" });
  } catch (error) {
    throw new Error("the demo did not answer: is it running? Press again once it is.");
  }
  if (!response.ok) throw new Error((await response.text()).trim() || `${response.status}`);
  return response.json();
}

// `post(path)` for a button that starts something: the button stays disabled until the answer
// came, so a double-click starts one import, not a second one the page would never show.
async function postFrom(button, path) {
  button.disabled = true;
  try {
    return await post(path);
  } finally {
    button.disabled = false;
  }
}

// A line of the page that says what a section follows ("import 12: 200 jobs") or what its last
// button did, which an error of one of its buttons replaces only for a while: the line comes back
// once the page has reconnected (the demo is back, so "did not answer" no longer holds) or the
// section's next request succeeded (`ok()`).
export function noteOf(lp, el) {
  let text = el.textContent;
  let failed = false;
  const ok = () => {
    if (!failed) return;
    failed = false;
    el.textContent = text;
  };
  lp.on("status", (status) => { if (status === "open") ok(); });
  return {
    set(shown) { text = el.textContent = shown; failed = false; },
    error(message) { el.textContent = message; failed = true; },
    ok,
  };
}

// What a section started, kept for this tab (sessionStorage), so that a reloaded page follows
// it again: a durable import or a workflow run parked for approval would otherwise wait for an
// Approve button the page no longer shows. A browser that keeps nothing just forgets.
function remember(key, started) {
  try {
    sessionStorage.setItem(`livepush-demo:${key}`, JSON.stringify(started));
  } catch (error) { /* storage off or full: a reload forgets it */ }
}

function recall(key) {
  try {
    return JSON.parse(sessionStorage.getItem(`livepush-demo:${key}`));
  } catch (error) {
    return null;
  }
}

// A section's Start button: it POSTs `path?n=` with the rows asked for in `rows` (none, or
// nonsense, is `fallback`; kept within 1..`most`), keeps what started for this tab and
// `follow(started, n)`s it; an error shows on `note`. A reloaded page follows what this tab
// started last, at once.
export function startButton({ key, button, rows, most, fallback, path, note, follow }) {
  button.addEventListener("click", async (event) => {
    // The second click of a double-click (detail 2) starts nothing: disabling the button while
    // the request is out does not cover a demo that answered before that click came.
    if (event.detail > 1) return;
    const n = Math.max(1, Math.min(most, parseInt(rows.value, 10) || fallback));
    let started;
    try {
      started = await postFrom(button, `${path}?n=${n}`);
    } catch (error) {
      note.error(error.message);
      return;
    }
    remember(key, { ...started, n });
    follow(started, n);
  });
  const earlier = recall(key);
  if (earlier) follow(earlier, earlier.n);
}
