// The durable import's part of the demo page: one job that parks while its children run and
// again until someone presses Approve. Everything shown comes from the job's state topic.
import { bindProgress } from "/livepush.js";
import { $, FINISHED, logEvent, noteOf, post, startButton } from "/demo/common.js";

const STEPS = ["fetch", "children", "approval", "report"];

// What the job waits for, as the steps name it: a parking call's `waiting.for` and its name.
const stepOfWaiting = (waiting) => {
  if (!waiting) return null;
  if (waiting.for === "children") return "children";
  if (waiting.for === "signal" && waiting.name === "approval") return "approval";
  return null;
};

export function setUpDurable(lp, state) {
  let jobBinding = null;
  let childrenBinding = null;
  let reached = 0;  // the index in STEPS of the step in hand
  let lastWaitingStep = null;  // what the previous state waited for, to see a wake-up
  let parked = false;  // has it parked yet: every later run is a replay
  let askedForChildren = false;  // one request at a time for the children's group
  const startedNote = noteOf(lp, $("durable-started"));
  const approveNote = noteOf(lp, $("durable-approve-note"));

  const reset = (started) => {
    jobBinding?.unsubscribe();
    childrenBinding?.unsubscribe();
    jobBinding = childrenBinding = null;
    reached = 0;
    lastWaitingStep = null;
    parked = false;
    askedForChildren = false;
    state.durable = { job: started.job_id, state: null, waiting: null, waited: [], group: null, result: null, events: [] };
    $("durable").dataset.state = "none";
    $("durable-note").textContent = "";
    $("durable-approve-row").hidden = true;
    $("durable-approve").disabled = false;
    approveNote.set("");
    $("durable-cancel").disabled = false;
    $("durable-children-box").hidden = true;
    $("durable-result-box").hidden = true;
    $("durable-events").replaceChildren();
    showSteps(0, null);
  };

  // Steps before `upTo` are done; the one at `upTo` is in hand (or failed).
  const showSteps = (upTo, jobState) => {
    STEPS.forEach((step, i) => {
      const li = document.querySelector(`#durable-steps li[data-step="${step}"]`);
      let status = i < upTo ? "done" : i === upTo ? "current" : "todo";
      if (status === "current" && (jobState === "failed" || jobState === "cancelled")) status = jobState;
      if (jobState === null) status = "todo";
      li.dataset.status = status;
    });
  };

  // Only moves forward: a replay runs the job from the top again, but its stored
  // checkpoints return at once, so the page keeps showing the furthest step reached.
  const advance = (job) => {
    const waitingStep = job.state === "waiting" ? stepOfWaiting(job.waiting) : null;
    let step = 0;
    if (job.state === "succeeded") step = STEPS.length;
    else if (job.checkpoint === "report") step = STEPS.indexOf("report") + 1;
    else if (waitingStep) step = STEPS.indexOf(waitingStep);
    else if (lastWaitingStep && job.state !== "waiting") step = STEPS.indexOf(lastWaitingStep) + 1;  // woken
    else if (job.checkpoint === "fetch") step = 1;
    lastWaitingStep = waitingStep;
    parked ||= waitingStep !== null;
    reached = Math.max(reached, step);
    return reached;
  };

  const note = (text) => { $("durable-note").textContent = text; };

  const followChildren = async (jobId) => {
    if (childrenBinding || askedForChildren) return;
    askedForChildren = true;
    let found;
    try {
      found = await post(`/demo/durable/children?job=${jobId}`);
    } catch (error) {
      askedForChildren = false;  // it had woken already: a later wait for children asks again
      return;
    }
    if (state.durable.job !== jobId) return;  // another import started meanwhile
    state.durable.group = found.group_id;
    $("durable-children-box").hidden = false;
    childrenBinding = bindProgress(lp, found.group_topic, $("durable-children"));
  };

  const render = (view, data) => {
    const job = data.job;
    const d = state.durable;
    if (!job || job.id !== d.job) return;
    d.state = job.state;
    d.waiting = job.state === "waiting" ? job.waiting ?? null : null;
    $("durable").dataset.state = job.state;
    $("durable-cancel").disabled = FINISHED.has(job.state);

    const detail = data.event === "waiting" && job.waiting ? ` for ${job.waiting.for} ${job.waiting.name ?? ""}`
      : data.event === "checkpoint" ? ` ${job.checkpoint}` : "";
    logEvent($("durable-events"), `${data.event}${detail} · ${job.state}`);
    d.events.push(data.event);

    showSteps(advance(job), job.state);
    const waitingStep = stepOfWaiting(d.waiting);
    if (waitingStep && d.waited.at(-1) !== waitingStep) d.waited.push(waitingStep);
    $("durable-approve-row").hidden = waitingStep !== "approval";
    if (waitingStep === "children") {
      note("Parked: waiting for its children to finish. It holds no slot of the job runtime meanwhile.");
      followChildren(d.job);
    } else if (waitingStep === "approval") {
      note("Parked: waiting for the signal “approval”. Press Approve to wake it.");
    } else if (parked && (job.state === "running" || job.state === "available")) {
      note("Woken: it runs again from the top, and each step it stored returns its result at once.");
    } else if (job.state === "succeeded") {
      d.result = job.result ?? null;
      const r = d.result ?? {};
      note(r.approved
        ? `Succeeded: ${r.rows} rows imported, approved by ${r.approved_by}, report ${r.report}.`
        : "Succeeded without an approval: no report was written.");
      $("durable-result").textContent = JSON.stringify(d.result, null, 2);
      $("durable-result-box").hidden = false;
    } else if (job.state === "failed" || job.state === "cancelled") {
      note(`The job ${job.state}.`);
    } else {
      note("");
    }
  };

  const follow = (started, n) => {
    reset(started);
    startedNote.set(`job ${started.job_id}: ${n} rows`);
    // A new subscription's first message is the job's state as it stands: a reloaded page
    // shows it parked, woken or finished, as a page that never left does.
    jobBinding = bindProgress(lp, started.job_topic, $("durable-job"), { onUpdate: render });
  };
  startButton({
    key: "durable", button: $("durable-start"), rows: $("durable-n"), most: 500, fallback: 20,
    path: "/demo/durable/start", note: startedNote, follow,
  });

  // Cancel it: the job on screen, and its children's unfinished rows; its topic shows the rest.
  $("durable-cancel").addEventListener("click", async () => {
    const job = state.durable?.job;
    if (!job) return;
    const button = $("durable-cancel");
    button.disabled = true;
    try {
      await post(`/demo/durable/cancel?job=${job}`);
      if (state.durable.job === job) startedNote.ok();
    } catch (error) {
      if (state.durable.job !== job) return;
      startedNote.error(error.message);
      button.disabled = FINISHED.has(state.durable.state);
    }
  });

  $("durable-approve").addEventListener("click", async () => {
    const button = $("durable-approve");
    button.disabled = true;
    try {
      await post(`/demo/durable/approve?job=${state.durable.job}`);
      approveNote.set("approval sent");
    } catch (error) {
      approveNote.error(error.message);
      button.disabled = false;
    }
  });
}
