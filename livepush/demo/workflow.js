// The workflow's part of the demo page: a run of `demo_import` drawn as a graph of its steps,
// each box coloured by the state the run's topic `workflow:<id>` gives it. The fan-out step's
// batch has a bar of its own (its `group:<id>` topic); Approve, Pause, Resume and Cancel steer the run,
// and the audit trail below says who did what.
import { bindProgress } from "/livepush.js";
import { $, FINISHED, logEvent, noteOf, post, startButton } from "/demo/common.js";

// The boxes, in the order they are drawn. "approval" is no step of its own: it is the signal
// the report step waits for, drawn as a gate so that the wait can be seen (and approved).
const NODES = ["fetch", "rows", "approval", "report"];
const node = (name) => document.querySelector(`#workflow-graph .node[data-step="${name}"]`);

const RUN_NOTES = {
  running: "Running: each step starts when the one before it succeeded.",
  waiting: "Waiting: every active step is parked (no slot of the job runtime held).",
  paused: "Paused: steps already running finish, but nothing new starts until Resume.",
  succeeded: "Succeeded: every step is done.",
  failed: "Failed: a step failed its last attempt; what had not started never will.",
  cancelled: "Cancelled: what had not started never will.",
};

export function setUpWorkflow(lp, state) {
  let subscription = null;
  let batchBinding = null;
  let askedForBatch = false;  // one request at a time for the rows step's batch
  let auditBusy = false;  // one audit request in flight; another change asks again after it
  let auditAgain = false;
  let sawReportWaiting = false;
  const startedNote = noteOf(lp, $("workflow-started"));
  const actionNote = noteOf(lp, $("workflow-action-note"));

  const setNode = (name, nodeState, detail) => {
    const el = node(name);
    el.dataset.state = nodeState;
    el.querySelector(".node-state").textContent = nodeState;
    el.querySelector(".node-detail").textContent = detail ?? "";
  };

  const reset = (started) => {
    subscription?.unsubscribe();
    batchBinding?.unsubscribe();
    subscription = batchBinding = null;
    askedForBatch = auditBusy = auditAgain = sawReportWaiting = false;
    state.workflow = {
      run: started.run_id, state: null, steps: {}, group: null, batch: null, approved: false,
      audit: [], summary: null, events: [],
    };
    $("workflow").dataset.state = "none";
    $("workflow-run-state").textContent = `run ${started.run_id}`;
    delete $("workflow-run-state").dataset.state;  // not the previous run's colour
    for (const name of NODES) setNode(name, "pending", "");
    $("workflow-note").textContent = "";
    actionNote.set("");
    $("workflow-approve").hidden = true;
    $("workflow-approve").disabled = false;
    $("workflow-pause").disabled = true;
    $("workflow-resume").disabled = true;
    $("workflow-cancel").disabled = true;
    $("workflow-batch-box").hidden = true;
    $("workflow-summary-box").hidden = true;
    $("workflow-audit").replaceChildren();
    $("workflow-events").replaceChildren();
  };

  const current = (runId) => state.workflow !== null && state.workflow.run === runId;

  const showAudit = (entries) => {
    const list = $("workflow-audit");
    list.replaceChildren();
    if (!entries.length) {
      const li = document.createElement("li");
      li.className = "muted";
      li.textContent = "nothing yet: no one has paused, resumed, approved or cancelled this run";
      list.appendChild(li);
    }
    for (const entry of entries) {
      // textContent only: actors and reasons are data.
      const li = document.createElement("li");
      const at = document.createElement("time");
      at.dateTime = entry.at;
      at.textContent = new Date(entry.at).toLocaleTimeString([], { hour12: false });
      const verb = document.createElement("strong");
      verb.textContent = entry.verb === "signal" ? `signal “${entry.reason}”` : entry.verb;
      li.append(at, " ", verb);
      if (entry.step) li.append(` → ${entry.step}`);
      li.append(` by ${entry.actor ?? "someone unnamed"}`);
      if (entry.reason && entry.verb !== "signal") li.append(`: ${entry.reason}`);
      list.appendChild(li);
    }
  };

  // The audit trail and the summary are not on the run's topic: read them whenever it says
  // something changed, and after each button. Requests never overlap, and none is lost.
  const refreshAudit = async (runId) => {
    if (auditBusy) { auditAgain = true; return; }
    auditBusy = true;
    try {
      do {
        auditAgain = false;
        let found;
        try {
          found = await post(`/demo/workflow/audit?run=${runId}`);
        } catch (error) {
          return;  // the next change asks again
        }
        if (!current(runId)) return;
        const w = state.workflow;
        w.audit = found.audit;
        showAudit(found.audit);
        if (found.audit.some((a) => a.verb === "signal" && a.step === "report")) w.approved = true;
        if (found.summary !== null) {
          w.summary = found.summary;
          $("workflow-summary").textContent = JSON.stringify(found.summary, null, 2);
          $("workflow-summary-box").hidden = false;
        }
        if (w.approved) draw();
      } while (auditAgain);
    } finally {
      auditBusy = false;
    }
  };

  const followBatch = async (runId) => {
    if (batchBinding || askedForBatch) return;
    askedForBatch = true;
    let found;
    try {
      found = await post(`/demo/workflow/batch?run=${runId}`);
    } catch (error) {
      askedForBatch = false;  // the next event that names the group asks again
      return;
    }
    if (!current(runId)) return;
    state.workflow.group = found.group_id;
    $("workflow-batch-box").hidden = false;
    batchBinding = bindProgress(lp, found.group_topic, $("workflow-batch"), {
      onUpdate: (view) => {
        if (!current(runId)) return;
        state.workflow.batch = { done: view.done, total: view.total, state: view.state };
        draw();
      },
    });
  };

  // The approval gate's state, from the report step's: it waits while the report's job is
  // parked for the signal, and has passed once the signal was sent (the Approve answer, the
  // audit trail, or the report running after it waited).
  const approvalState = (report) => {
    const w = state.workflow;
    if (report.state === "succeeded" || (sawReportWaiting && report.state === "running")) w.approved = true;
    if (w.approved) return "succeeded";
    if (report.state === "waiting") return "waiting";
    if (["skipped", "failed", "cancelled"].includes(report.state)) return report.state;
    return "pending";
  };

  // The graph, the buttons and the note from what the page knows of the run now.
  const draw = () => {
    const w = state.workflow;
    const steps = w.steps;
    if (!steps.fetch) return;  // no event yet
    const runState = w.state;
    const detail = (s) => (s.attempt > 1 ? `attempt ${s.attempt}` : "");

    setNode("fetch", steps.fetch.state, detail(steps.fetch));
    const batch = w.batch;
    const rowsDetail = batch && batch.total !== null ? `${batch.done}/${batch.total} rows`
      : steps.rows.state === "pending" ? "one job per row" : detail(steps.rows);
    setNode("rows", steps.rows.state, rowsDetail);
    const gate = approvalState(steps.report);
    setNode("approval", gate, gate === "waiting" ? (runState === "paused" ? "resume to approve" : "press Approve")
      : gate === "succeeded" ? "approved" : "");
    setNode("report", steps.report.state, steps.report.state === "waiting" ? "parked until approved" : detail(steps.report));

    $("workflow").dataset.state = runState;
    $("workflow-run-state").textContent = `run ${w.run} · ${runState}`;
    $("workflow-run-state").dataset.state = runState;
    $("workflow-note").textContent = RUN_NOTES[runState] ?? "";
    const finished = FINISHED.has(runState);
    $("workflow-approve").hidden = gate !== "waiting" || runState === "paused" || finished;
    $("workflow-pause").disabled = finished || runState === "paused";
    $("workflow-resume").disabled = runState !== "paused";
    $("workflow-cancel").disabled = finished;
  };

  const onMessage = (data, runId) => {
    const wf = data?.workflow;
    if (!wf || wf.id !== runId || !current(runId)) return;
    const w = state.workflow;
    w.state = wf.state;
    w.steps = wf.steps;
    if (wf.steps.report?.state === "waiting") sawReportWaiting = true;
    w.events.push(data.event);

    const shown = NODES.filter((n) => wf.steps[n]).map((n) => `${n} ${wf.steps[n].state}`).join(", ");
    logEvent($("workflow-events"), `${data.event} · ${wf.state} · ${shown}`);

    draw();
    if (wf.steps.rows?.group != null) followBatch(runId);
    refreshAudit(runId);
  };

  const subscribe = (topic, runId) => lp.subscribe(topic, (data) => onMessage(data, runId), {
    // The page missed events older than the kept history: a fresh subscription brings a snapshot.
    onReset: () => {
      subscription?.unsubscribe();
      subscription = subscribe(topic, runId);
    },
    onRefused: (reason) => { $("workflow-note").textContent = `not allowed: ${reason}`; },
  });

  // The run's topic starts with a snapshot of the run as it stands: a reloaded page draws it.
  const follow = (started, n) => {
    reset(started);
    startedNote.set(`run ${started.run_id}: ${n} rows`);
    subscription = subscribe(started.run_topic, started.run_id);
  };
  startButton({
    key: "workflow", button: $("workflow-start"), rows: $("workflow-n"), most: 500, fallback: 12,
    path: "/demo/workflow/start", note: startedNote, follow,
  });

  // A button POSTs its verb for the run on screen; the graph changes when the run's topic says so.
  const verbButton = (id, verb, done) => {
    $(id).addEventListener("click", async () => {
      const w = state.workflow;
      if (!w) return;
      const button = $(id);
      button.disabled = true;
      try {
        await post(`/demo/workflow/${verb}?run=${w.run}`);
        if (!current(w.run)) return;
        actionNote.set(done);
        if (verb === "approve") { w.approved = true; draw(); }
        refreshAudit(w.run);
      } catch (error) {
        actionNote.error(error.message);
        draw();  // the buttons as the run's state says, not as the click left them
      }
    });
  };
  verbButton("workflow-approve", "approve", "approval sent");
  verbButton("workflow-pause", "pause", "pause sent");
  verbButton("workflow-resume", "resume", "resume sent");
  verbButton("workflow-cancel", "cancel", "cancel sent");
}
