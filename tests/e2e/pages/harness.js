// Test harness for tests/e2e: the tests drive it through page.evaluate(). Everything it observes
// is recorded in window.e2e with performance.now() timestamps, and the main client's status and
// messages are also rendered, so a failure screenshot shows where the page was.

const params = new URLSearchParams(location.search);
const base = params.get('ws');
if (!base) throw new Error('harness.js needs ?ws=http://127.0.0.1:PORT (the push server)');

// Cross-origin module import: the push server sends Access-Control-Allow-Origin: *.
const mod = await import(`${base}/livepush.js`);
const wsUrl = base.replace(/^http/, 'ws') + '/';

const $ = (id) => document.getElementById(id);

const e2e = {
  mod,
  wsUrl,
  /** The main client (watch()). */
  lp: null,
  statuses: [], // [{status, code, reason, delayMs, tries, t}]
  socketTimes: [], // performance.now() of each WebSocket the main client opened
  messages: [], // data.n of every delivered message, in delivery order
  offsets: [],
  subscribed: 0, // accepted (re)subscribes
  errors: [],

  /** One client subscribed to `topic`, its status and messages rendered in the page. */
  watch(topic, { token = null } = {}) {
    // The browser's own WebSocket, timestamped: when each (re)connect attempt really started.
    class TimedWebSocket extends WebSocket {
      constructor(url, protocols) {
        super(url, protocols);
        e2e.socketTimes.push(performance.now());
      }
    }
    const lp = new mod.LivePush(wsUrl, { token, WebSocket: TimedWebSocket, onError: (err) => e2e.errors.push(String(err.reason)) });
    e2e.lp = lp;
    lp.on('status', (status, info) => {
      e2e.statuses.push({ status, code: info.code ?? null, reason: info.reason ?? null, delayMs: info.delayMs ?? null, tries: info.tries ?? null, t: performance.now() });
      $('status').textContent = status;
      $('subject').textContent = lp.session ? `as ${lp.session.subject}` : '';
    });
    lp.subscribe(topic, (data, meta) => {
      e2e.messages.push(data.n);
      e2e.offsets.push(meta.offset);
      const li = document.createElement('li');
      li.textContent = String(data.n);
      $('messages').append(li);
    }, { onSubscribed: () => { e2e.subscribed += 1; } });
    return true;
  },

  /** Status names of the main client so far. */
  statusNames() {
    return e2e.statuses.map((s) => s.status);
  },

  /** `n` independent clients on one topic; each records its own status history. */
  crowd: [],
  startCrowd(n, topic) {
    for (let i = 0; i < n; i++) {
      const rec = { i, statuses: [], subscribed: 0 };
      const lp = new mod.LivePush(wsUrl, { onError: (err) => e2e.errors.push(String(err.reason)) });
      lp.on('status', (status, info) => {
        rec.statuses.push({ status, code: info.code ?? null, delayMs: info.delayMs ?? null, tries: info.tries ?? null, t: performance.now() });
        e2e.renderCrowd();
      });
      lp.subscribe(topic, () => {}, { onSubscribed: () => { rec.subscribed += 1; } });
      rec.lp = lp;
      e2e.crowd.push(rec);
    }
    return n;
  },
  renderCrowd() {
    const counts = {};
    for (const rec of e2e.crowd) counts[rec.lp.status] = (counts[rec.lp.status] ?? 0) + 1;
    $('crowd').textContent = Object.entries(counts).map(([k, v]) => `${v} ${k}`).join(', ');
  },
  /** How many crowd clients are open and subscribed at least `times` times. */
  crowdReady(times = 1) {
    return e2e.crowd.filter((rec) => rec.lp.status === 'open' && rec.subscribed >= times).length;
  },
  /** Plain data for Python: each crowd client's status history. */
  crowdHistory() {
    return e2e.crowd.map((rec) => ({ i: rec.i, subscribed: rec.subscribed, statuses: rec.statuses }));
  },
};

window.e2e = e2e;
$('status').textContent = 'ready';
window.e2eReady = true;
