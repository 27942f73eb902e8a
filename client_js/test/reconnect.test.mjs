import assert from 'node:assert/strict';
import test from 'node:test';

import {
  GOING_AWAY_MAX_MS,
  GOING_AWAY_MIN_MS,
  HEARTBEAT_GRACE_MS,
  LivePush,
  REPLAY_SILENCE_MS,
  STABLE_AFTER_MS,
} from '../livepush.js';
import { FakeClock, fakeWebSocketClass, harness, seededRandom } from '../testing/fakes.mjs';

const MID = () => 0.5; // jitter factor 1.0: delays equal the backoff, so they are exact

/** Delays announced with each `reconnecting` status. */
const delays = (h) => h.statuses.filter((s) => s.status === 'reconnecting').map((s) => s.delayMs);

test('statuses go connecting → open → reconnecting → open, and the first socket opens at once', () => {
  const h = harness();
  assert.equal(h.lp.status, 'connecting');
  assert.equal(h.sockets.length, 1);
  assert.equal(h.last().url, 'ws://push.test/');
  h.last().hello({ session: { subject: 'u7' } });
  assert.equal(h.lp.status, 'open');
  assert.deepEqual(h.lp.session, { subject: 'u7' });
  h.last().serverClose(1006);
  assert.equal(h.lp.status, 'reconnecting');
  h.clock.advance(750); // the longest first delay
  assert.equal(h.sockets.length, 2);
  h.last().hello();
  assert.deepEqual(
    h.statuses.map((s) => s.status),
    ['open', 'reconnecting', 'open'],
  );
  h.lp.close();
  assert.equal(h.lp.status, 'closed');
});

test('failed attempts grow the backoff up to the cap, one new socket per attempt', () => {
  const h = harness({ random: MID });
  for (let i = 0; i < 10; i++) {
    h.last().serverClose(1006); // refused before hello
    h.clock.advance(h.clock.pending()[0]);
  }
  assert.deepEqual(delays(h), [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000, 30000]);
  assert.equal(h.sockets.length, 11);
  h.lp.close();
});

test('the backoff starts over once a connection stayed open for STABLE_AFTER_MS after hello', () => {
  const h = harness({ random: MID });
  for (let i = 0; i < 4; i++) {
    h.last().serverClose(1006);
    h.clock.advance(h.clock.pending()[0]);
  }
  assert.deepEqual(delays(h), [500, 1000, 2000, 4000]);
  // Up, but not for long: the backoff keeps growing.
  h.last().hello();
  h.clock.advance(STABLE_AFTER_MS - 1);
  h.last().serverClose(1006);
  assert.equal(delays(h).at(-1), 8000);
  h.clock.advance(8000);
  // Up long enough: back to the base.
  h.last().hello();
  h.clock.advance(STABLE_AFTER_MS);
  h.last().serverClose(1006);
  assert.equal(delays(h).at(-1), 500);
  h.lp.close();
});

test('a policy close (1008) keeps growing the backoff even after a stable connection', () => {
  const h = harness({ random: MID });
  h.last().serverClose(1006);
  h.clock.advance(500);
  h.last().hello();
  h.clock.advance(60_000);
  h.last().serverClose(1008);
  assert.deepEqual(delays(h), [500, 1000]);
  h.lp.close();
});

for (const code of [4401, 4403]) {
  test(`close ${code} stops for good with status unauthorized and no new socket`, () => {
    const h = harness();
    h.last().hello();
    h.last().serverClose(code, 'session revoked');
    assert.equal(h.lp.status, 'unauthorized');
    assert.deepEqual(h.statuses.at(-1), { status: 'unauthorized', code, reason: 'session revoked' });
    assert.deepEqual(h.clock.pending(), [], 'a timer is still pending');
    h.window.dispatch('online');
    h.document.dispatch('visibilitychange');
    h.clock.advance(3_600_000);
    assert.equal(h.sockets.length, 1);
    assert.throws(() => h.lp.subscribe('public:x', () => {}), /closed/);
  });
}

test('a subscribe after the session was refused says so, not that the page closed the client', () => {
  const h = harness();
  h.last().hello();
  h.last().serverClose(4403, 'session revoked');
  assert.throws(() => h.lp.subscribe('public:x', () => {}), {
    message: /closed for good: the server refused its session \(4403: revoked or expired\): sign the user in again and create a new LivePush/,
  });
  const closed = harness();
  closed.lp.close();
  assert.throws(() => closed.lp.subscribe('public:x', () => {}), {
    message: 'this LivePush is closed: create a new one to subscribe again',
  });
});

test('close 4401 right after the handshake (no hello) also stops', () => {
  const h = harness();
  h.last().serverClose(4401);
  h.clock.advance(3_600_000);
  assert.equal(h.lp.status, 'unauthorized');
  assert.equal(h.sockets.length, 1);
});

/**
 * A client whose token function gives `first-token` at the connect and what `renew()` gives when
 * asked again, open and subscribed to `topics`, with a message delivered on each.
 */
function connectedWithTokenFunction(renew, topics = ['user:7', 'public:news']) {
  const held = { asked: 0 };
  const h = harness({ token: () => (++held.asked === 1 ? 'first-token' : renew()) });
  const got = topics.map((topic) => {
    const seen = [];
    h.lp.subscribe(topic, (data) => seen.push(data));
    return seen;
  });
  h.last().hello({ session: { subject: '7' } });
  h.last().acceptSubscribes();
  topics.forEach((topic, i) => h.last().receive({ op: 'message', topic, offset: String(10 + i), data: `before ${i}` }));
  return { h, held, got };
}

test('a session that ends while connected (4403) reconnects at once with the token the token function renewed, every subscription from its offset', () => {
  // The page renewed its token meanwhile (its own timer, a fetch); the old session then expired
  // or was revoked while the socket was open.
  const { h, held, got } = connectedWithTokenFunction(() => 'fresh-token');
  h.last().serverClose(4403, 'session revoked');
  assert.equal(held.asked, 2, 'asked once at the connect and once for the 4403');
  assert.equal(h.sockets.length, 2, 'a new connection at once, no backoff');
  assert.deepEqual(h.last().protocols, ['livepush', 'livepush.token.fresh-token']);
  assert.equal(held.asked, 2, 'the new connection offers the token the function gave, without asking again');
  assert.deepEqual(h.statuses.map((s) => s.status), ['open', 'reconnecting']);
  assert.deepEqual(h.statuses.at(-1), { status: 'reconnecting', code: 4403, reason: 'token renewed', delayMs: 0, tries: 0 });
  assert.deepEqual(h.clock.pending().filter((ms) => ms > 10_000), [], 'no reconnect timer: the attempt is under way');

  const ws = h.last();
  ws.hello({ session: { subject: '7' } });
  // Each subscription resumes from the offset it last delivered, as after any reconnect.
  assert.deepEqual(ws.frames('subscribe').map((f) => `${f.topic} since ${f.since}`), ['user:7 since 10', 'public:news since 11']);
  ws.acceptSubscribes();
  ws.receive({ op: 'message', topic: 'user:7', offset: '12', data: 'after' });
  assert.deepEqual(got, [['before 0', 'after'], ['before 1']]);
  assert.equal(h.lp.status, 'open');
  assert.deepEqual(h.lp.session, { subject: '7' });
  assert.deepEqual(h.errors, []);
  h.lp.close();
});

test('on 4403 a token function that gives the same token, none, or throws stops the client for good, as a fixed token does', () => {
  // Revocation stays safe: a page whose user signed out returns the old token or none.
  const cases = {
    'the same token': () => 'first-token',
    null: () => null,
    undefined: () => undefined,
    'an empty token': () => '',
    'a throwing function': () => { throw new Error('storage unavailable'); },
  };
  for (const [name, renew] of Object.entries(cases)) {
    const { h, held } = connectedWithTokenFunction(renew, ['user:7']);
    h.last().serverClose(4403, 'session revoked');
    assert.equal(held.asked, 2, name);
    assert.equal(h.lp.status, 'unauthorized', name);
    assert.deepEqual(h.statuses.at(-1), { status: 'unauthorized', code: 4403, reason: 'session revoked' }, name);
    assert.equal(h.sockets.length, 1, `${name}: no new socket`);
    assert.deepEqual(h.clock.pending(), [], `${name}: a timer is still pending`);
    assert.throws(() => h.lp.subscribe('public:x', () => {}), /refused its session \(4403/, name);
    if (name === 'a throwing function') {
      assert.deepEqual(h.errors.map((e) => e.reason), ['handler_error']);
      assert.match(h.errors[0].detail, /token function.*storage unavailable/);
    } else {
      assert.deepEqual(h.errors, [], name);
    }
  }
});

test('a 4403 on the connection opened with a renewed token stops for good: one renewal, never a loop', () => {
  // A function that makes a new token on every call must not reconnect for ever.
  let n = 0;
  const h = harness({ token: () => `tok-${++n}` });
  h.lp.subscribe('user:7', () => {});
  h.last().hello({ session: { subject: '7' } });
  h.last().serverClose(4403);
  assert.deepEqual(h.last().protocols, ['livepush', 'livepush.token.tok-2']);
  h.last().hello({ session: { subject: '7' } });
  h.last().serverClose(4403);
  assert.equal(n, 2, 'the connection opened for the renewal does not ask again');
  assert.equal(h.sockets.length, 2);
  assert.equal(h.lp.status, 'unauthorized');
  assert.deepEqual(h.statuses.map((s) => s.status), ['open', 'reconnecting', 'open', 'unauthorized']);

  // A connection opened with a renewed token after a `forbidden` refusal does not renew either.
  let m = 0;
  const refused = harness({ token: () => `tok-${++m}` });
  refused.lp.subscribe('user:7', () => {});
  refused.last().hello({ session: null });
  refused.last().receive({ op: 'refused', ref: refused.last().frames('subscribe')[0].ref, reason: 'forbidden' });
  assert.equal(refused.sockets.length, 2);
  refused.last().hello({ session: { subject: '7' } });
  refused.last().serverClose(4403);
  assert.equal(m, 2);
  assert.equal(refused.lp.status, 'unauthorized');
});

test('a renewed session that held for STABLE_AFTER_MS is renewed again on its own 4403: a page renewing on a timer keeps going', () => {
  // Tokens of an hour, renewed by the page before each runs out: every expiry is one reconnect.
  let n = 0;
  const h = harness({ token: () => `tok-${++n}` });
  h.last().hello({ session: { subject: '7' } });
  h.last().serverClose(4403);
  h.last().hello({ session: { subject: '7' } });
  h.clock.advance(STABLE_AFTER_MS);
  h.last().serverClose(4403);
  assert.equal(h.sockets.length, 3);
  assert.deepEqual(h.last().protocols, ['livepush', 'livepush.token.tok-3']);
  assert.deepEqual(h.statuses.map((s) => s.status), ['open', 'reconnecting', 'open', 'reconnecting']);

  // Held for less: a session ended that soon may be the renewed token's own fault, so no loop.
  h.last().hello({ session: { subject: '7' } });
  h.clock.advance(STABLE_AFTER_MS - 1);
  h.last().serverClose(4403);
  assert.equal(h.sockets.length, 3);
  assert.equal(h.lp.status, 'unauthorized');
});

test('a connection opened after a renewal without one (the network dropped) renews again on 4403', () => {
  let n = 0;
  const h = harness({ token: () => `tok-${++n}` });
  h.last().hello();
  h.last().serverClose(4403);
  h.last().hello();
  h.last().serverClose(1006);
  h.clock.advance(h.clock.pending()[0]);
  assert.deepEqual(h.last().protocols, ['livepush', 'livepush.token.tok-3']);
  h.last().hello();
  h.last().serverClose(4403);
  assert.equal(h.sockets.length, 4);
  assert.deepEqual(h.last().protocols, ['livepush', 'livepush.token.tok-4']);
  assert.equal(h.lp.status, 'reconnecting');
  h.lp.close();
});

test('a 4403 before the first hello, renewed, stays `reconnecting` until the renewed connection opens', () => {
  // `connecting` is the first attempt's: the renewed one is a second, announced as reconnecting.
  let n = 0;
  const h = harness({ token: () => `tok-${++n}` });
  h.last().serverClose(4403);
  assert.equal(h.sockets.length, 2);
  assert.equal(h.lp.status, 'reconnecting');
  h.last().hello({ session: { subject: '7' } });
  assert.deepEqual(h.statuses.map((s) => s.status), ['reconnecting', 'open']);
  h.lp.close();
});

test('4401, and a 4403 on a connection that sent no token, ask no token function and stop for good', () => {
  // 4401: no valid session at the handshake, which the function was asked for just before.
  let asked = 0;
  const h = harness({ token: () => `tok-${++asked}` });
  h.last().serverClose(4401);
  assert.equal(asked, 1);
  assert.equal(h.lp.status, 'unauthorized');
  assert.equal(h.sockets.length, 1);

  // No token sent: the session that ended came from the cookie, which no token function renews.
  let cookieAsked = 0;
  const cookie = harness({ token: () => { cookieAsked += 1; return null; } });
  cookie.last().hello({ session: { subject: '7' } });
  cookie.last().serverClose(4403);
  assert.equal(cookieAsked, 1);
  assert.equal(cookie.lp.status, 'unauthorized');
  assert.equal(cookie.sockets.length, 1);
});

test('a token function that closes the client when asked on 4403 leaves it closed, with nothing reported', () => {
  // The user signed out: the page's sign-out closed the client from inside the token function.
  let asked = 0;
  const h = harness({ token: () => (++asked === 1 ? 'first-token' : (h.lp.close(), 'fresh-token')) });
  h.last().hello({ session: { subject: '7' } });
  h.last().serverClose(4403);
  assert.equal(h.lp.status, 'closed');
  assert.deepEqual(h.statuses.map((s) => s.status), ['open', 'closed']);
  assert.equal(h.sockets.length, 1);
  assert.deepEqual(h.errors, []);
  assert.deepEqual(h.clock.pending(), []);
});

test('an onError that closes the client on hearing the token function threw on 4403 leaves it closed', () => {
  let asked = 0;
  const h = harness({
    token: () => { if (++asked > 1) throw new Error('storage unavailable'); return 'first-token'; },
    onError: () => h.lp.close(),
  });
  h.last().hello({ session: { subject: '7' } });
  h.last().serverClose(4403);
  assert.equal(h.lp.status, 'closed');
  assert.deepEqual(h.statuses.map((s) => s.status), ['open', 'closed']);
  assert.deepEqual(h.clock.pending(), []);
});

test('close 1001 (server going away) waits a short, jittered, non-zero delay', () => {
  const seen = [];
  for (let i = 0; i < 300; i++) {
    const h = harness({ random: seededRandom(500 + i) });
    h.last().hello();
    h.clock.advance(60_000);
    h.last().serverClose(1001);
    const d = delays(h).at(-1);
    seen.push(d);
    h.clock.advance(d - 1);
    assert.equal(h.sockets.length, 1, 'reconnected before the announced delay');
    h.clock.advance(1);
    assert.equal(h.sockets.length, 2, 'did not reconnect at the announced delay');
    h.lp.close();
  }
  const min = Math.min(...seen);
  const max = Math.max(...seen);
  assert.ok(min >= GOING_AWAY_MIN_MS && max < GOING_AWAY_MAX_MS, `delays ${min}..${max}`);
  assert.ok(max - min > 2000, `1001 delays spread over only ${max - min} ms`);
  // Even a random() of 0 gives a positive delay.
  const h = harness({ random: () => 0 });
  h.last().hello();
  h.last().serverClose(1001);
  assert.equal(delays(h).at(-1), GOING_AWAY_MIN_MS);
  h.lp.close();
});

test('close 1012 (service restart, as a restarting proxy sends) spreads the pages like 1001', () => {
  const seen = [];
  for (let i = 0; i < 200; i++) {
    const h = harness({ random: seededRandom(900 + i) });
    h.last().hello();
    h.clock.advance(60_000);
    h.last().serverClose(1012, 'retry=60000'); // retry=MS is the drain's word, with 1001 only
    seen.push(delays(h).at(-1));
    h.lp.close();
  }
  const min = Math.min(...seen);
  const max = Math.max(...seen);
  // The plain backoff would bring every page back within 0.25-0.75 s of the restart.
  assert.ok(min >= GOING_AWAY_MIN_MS && max < GOING_AWAY_MAX_MS, `delays ${min}..${max}`);
  assert.ok(max - min > 2000, `1012 delays spread over only ${max - min} ms`);
});

test('a server that keeps going away falls back to the growing backoff', () => {
  const h = harness({ random: MID });
  for (let i = 0; i < 6; i++) {
    h.last().serverClose(1001);
    h.clock.advance(h.clock.pending()[0]);
  }
  assert.deepEqual(delays(h), [1750, 1750, 2000, 4000, 8000, 16000]);
  h.lp.close();
});

test('pings go out every heartbeat and answered pings keep the connection', () => {
  const h = harness();
  const ws = h.last();
  ws.hello({ heartbeat: 10 });
  for (let i = 1; i <= 10; i++) {
    h.clock.advance(10_000);
    const ping = ws.frames('ping').at(-1);
    assert.equal(ws.frames('ping').length, i);
    ws.receive({ op: 'pong', ref: ping.ref });
  }
  assert.equal(h.sockets.length, 1);
  assert.equal(h.lp.status, 'open');
  h.lp.close();
});

test('a silent connection is declared dead after 2 × heartbeat + grace and replaced', () => {
  const h = harness({ random: MID });
  const ws = h.last();
  ws.hello({ heartbeat: 10 });
  h.clock.advance(21_999);
  assert.equal(h.lp.status, 'open');
  assert.equal(ws.closedByClient, null);
  h.clock.advance(1); // 2 × 10 s + 2 s grace
  assert.equal(h.lp.status, 'reconnecting');
  assert.ok(ws.closedByClient, 'the dead socket was not closed');
  assert.equal(h.statuses.at(-1).reason, 'heartbeat timeout');
  h.clock.advance(500);
  assert.equal(h.sockets.length, 2);
  ws.serverClose(1006); // the old socket's late close event changes nothing
  assert.equal(h.sockets.length, 2);
  h.last().hello({ heartbeat: 10 });
  assert.equal(h.lp.status, 'open');
  h.lp.close();
});

test('any frame counts as a sign of life for the heartbeat', () => {
  const h = harness();
  const ws = h.last();
  ws.hello({ heartbeat: 10 });
  for (let i = 0; i < 20; i++) {
    h.clock.advance(15_000);
    ws.receive({ op: 'message', topic: 'public:x', offset: String(i + 1), data: i });
  }
  assert.equal(h.sockets.length, 1);
  h.lp.close();
});

test('an attempt that never gets hello is abandoned after the connect timeout', () => {
  const h = harness({ random: MID });
  h.clock.advance(9_999);
  assert.equal(h.sockets.length, 1);
  h.clock.advance(1);
  assert.ok(h.sockets[0].closedByClient);
  assert.equal(h.lp.status, 'reconnecting');
  h.clock.advance(500);
  assert.equal(h.sockets.length, 2);
  h.lp.close();
});

test('the page becoming visible or the network coming back cuts a long wait short', () => {
  const h = harness({ random: MID });
  for (let i = 0; i < 7; i++) {
    h.last().serverClose(1006);
    h.clock.advance(h.clock.pending()[0]);
  }
  h.last().serverClose(1006);
  assert.equal(delays(h).at(-1), 30000);
  const before = h.sockets.length;
  h.document.visibilityState = 'hidden';
  h.document.dispatch('visibilitychange');
  h.clock.advance(1_000);
  assert.equal(h.sockets.length, before, 'a hidden page must not reconnect early');
  h.document.visibilityState = 'visible';
  h.document.dispatch('visibilitychange');
  const wait = h.clock.pending()[0];
  assert.ok(wait > 0 && wait <= 1_000, `wake delay ${wait}`);
  h.clock.advance(wait);
  assert.equal(h.sockets.length, before + 1);
  // The network coming back does the same.
  h.last().serverClose(1006);
  assert.ok(h.clock.pending()[0] > 1_000);
  h.window.dispatch('online');
  h.clock.advance(1_000);
  assert.equal(h.sockets.length, before + 2);
  h.lp.close();
});

test('a machine that slept through a long wait reconnects soon after the network comes back', () => {
  const h = harness({ random: MID });
  for (let i = 0; i < 7; i++) {
    h.last().serverClose(1006);
    h.clock.advance(h.clock.pending()[0]);
  }
  h.last().serverClose(1006); // the Wi-Fi dropped, then the lid was closed
  h.clock.advance(1_000);
  assert.equal(h.clock.pending()[0], 29_000);
  // An hour later by the wall clock; the retry timer still has its 29 s to go.
  h.clock.sleep(3_600_000);
  const before = h.sockets.length;
  h.window.dispatch('online');
  h.clock.advance(1_000);
  assert.equal(h.sockets.length, before + 1, 'not the rest of the backoff');
  assert.ok(h.statuses.at(-1).delayMs <= 1_000);
  h.lp.close();
});

test('waking up announces the new, shorter wait with reconnecting', () => {
  const h = harness({ random: MID });
  for (let i = 0; i < 6; i++) {
    h.last().serverClose(1006);
    h.clock.advance(h.clock.pending()[0]);
  }
  h.last().serverClose(1006);
  assert.equal(h.statuses.at(-1).delayMs, 30000);
  const tries = h.statuses.at(-1).tries;
  h.window.dispatch('online');
  const wait = h.clock.pending()[0];
  // A page showing "retrying in 30 s" must not keep showing it while the retry is under a second away.
  assert.equal(h.statuses.at(-1).status, 'reconnecting');
  assert.equal(h.statuses.at(-1).delayMs, wait);
  assert.equal(h.statuses.at(-1).tries, tries);
  h.lp.close();
});

test('waking up while open checks the heartbeat at once: a ping unanswered within the grace replaces the socket', () => {
  const h = harness();
  const ws = h.last();
  ws.hello({ heartbeat: 10 });
  // A laptop sleep: timers did not run, but the clock moved on; they run late on waking up.
  h.clock.late(60_000);
  h.document.dispatch('visibilitychange');
  assert.equal(ws.frames('ping').length, 2, 'waking up pings at once');
  h.clock.advance(HEARTBEAT_GRACE_MS - 1);
  assert.equal(h.lp.status, 'open');
  h.clock.advance(1);
  assert.equal(h.lp.status, 'reconnecting');
  assert.ok(ws.closedByClient, 'the dead socket was not closed');
  h.lp.close();
});

test('a machine that slept with a ping unanswered replaces the dead socket within the grace of waking up', () => {
  const h = harness();
  const ws = h.last();
  ws.hello({ heartbeat: 25 });
  h.clock.advance(25_000); // a ping goes out: the Wi-Fi is gone, no answer comes
  h.clock.advance(10_000); // then the lid is closed, its answer still awaited for 17 s
  h.clock.sleep(3_600_000); // timers resume with what they had left
  h.window.dispatch('online');
  h.clock.advance(HEARTBEAT_GRACE_MS);
  assert.equal(h.lp.status, 'reconnecting', 'not the 17 s the earlier ping had left');
  assert.ok(ws.closedByClient);
  h.lp.close();
});

test('waking up keeps a connection that answers the ping', () => {
  const h = harness();
  const ws = h.last();
  ws.hello({ heartbeat: 10 });
  h.clock.late(60_000);
  h.window.dispatch('online');
  assert.equal(ws.frames('ping').length, 2, 'the network coming back pings at once');
  ws.receive({ op: 'pong', ref: ws.frames('ping').at(-1).ref });
  h.clock.advance(HEARTBEAT_GRACE_MS);
  assert.equal(h.lp.status, 'open');
  assert.equal(h.sockets.length, 1);
  assert.equal(ws.closedByClient, null);
  h.lp.close();
});

/**
 * With nothing awaited, a wake-up ping gets the grace alone: a silent socket is replaced then.
 * @param {ReturnType<typeof harness>} h
 * @param {string} [why]
 */
function wakingUpGivesTheGraceAlone(h, why) {
  h.document.dispatch('visibilitychange');
  h.clock.advance(HEARTBEAT_GRACE_MS);
  assert.equal(h.lp.status, 'reconnecting', why);
  h.lp.close();
}

test('a tab switch while the server decides its subscribes keeps the connection: their answers come first', () => {
  // The server answers a connection's frames in order: a ping sent behind a subscribe whose
  // authorize() takes seconds is answered after it. The grace alone would drop a live socket,
  // resubscribe and meet the same wait again.
  const h = harness();
  h.lp.subscribe('team:7', () => {});
  h.lp.subscribe('team:8', () => {});
  const ws = h.last();
  ws.hello({ heartbeat: 25 });
  h.clock.advance(1_000);
  h.document.dispatch('visibilitychange'); // the user looked at another tab and came back
  assert.equal(ws.frames('ping').length, 1, 'waking up pings at once');
  h.clock.advance(HEARTBEAT_GRACE_MS + 1_500);
  assert.equal(h.lp.status, 'open', 'a socket the server is busy on was declared dead');
  const [first, second] = ws.frames('subscribe');
  ws.receive({ op: 'subscribed', ref: first.ref, topic: 'team:7', offset: null });
  h.clock.advance(1_900);
  ws.receive({ op: 'subscribed', ref: second.ref, topic: 'team:8', offset: null });
  ws.receive({ op: 'pong', ref: ws.frames('ping')[0].ref });
  h.clock.advance(HEARTBEAT_GRACE_MS);
  assert.equal(h.lp.status, 'open');
  assert.equal(h.sockets.length, 1);

  // With nothing awaited, waking up gives the grace alone again.
  wakingUpGivesTheGraceAlone(h);
});

/** A client whose subscribe to room:7 with `since` got its `subscribed`: its replay follows. */
function replayingAfterSubscribed(heartbeat) {
  const h = harness();
  h.lp.subscribe('room:7', () => {}, { since: '1700000000000000-3' });
  const ws = h.last();
  ws.hello({ heartbeat });
  const [sub] = ws.frames('subscribe');
  ws.receive({ op: 'subscribed', ref: sub.ref, topic: 'room:7', offset: '1700000000000000-9' });
  return { h, ws };
}

test('a tab switch while the server sends a replay keeps the connection: the pong comes after the replay', () => {
  // After `subscribed`, a subscribe with `since` goes on with its replay, and the server answers
  // a ping sent meanwhile only after it. A replay whose read waits on the store (a restart, which
  // the server waits out for up to 20 s) sends nothing meanwhile: the grace alone dropped the
  // socket, and every reconnect resubscribed and met the same wait again.
  const { h, ws } = replayingAfterSubscribed(25);
  ws.receive({ op: 'message', topic: 'room:7', offset: '1700000000000000-4', data: { n: 4 } });
  h.clock.advance(1_000);
  h.document.dispatch('visibilitychange'); // the replay's next read waits on the store
  h.clock.advance(HEARTBEAT_GRACE_MS + 15_000);
  assert.equal(h.lp.status, 'open', 'a socket the server is busy replaying on was declared dead');
  ws.receive({ op: 'message', topic: 'room:7', offset: '1700000000000000-5', data: { n: 5 } });
  ws.receive({ op: 'pong', ref: ws.frames('ping').at(-1).ref });
  assert.equal(h.sockets.length, 1);

  // The pong said the replay is done: waking up gives the grace alone again.
  wakingUpGivesTheGraceAlone(h);
});

test('with a short heartbeat, a replay silent while the server waits out a store restart keeps the connection', () => {
  // A replay whose read fails (Postgres or Redis restarting) sends nothing until the server gives
  // up with `reset`, within REPLAY_SILENCE_MS of the read's start, and the pong waits behind it:
  // with a 10 s heartbeat, heartbeat and grace alone (12 s) dropped the socket, and every
  // reconnect resubscribed and met the same wait again.
  assert.ok(REPLAY_SILENCE_MS >= 21_000, 'the server may be silent for 20 s of retries and its last read');
  const { h, ws } = replayingAfterSubscribed(10);
  h.clock.advance(9_999);
  ws.receive({ op: 'message', topic: 'room:7', offset: '1700000000000000-4', data: { n: 4 } });
  h.clock.advance(1); // the heartbeat's ping, just after the replay's last frame before its read fails
  assert.equal(ws.frames('ping').length, 1);
  h.clock.advance(21_000);
  assert.equal(h.lp.status, 'open', 'a socket the server is busy replaying on was declared dead');
  ws.receive({ op: 'reset', topic: 'room:7' });
  for (const ping of ws.frames('ping')) ws.receive({ op: 'pong', ref: ping.ref });
  assert.equal(h.sockets.length, 1);

  // Nothing awaited any more: a silent server is dropped after heartbeat and grace again.
  const pings = ws.frames('ping').length;
  h.clock.advance(h.clock.pending()[0]);
  assert.equal(ws.frames('ping').length, pings + 1);
  h.clock.advance(10_000 + HEARTBEAT_GRACE_MS - 1);
  assert.equal(h.lp.status, 'open');
  h.clock.advance(1);
  assert.equal(h.lp.status, 'reconnecting');
  assert.equal(h.statuses.at(-1).reason, 'heartbeat timeout');
  h.lp.close();
});

test('a subscribe from now or a refused one has no replay to wait for: waking up gives the grace alone', () => {
  const h = harness();
  h.lp.subscribe('room:7', () => {});
  h.lp.subscribe('room:8', () => {}, { since: '1700000000000000-3' });
  const ws = h.last();
  ws.hello({ heartbeat: 25 });
  const [now, since] = ws.frames('subscribe');
  ws.receive({ op: 'subscribed', ref: now.ref, topic: 'room:7', offset: '1700000000000000-9' });
  ws.receive({ op: 'refused', ref: since.ref, reason: 'forbidden' });
  wakingUpGivesTheGraceAlone(h);
});

test('a subscribe the server answered with a ref-less error stops counting as awaited once a later ping is answered', () => {
  // A subscribe frame the server could not read gets `error` without a ref: no `subscribed` or
  // `refused` ever comes for it. Counted as awaited for the connection's life, it gave every
  // later wake-up ping the whole heartbeat instead of the grace. The server answers in order, so
  // the pong of a ping sent after it says that no answer is coming.
  const h = harness();
  h.lp.subscribe('team:7', () => {});
  const ws = h.last();
  ws.hello({ heartbeat: 25 });
  ws.receive({ op: 'error', reason: 'bad_frame', detail: 'subscribe "since" must be an offset string or null' });
  assert.equal(h.errors.at(-1).reason, 'bad_frame');
  h.clock.advance(25_000); // the heartbeat's ping, sent after that subscribe
  h.lp.subscribe('team:8', () => {}); // sent after the ping: its answer comes after the pong
  ws.receive({ op: 'pong', ref: ws.frames('ping').at(-1).ref });
  h.document.dispatch('visibilitychange');
  h.clock.advance(HEARTBEAT_GRACE_MS + 1_500);
  assert.equal(h.lp.status, 'open', 'the subscribe sent after the ping no longer counted as awaited');
  ws.receive({ op: 'subscribed', ref: ws.frames('subscribe').at(-1).ref, topic: 'team:8', offset: null });
  ws.receive({ op: 'pong', ref: ws.frames('ping').at(-1).ref });
  wakingUpGivesTheGraceAlone(h, 'the wake-up ping waited for an answer that never comes');
});

test('a socket that dies while its subscribes wait for answers is still replaced, within heartbeat and grace', () => {
  const h = harness();
  h.lp.subscribe('team:7', () => {});
  const ws = h.last();
  ws.hello({ heartbeat: 25 });
  h.clock.advance(1_000);
  h.document.dispatch('visibilitychange');
  h.clock.advance(25_000 + HEARTBEAT_GRACE_MS - 1);
  assert.equal(h.lp.status, 'open');
  h.clock.advance(1);
  assert.equal(h.lp.status, 'reconnecting');
  assert.ok(ws.closedByClient);
  h.lp.close();
});

test('a page that slept without any wake-up event gets only the grace for its late ping', () => {
  const h = harness();
  const ws = h.last();
  ws.hello({ heartbeat: 25 });
  // A laptop that slept ten minutes, no visibilitychange or online on waking: the overdue ping
  // goes out late, and a socket that died meanwhile must not take another heartbeat to notice.
  h.clock.late(600_000);
  assert.equal(ws.frames('ping').length, 1);
  h.clock.advance(HEARTBEAT_GRACE_MS - 1);
  assert.equal(h.lp.status, 'open');
  h.clock.advance(1);
  assert.equal(h.lp.status, 'reconnecting');
  h.lp.close();
});

test('a hidden page whose timers run a minute late keeps a connection that answers its pings', () => {
  const h = harness();
  const ws = h.last();
  ws.hello({ heartbeat: 25 });
  // A hidden tab: the browser runs its timers about once a minute, all late together. Each ping
  // goes out late and the server answers it at once; the silence is the page's own.
  for (let i = 1; i <= 10; i++) {
    h.clock.late(60_000);
    assert.equal(h.lp.status, 'open', `minute ${i}: a live connection was declared dead`);
    for (const ping of ws.frames('ping').slice(i - 1)) ws.receive({ op: 'pong', ref: ping.ref });
  }
  assert.equal(ws.frames('ping').length, 10);
  assert.equal(h.sockets.length, 1);
  assert.equal(ws.closedByClient, null);
  h.lp.close();
});

test('close() stops everything: no timers, no reconnect, listeners removed', () => {
  const h = harness();
  h.last().hello({ heartbeat: 10 });
  h.lp.close();
  assert.equal(h.lp.status, 'closed');
  assert.deepEqual(h.clock.pending(), []);
  assert.deepEqual(h.sockets[0].closedByClient, { code: 1000, reason: 'client closed' });
  assert.equal(h.document.listeners.get('visibilitychange').size, 0);
  assert.equal(h.window.listeners.get('online').size, 0);
  h.clock.advance(3_600_000);
  assert.equal(h.sockets.length, 1);
});

test('after close() lp.session is null: a closed client holds no session', () => {
  // A page that signs the user out closes the client; a header reading lp.session must not go
  // on naming the user who left.
  const h = harness();
  h.last().hello({ session: { subject: 'alice' } });
  assert.deepEqual(h.lp.session, { subject: 'alice' });
  h.lp.close();
  assert.equal(h.lp.session, null);
});

test('close() in a status listener leaves every listener on closed, none on the status it replaced', () => {
  const h = harness();
  // A page that gives up after a few failed attempts, and an indicator registered after it.
  h.lp.on('status', (status, info) => {
    if (status === 'reconnecting' && info.tries >= 2) h.lp.close();
  });
  let shown = null;
  h.lp.on('status', (status) => (shown = status));
  h.last().serverClose(1006);
  h.clock.advance(h.clock.pending()[0]);
  h.last().serverClose(1006);
  assert.equal(h.lp.status, 'closed');
  assert.equal(shown, 'closed');
  assert.equal(h.statuses.at(-1).status, 'closed');
  assert.deepEqual(h.clock.pending(), []);
});

test('close() on a client the server refused (unauthorized) changes nothing: every listener hears unauthorized', () => {
  // A page that tidies up on `unauthorized` (close() from a logout helper or a component's
  // teardown), and a router registered after it that sends the user to sign in on that status.
  const h = harness();
  h.lp.on('status', (status) => {
    if (status === 'unauthorized') h.lp.close();
  });
  let routed = null;
  h.lp.on('status', (status) => (routed = status));
  h.last().hello();
  h.last().serverClose(4403, 'session revoked');
  assert.equal(routed, 'unauthorized');
  assert.equal(h.lp.status, 'unauthorized');
  // Later calls, and a second close() of a closed client, announce nothing either.
  h.lp.close();
  assert.equal(h.lp.status, 'unauthorized');
  assert.deepEqual(h.statuses.map((s) => s.status), ['open', 'unauthorized']);
  assert.throws(() => h.lp.subscribe('chat:a', () => {}), /refused its session \(4403/);
  const closed = harness();
  closed.lp.close();
  closed.lp.close();
  assert.deepEqual(closed.statuses.map((s) => s.status), ['closed']);
});

test('a status listener removed by an earlier one during the same change is not called', () => {
  // A page whose router unmounts a component on `unauthorized`: the component's cleanup removes
  // its listener, which must not then run against what was torn down (as with DOM events).
  const h = harness();
  const heard = [];
  let offWidget = () => {};
  h.lp.on('status', (status) => {
    heard.push(['router', status]);
    if (status === 'unauthorized') offWidget();
  });
  offWidget = h.lp.on('status', (status) => heard.push(['widget', status]));
  h.last().hello();
  h.last().serverClose(4401);
  assert.deepEqual(heard, [['router', 'open'], ['widget', 'open'], ['router', 'unauthorized']]);
});

test('a URL whose scheme no WebSocket takes throws at the call, naming it, instead of failing every retry', () => {
  // `localhost:8765` reads as the scheme `localhost:`: the browser would refuse each attempt with a
  // SyntaxError, and the client would retry it with backoff for as long as the page is open.
  for (const [given, scheme] of [['localhost:8765', 'localhost:'], ['localhost:8765/', 'localhost:'],
    ['ftp://push.test/', 'ftp:'], ['javascript:alert(1)', 'javascript:']]) {
    const { WebSocket, sockets } = fakeWebSocketClass();
    assert.throws(() => harness({ url: given, WebSocket }), (err) => {
      assert.ok(err instanceof TypeError);
      assert.ok(err.message.includes(`"${scheme}"`), err.message);
      assert.match(err.message, /ws:\/\/, wss:\/\/, http:\/\/ or https:\/\//);
      return true;
    });
    assert.equal(sockets.length, 0, `${given}: no socket attempted`);
  }
  // Host and port without a scheme get the fix spelled out.
  assert.throws(() => harness({ url: 'localhost:8765/live' }), /write ws:\/\/localhost:8765\/live/);
  // Every scheme a WebSocket takes, in any case, and paths, still connect.
  for (const given of ['ws://push.test/', 'WSS://push.test/', 'Http://push.test/', 'https:push.test', '/push', 'push/live']) {
    const h = harness({ url: given, window: { location: { href: 'https://app.test/page' } } });
    assert.equal(h.sockets.length, 1, given);
    assert.deepEqual(h.errors, [], given);
    h.lp.close();
  }
});

test('a URL with a #fragment connects without it, where browsers refuse one that has it', () => {
  const { WebSocket, sockets } = fakeWebSocketClass();
  class BrowserLike extends WebSocket {
    constructor(url, protocols) {
      if (url.includes('#')) throw new SyntaxError(`The URL '${url}' contains a fragment identifier`);
      super(url, protocols);
    }
  }
  for (const [given, sent] of [['https://push.test/live?x=1#top', 'wss://push.test/live?x=1'],
    ['http://push.test/push#', 'ws://push.test/push']]) {
    const h = harness({ url: given, WebSocket: BrowserLike });
    assert.equal(sockets.at(-1).url, sent);
    assert.deepEqual(h.errors, [], 'no connect_failed');
    sockets.at(-1).hello();
    assert.equal(h.lp.status, 'open');
    h.lp.close();
  }
});

test('the token goes in Sec-WebSocket-Protocol, never the URL, and a token function is asked on every connect', () => {
  let n = 0;
  const h = harness({ token: () => `tok-${++n}` });
  assert.equal(h.last().url, 'ws://push.test/');
  assert.deepEqual(h.last().protocols, ['livepush', 'livepush.token.tok-1']);
  h.last().serverClose(1006);
  h.clock.advance(1_000);
  assert.deepEqual(h.last().protocols, ['livepush', 'livepush.token.tok-2']);
  h.lp.close();
});

test('a token function that closes the client (the user signed out) leaves it closed: no socket, no later open', () => {
  let lp = null;
  let signedIn = true;
  const h = harness({
    token: () => {
      if (!signedIn) lp?.close();
      return 'tok';
    },
  });
  lp = h.lp;
  h.last().hello();
  signedIn = false;
  h.last().serverClose(1006);
  h.clock.advance(h.clock.pending()[0]);
  assert.equal(h.sockets.length, 1, 'no handshake goes out after close()');
  assert.equal(lp.status, 'closed');
  assert.deepEqual(h.clock.pending(), [], 'no connect timeout or retry left behind');
  assert.deepEqual(h.statuses.map((s) => s.status), ['open', 'reconnecting', 'closed']);

  // One that closes it and then throws: nothing retried, nothing reported after `closed`.
  let retries = 0;
  /** @type {any} */
  let closing = null;
  const u = harness({
    token: () => {
      if (closing) {
        closing.close();
        throw new Error('signed out');
      }
      return 'tok';
    },
    reconnectAfterMs: () => (retries++, 1_000),
  });
  closing = u.lp;
  u.last().hello();
  u.last().serverClose(1006);
  const asked = retries;
  u.clock.advance(1_000);
  assert.equal(u.lp.status, 'closed');
  assert.equal(u.sockets.length, 1);
  assert.deepEqual(u.clock.pending(), []);
  assert.deepEqual(u.errors, []);
  assert.equal(retries, asked, 'no retry delay asked after closed');
});

test('a token function that returns a Promise is reported as such, and no socket goes out with it', async () => {
  const h = harness({ token: async () => 'tok' });
  assert.equal(h.sockets.length, 0, 'no handshake offers "livepush.token.[object Promise]"');
  assert.equal(h.lp.status, 'reconnecting');
  await Promise.resolve(); // the constructor's attempt is reported once `new` returned
  assert.equal(h.errors.length, 1);
  assert.equal(h.errors[0].reason, 'connect_failed');
  assert.match(h.errors[0].detail, /token function returned a Promise: return the token itself/);
  h.lp.close();
});

test('a token option that is neither a string nor a function throws at the call, not on every attempt', () => {
  // `token: getToken()` with an async getToken hands over a Promise: no attempt could ever send
  // it, so it is said at the line that passed it, not as connect_failed every retry for good.
  for (const [token, said] of [[Promise.resolve('tok'), /options.token is a Promise: pass the token string, or a function that returns it/],
    [42, /options.token is a number: pass the token string/], [{ token: 'tok' }, /options.token is an object: pass the token string/]]) {
    const h = { errors: [] };
    assert.throws(() => harness({ token, onError: (e) => h.errors.push(e) }), { name: 'TypeError', message: said });
    assert.deepEqual(h.errors, []);
  }
  // A string, a function, null or nothing are tokens (or none).
  for (const token of ['tok', () => 'tok', null, undefined]) harness({ token }).lp.close();
});

test('a token a subprotocol cannot carry is reported without the token, and no socket goes out with it', async () => {
  // A token read from a response body often ends in a newline; the browser would refuse it with
  // a SyntaxError quoting the whole token, on every retry.
  const h = harness({ token: 'secret-session-token\n' });
  assert.equal(h.sockets.length, 0);
  await Promise.resolve(); // the constructor's attempt is reported once `new` returned
  assert.equal(h.errors.length, 1);
  assert.equal(h.errors[0].reason, 'connect_failed');
  assert.match(h.errors[0].detail, /the token has characters a WebSocket subprotocol cannot carry/);
  assert.doesNotMatch(h.errors[0].detail, /secret-session-token/);
  h.lp.close();
});

test('without a token the client still offers the livepush subprotocol', () => {
  const h = harness({});
  assert.deepEqual(h.last().protocols, ['livepush']);
  h.lp.close();
});

test('an onError that throws on a failed connect attempt does not stop the reconnects', () => {
  let asked = 0;
  const h = harness({
    random: MID,
    // The second attempt cannot get a token (storage unavailable, say); later ones can.
    token: () => {
      asked += 1;
      if (asked === 2) throw new Error('no token just now');
      return `tok-${asked}`;
    },
    onError: () => {
      throw new Error('the logging endpoint is down');
    },
  });
  h.last().hello();
  h.last().serverClose(1006);
  assert.doesNotThrow(() => h.clock.advance(500)); // the attempt whose token throws
  assert.equal(h.lp.status, 'reconnecting');
  assert.equal(h.clock.pending().length, 1, 'a next attempt is scheduled');
  h.clock.advance(h.clock.pending()[0]);
  assert.equal(h.sockets.length, 2);
  assert.deepEqual(h.last().protocols, ['livepush', 'livepush.token.tok-3']);
  h.last().hello();
  assert.equal(h.lp.status, 'open');
  h.lp.close();
});

test('a reconnectAfterMs longer than a timer holds waits the longest one, never retrying at once', () => {
  // Browsers and Node run a timer set past 2^31 - 1 ms at once: "wait for ever" would hammer.
  const h = harness({ reconnectAfterMs: () => Number.MAX_SAFE_INTEGER });
  h.last().hello();
  h.last().serverClose(1006);
  assert.equal(h.lp.status, 'reconnecting');
  assert.deepEqual(h.clock.pending(), [2 ** 31 - 1]);
  assert.equal(h.statuses.at(-1).delayMs, 2 ** 31 - 1);
  assert.deepEqual(h.errors, []);
  h.lp.close();
});

test('a reconnectAfterMs that throws or returns no number falls back to the default backoff', () => {
  for (const broken of [() => { throw new Error('bug in the app'); }, () => undefined, () => NaN, () => -1]) {
    const h = harness({ random: MID, reconnectAfterMs: broken });
    h.last().hello();
    assert.doesNotThrow(() => h.last().serverClose(1006));
    assert.equal(h.lp.status, 'reconnecting');
    assert.deepEqual(h.clock.pending(), [500], `${broken}: the default first delay`);
    assert.deepEqual(h.errors.map((e) => e.reason), ['handler_error']);
    h.clock.advance(500);
    assert.equal(h.sockets.length, 2);
    h.lp.close();
  }
});

test('a reconnectAfterMs or token function that throws a value with no string form still leaves a next attempt scheduled', () => {
  const bare = () => Object.create(null);
  for (const options of [
    { reconnectAfterMs: () => { throw bare(); } },
    { reconnectAfterMs: () => bare() },
    { token: (() => { let asked = 0; return () => { asked += 1; if (asked === 2) throw bare(); return 'tok'; }; })() },
  ]) {
    const h = harness({ random: MID, ...options });
    h.last().hello();
    assert.doesNotThrow(() => h.last().serverClose(1006));
    assert.doesNotThrow(() => h.clock.advance(h.clock.pending()[0]));
    assert.equal(h.lp.status, 'reconnecting');
    assert.equal(h.clock.pending().length, 1, 'a next attempt is scheduled');
    assert.ok(h.errors.length > 0 && h.errors.every((e) => e.detail.includes('a value with no string form')));
    h.lp.close();
  }
});

test('a client closed from onError while it reports a failed attempt stays closed, with nothing scheduled', () => {
  // A page that gives up when no connection can be attempted (its token function is async, say),
  // and one that closes when its own reconnectAfterMs gave no delay.
  const box = {};
  const giveUp = (err) => {
    if (err.reason === 'connect_failed' || err.reason === 'handler_error') box.lp.close();
  };
  for (const options of [
    { token: (() => { let n = 0; return () => (++n === 1 ? 'tok' : Promise.resolve('tok')); })() },
    { reconnectAfterMs: () => NaN },
  ]) {
    const h = harness({ ...options, onError: giveUp });
    box.lp = h.lp;
    h.last().hello();
    h.last().serverClose(1006);
    h.clock.advance(1_000);
    assert.equal(h.lp.status, 'closed');
    assert.deepEqual(h.statuses.map((s) => s.status).slice(-1), ['closed'], 'nothing announced after closed');
    assert.deepEqual(h.clock.pending(), []);
    h.clock.advance(3_600_000);
    assert.equal(h.sockets.length, 1);
  }
});

test('a failure of the first attempt reaches onError after `new` returned, so an onError that closes the client it names works', async () => {
  // const lp = new LivePush(url, {onError: () => lp.close()}): had onError run inside the
  // constructor, `lp` would not exist yet, its call would throw, and the client would retry for good.
  let attempts = 0;
  const Refusing = class {
    constructor() {
      attempts += 1;
      throw new SyntaxError("The URL's scheme must be either 'ws' or 'wss'"); // as a browser's WebSocket throws
    }
  };
  for (const options of [{ token: async () => 'tok' }, { WebSocket: Refusing }]) {
    const said = [];
    const clock = new FakeClock();
    const { WebSocket } = fakeWebSocketClass();
    const lp = new LivePush('ws://push.test/', {
      WebSocket, now: clock.now, setTimeout: clock.setTimeout, clearTimeout: clock.clearTimeout,
      document: null, window: null, ...options,
      onError: (err) => {
        said.push(err.reason);
        lp.close();
      },
    });
    assert.deepEqual(said, [], 'nothing said before `new` returned');
    await Promise.resolve();
    assert.deepEqual(said, ['connect_failed']);
    assert.equal(lp.status, 'closed');
    assert.deepEqual(clock.pending(), [], 'no retry scheduled');
  }
  assert.equal(attempts, 1, 'the refused socket was attempted once, not retried');
});

test('what the first attempt reported is not said once the page closed the client', async () => {
  const h = harness({ token: async () => 'tok' });
  h.lp.close();
  await Promise.resolve();
  assert.deepEqual(h.errors, []);
});

test('a client closed from onError while a transient refusal is reported leaves no retry timer', () => {
  const box = {};
  const h = harness({ reconnectAfterMs: () => NaN, onError: () => box.lp.close() });
  box.lp = h.lp;
  h.lp.subscribe('chat:a', () => {}, { onRefused: () => {} });
  h.last().hello();
  const [frame] = h.last().frames('subscribe');
  h.last().receive({ op: 'refused', ref: frame.ref, reason: 'unavailable' });
  assert.equal(h.lp.status, 'closed');
  assert.deepEqual(h.clock.pending(), []);
});
