// The example page (a file of its own: the page's Content-Security-Policy allows no inline script).
import { LivePush, bindProgress } from "/static/livepush.js";

const data = document.body.dataset;
const $ = (id) => document.getElementById(id);
window.example = { lp: null, finished: null, notices: [] };

async function post(path, body) {
  const response = await fetch(path, {
    method: "POST", cache: "no-store",
    headers: { "Content-Type": "application/json" }, body: JSON.stringify(body ?? {}),
  });
  if (!response.ok) throw new Error(`${response.status}: ${await response.text()}`);
  return response.json();
}

if (!data.subject) {
  $("signed-out").hidden = false;
  $("login").addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      await post("/login", { name: $("name").value });
      location.reload();
    } catch (err) {
      $("login-note").textContent = String(err.message);
    }
  });
} else {
  $("signed-in").hidden = false;
  $("who").textContent = data.subject;
  // The session cookie goes with the handshake: no token in the page.
  const lp = new LivePush(data.push);
  window.example.lp = lp;
  const show = (status) => { $("status").textContent = status; $("status").dataset.status = status; };
  show(lp.status);
  lp.on("status", show);

  // The user's notices, from the offset the page was rendered at: none published since is missed.
  lp.subscribe(data.notices, (notice) => {
    $("no-notices")?.remove();
    const li = document.createElement("li");
    li.textContent = notice.text;  // textContent: never innerHTML with pushed data
    $("notices").append(li);
    window.example.notices.push(notice.text);
  }, { since: data.since || null });

  let binding = null;
  $("start").addEventListener("click", async () => {
    const steps = Math.max(1, Math.min(20, parseInt($("steps").value, 10) || 5));
    let started;
    try {
      started = await post("/reports", { steps });
    } catch (err) {
      $("started").textContent = String(err.message);
      return;
    }
    $("started").textContent = `report ${started.job}`;
    window.example.finished = null;
    if (binding) binding.unsubscribe();
    binding = bindProgress(lp, started.topic, $("progress"), {
      onFinish: (view) => { window.example.finished = view.state; },
    });
  });

  $("logout").addEventListener("click", async () => {
    await post("/logout");
    location.reload();
  });
}
