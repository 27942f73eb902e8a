// The demo page's script (served as a file: the page's Content-Security-Policy allows no inline script).
import { LivePush, bindProgress } from "/livepush.js";
import { $, noteOf, post, startButton } from "/demo/common.js";
import { setUpDurable } from "/demo/durable.js";
import { setUpWorkflow } from "/demo/workflow.js";

const lp = new LivePush(location.origin.replace(/^http/, "ws") + "/");
const statusEl = $("status");
const show = (status) => { statusEl.textContent = status; statusEl.dataset.status = status; };
show(lp.status);
lp.on("status", show);
window.livepushDemo = { lp, finished: false, group: null, jobBindings: [], durable: null, workflow: null };
setUpDurable(lp, window.livepushDemo);
setUpWorkflow(lp, window.livepushDemo);

const SLOTS = 5;
const startedNote = noteOf(lp, $("started"));
let groupBinding = null;
// One binding per job bar, the job it follows now: an import of thousands of jobs keeps five.
let jobBindings = [];

// Cancel import: for the import the page follows, until it has finished (its bar then says
// cancelled); the group's topic shows the cancel, the answer only whether it was taken.
const cancelButton = $("cancel");
cancelButton.addEventListener("click", async () => {
  const group = window.livepushDemo.group;
  cancelButton.disabled = true;
  try {
    await post(`/demo/cancel?group=${group}`);
    if (window.livepushDemo.group === group) startedNote.ok();
  } catch (error) {
    if (window.livepushDemo.group !== group) return;
    startedNote.error(error.message);
    cancelButton.disabled = window.livepushDemo.finished;
  }
});

// Follows the import `started`: the group's bar and a few of its jobs' bars (each topic's first
// message is its state as it stands, so a reloaded page shows where the import is).
function followImport(started, n) {
  window.livepushDemo.finished = false;
  window.livepushDemo.group = started.group_id;
  startedNote.set(`import ${started.group_id}: ${n} jobs`);
  cancelButton.disabled = false;

  if (groupBinding) groupBinding.unsubscribe();
  const groupEl = $("group");
  groupEl.replaceChildren();
  let doneSoFar = 0;  // members finished, from the group's events
  groupBinding = bindProgress(lp, started.group_topic, groupEl, {
    onUpdate: (view) => { doneSoFar = view.done ?? doneSoFar; },
    onFinish: () => {
      window.livepushDemo.finished = true;
      cancelButton.disabled = true;
    },
  });

  // Each slot follows one job until it finishes, then jumps to the newest job not yet
  // shown, so the bars keep up with the runtime instead of trailing behind it.
  for (const b of jobBindings) b?.unsubscribe();
  const bindings = (jobBindings = new Array(SLOTS).fill(null));
  window.livepushDemo.jobBindings = bindings;
  const jobsEl = $("jobs");
  jobsEl.replaceChildren();
  let next = 0;
  const follow = (i, slotEl) => {
    // A newer import took the bars over while this one's next jump waited.
    if (bindings !== jobBindings) return;
    next = Math.max(next, doneSoFar);
    if (next >= started.job_topics.length) return;  // the last bar stays as it finished
    const topic = started.job_topics[next++];
    // Binding the bar again ends the job it followed, and replaces what it shows.
    bindings[i] = bindProgress(lp, topic, slotEl, {
      onFinish: () => setTimeout(() => follow(i, slotEl), 150),
    });
  };
  for (let i = 0; i < SLOTS; i++) {
    const slotEl = document.createElement("div");
    slotEl.className = "bar";
    jobsEl.appendChild(slotEl);
    follow(i, slotEl);
  }
}

// Last: following an import uses everything above.
startButton({
  key: "import", button: $("start"), rows: $("n"),
  most: 5000, fallback: 200, path: "/demo/start", note: startedNote, follow: followImport,
});
