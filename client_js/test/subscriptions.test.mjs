import assert from 'node:assert/strict';
import test from 'node:test';

import { SUBSCRIBE_BURST, SUBSCRIBES_PER_SECOND } from '../livepush.js';
import { harness } from '../testing/fakes.mjs';

/** Subscribe, collecting what is delivered as [data, offset] pairs. */
function collect(lp, topic, options) {
  const got = [];
  const sub = lp.subscribe(topic, (data, meta) => got.push([data, meta.offset, meta.topic]), options);
  return { sub, got, data: () => got.map((g) => g[0]) };
}

/** Reconnect: the server drops the socket, the client waits, a new socket says hello. */
function reconnect(h, code = 1006) {
  h.last().serverClose(code);
  h.clock.advance(h.clock.pending()[0]);
  h.last().hello();
  return h.last();
}

/** The server takes the connection as `session` (anonymous by default) and refuses its first subscribe `forbidden`. */
function refuseFirst(h, session = null) {
  h.last().hello({ session });
  h.last().receive({ op: 'refused', ref: h.last().frames('subscribe')[0].ref, reason: 'forbidden' });
}

test('subscribe frames wait for hello, then go out with since and a ref', () => {
  const h = harness();
  collect(h.lp, 'chat:lobby', { since: '41' });
  collect(h.lp, 'public:news');
  const ws = h.last();
  assert.deepEqual(ws.sent, []);
  ws.hello();
  assert.deepEqual(
    ws.frames('subscribe').map(({ topic, since }) => ({ topic, since })),
    [
      { topic: 'chat:lobby', since: '41' },
      { topic: 'public:news', since: null },
    ],
  );
  const refs = ws.frames('subscribe').map((f) => f.ref);
  assert.equal(new Set(refs).size, 2);
  // Subscribing while open sends at once.
  collect(h.lp, 'user:7');
  assert.equal(ws.frames('subscribe').at(-1).topic, 'user:7');
  h.lp.close();
});

test('after a reconnect every subscription is resent with the last offset it saw', () => {
  const h = harness();
  const a = collect(h.lp, 'chat:a', { since: '5' });
  const b = collect(h.lp, 'chat:b');
  const c = collect(h.lp, 'chat:c', { since: '1700000000000-0' });
  let ws = h.last();
  ws.hello();
  ws.acceptSubscribes();
  ws.receive({ op: 'message', topic: 'chat:a', offset: '6', data: 'a6' });
  ws.receive({ op: 'message', topic: 'chat:a', offset: '9', data: 'a9' });
  ws.receive({ op: 'message', topic: 'chat:b', offset: '3', data: 'b3' });
  assert.equal(a.sub.offset, '9');
  assert.equal(b.sub.offset, '3');

  ws = reconnect(h);
  const since = Object.fromEntries(ws.frames('subscribe').map((f) => [f.topic, f.since]));
  assert.deepEqual(since, { 'chat:a': '9', 'chat:b': '3', 'chat:c': '1700000000000-0' });
  // Replayed history overlapping what we had is dropped; new messages come through.
  ws.acceptSubscribes();
  for (const [off, d] of [['9', 'a9'], ['10', 'a10']]) ws.receive({ op: 'message', topic: 'chat:a', offset: off, data: d });
  assert.deepEqual(a.data(), ['a6', 'a9', 'a10']);
  assert.deepEqual(c.data(), []);
  h.lp.close();
});

test('a subscription from now that got no message yet resumes from where subscribed said it stood', () => {
  const h = harness();
  const quiet = collect(h.lp, 'chat:quiet');
  const job = collect(h.lp, 'job:7');
  let ws = h.last();
  ws.hello();
  const refs = Object.fromEntries(ws.frames('subscribe').map((f) => [f.topic, f.ref]));
  ws.receive({ op: 'subscribed', ref: refs['chat:quiet'], topic: 'chat:quiet', offset: '1767225600000000-41' });
  ws.receive({ op: 'subscribed', ref: refs['job:7'], topic: 'job:7', offset: '3' });
  assert.equal(quiet.sub.offset, '1767225600000000-41');
  ws = reconnect(h); // messages published while away follow offset 41: the resubscribe asks for them
  const since = Object.fromEntries(ws.frames('subscribe').map((f) => [f.topic, f.since]));
  // A state topic asks afresh: its snapshot (version 3) is what it has not seen yet.
  assert.deepEqual(since, { 'chat:quiet': '1767225600000000-41', 'job:7': null });
  ws.acceptSubscribes();
  ws.receive({ op: 'message', topic: 'chat:quiet', offset: '1767225600000000-42', data: 'q42' });
  ws.receive({ op: 'message', topic: 'job:7', offset: '3', data: { event: 'snapshot' } });
  assert.deepEqual(quiet.data(), ['q42']);
  assert.deepEqual(job.data(), [{ event: 'snapshot' }]);
  h.lp.close();
});

test('duplicates and stale messages are dropped by offset', () => {
  const h = harness();
  const s = collect(h.lp, 'chat:a', { since: '1700000000000-5' });
  const ws = h.last();
  ws.hello();
  ws.acceptSubscribes();
  for (const off of ['1700000000000-4', '1700000000000-5', '1700000000000-6', '1700000000000-6', '1700000000000-10', '1700000000000-9', '1700000000001-0']) {
    ws.receive({ op: 'message', topic: 'chat:a', offset: off, data: off });
  }
  assert.deepEqual(s.data(), ['1700000000000-6', '1700000000000-10', '1700000000001-0']);
  assert.equal(s.sub.offset, '1700000000001-0');
  assert.deepEqual(s.got[0], ['1700000000000-6', '1700000000000-6', 'chat:a']);
  h.lp.close();
});

test('reset calls onReset; a reconnect before the next message resumes where the live messages began', () => {
  const h = harness();
  const resets = [];
  const s = collect(h.lp, 'chat:a', { since: '1767225600000000-3', onReset: (t) => resets.push(t) });
  let ws = h.last();
  ws.hello();
  // The page was rendered longer ago than the history kept: the server says where it stands
  // now, then `reset`; the page refetches, and live messages follow from there.
  ws.receive({ op: 'subscribed', ref: ws.frames('subscribe')[0].ref, topic: 'chat:a', offset: '1767225600000000-20' });
  ws.receive({ op: 'reset', topic: 'chat:a' });
  assert.deepEqual(resets, ['chat:a']);
  // The connection drops before the next message; what is published meanwhile follows -20,
  // so "from now" would lose it.
  ws = reconnect(h);
  assert.deepEqual(ws.frames('subscribe').map((f) => f.since), ['1767225600000000-20']);
  ws.acceptSubscribes();
  ws.receive({ op: 'message', topic: 'chat:a', offset: '1767225600000000-21', data: 'published while away' });
  assert.deepEqual(s.data(), ['published while away']);
  h.lp.close();
});

test('a reset the page has no onReset for reaches onError, saying messages were missed; one it handles does not', () => {
  const h = harness();
  collect(h.lp, 'chat:a', { since: '1767225600000000-3' });
  collect(h.lp, 'chat:b', { since: '1767225600000000-3', onReset: () => {} });
  const ws = h.last();
  ws.hello();
  ws.acceptSubscribes();
  ws.receive({ op: 'reset', topic: 'chat:a' });
  ws.receive({ op: 'reset', topic: 'chat:b' });
  assert.deepEqual(h.errors.map((e) => e.reason), ['reset']);
  assert.match(h.errors[0].detail, /^chat:a: messages were missed .*pass onReset to refetch/);
  h.lp.close();
});

test('a reset after messages (the page fell behind) resumes from the last offset delivered', () => {
  const h = harness();
  const resets = [];
  const s = collect(h.lp, 'chat:a', { onReset: (t) => resets.push(t) });
  let ws = h.last();
  ws.hello();
  ws.receive({ op: 'subscribed', ref: ws.frames('subscribe')[0].ref, topic: 'chat:a', offset: '5' });
  ws.receive({ op: 'message', topic: 'chat:a', offset: '6', data: 6 });
  ws.receive({ op: 'reset', topic: 'chat:a' }); // 7 and 8 were dropped for this slow page
  assert.deepEqual(resets, ['chat:a']);
  ws.receive({ op: 'message', topic: 'chat:a', offset: '9', data: 9 });
  ws.receive({ op: 'reset', topic: 'chat:a' }); // 10 dropped, and the connection is lost
  // History still holds what was dropped: resuming from the last offset had loses nothing.
  ws = reconnect(h);
  assert.deepEqual(ws.frames('subscribe').map((f) => f.since), ['9']);
  ws.acceptSubscribes();
  ws.receive({ op: 'message', topic: 'chat:a', offset: '10', data: 10 });
  assert.deepEqual(s.data(), [6, 9, 10]);
  h.lp.close();
});

test('a signed topic is matched by ref; messages on the plain topic reach it', () => {
  const h = harness();
  const subscribed = [];
  const s = collect(h.lp, 'job:42~abc.def', { onSubscribed: (info) => subscribed.push(info) });
  assert.equal(s.sub.plainTopic, 'job:42');
  const ws = h.last();
  ws.hello();
  const frame = ws.frames('subscribe')[0];
  assert.equal(frame.topic, 'job:42~abc.def'); // resent exactly as given
  ws.receive({ op: 'subscribed', ref: frame.ref, topic: 'job:42', offset: '12' });
  assert.deepEqual(subscribed, [{ topic: 'job:42', offset: '12' }]);
  assert.equal(s.sub.state, 'active');
  ws.receive({ op: 'message', topic: 'job:42', offset: '12', data: { event: 'snapshot' } });
  ws.receive({ op: 'message', topic: 'job:43', offset: '13', data: { event: 'other' } });
  assert.deepEqual(s.got, [[{ event: 'snapshot' }, '12', 'job:42']]);
  h.lp.close();
});

test('every callback names the plain topic, onRefused too: a signature is a permission, not for logs', () => {
  const h = harness();
  const named = [];
  const s = collect(h.lp, 'job:42~1700000000~sig', {
    onRefused: (reason, info) => named.push(['refused', info.topic]),
    onSubscribed: (info) => named.push(['subscribed', info.topic]),
  });
  let ws = h.last();
  ws.hello();
  ws.receive({ op: 'subscribed', ref: ws.frames('subscribe')[0].ref, topic: 'job:42', offset: null });
  ws = reconnect(h);
  ws.receive({ op: 'refused', ref: ws.frames('subscribe')[0].ref, reason: 'expired' });
  assert.deepEqual(named, [['subscribed', 'job:42'], ['refused', 'job:42']]);
  assert.equal(s.sub.topic, 'job:42~1700000000~sig', 'the topic as given stays on the subscription');
  h.lp.close();
});

test('a refused subscription calls onRefused and is never resent', () => {
  const h = harness();
  const refused = [];
  const bad = collect(h.lp, 'secret:x', { onRefused: (reason, info) => refused.push([reason, info.topic]) });
  const good = collect(h.lp, 'public:x');
  let ws = h.last();
  ws.hello();
  const [badFrame, goodFrame] = ws.frames('subscribe');
  ws.receive({ op: 'refused', ref: badFrame.ref, reason: 'forbidden' });
  ws.receive({ op: 'subscribed', ref: goodFrame.ref, topic: 'public:x', offset: null });
  assert.deepEqual(refused, [['forbidden', 'secret:x']]);
  assert.equal(bad.sub.state, 'refused');
  ws.receive({ op: 'message', topic: 'secret:x', offset: '1', data: 'leak' });
  assert.deepEqual(bad.data(), []);
  ws = reconnect(h);
  assert.deepEqual(ws.frames('subscribe').map((f) => f.topic), ['public:x']);
  h.lp.close();
});

test('a refusal the page has no onRefused for reaches onError, saying what to do; one it handles does not', () => {
  const h = harness();
  collect(h.lp, 'team:7');
  collect(h.lp, 'job:42~expired-signature');
  collect(h.lp, 'secret:x', { onRefused: () => {} });
  const ws = h.last();
  ws.hello();
  const [team, job, secret] = ws.frames('subscribe');
  ws.receive({ op: 'refused', ref: team.ref, reason: 'forbidden' });
  ws.receive({ op: 'refused', ref: job.ref, reason: 'expired' });
  ws.receive({ op: 'refused', ref: secret.ref, reason: 'forbidden' });
  assert.deepEqual(h.errors.map((e) => e.reason), ['refused', 'refused']);
  assert.match(h.errors[0].detail, /^subscribe to team:7 refused: forbidden: no rule on the server allows it/);
  // The signature is the permission: it stays out of what may reach a log.
  assert.match(h.errors[1].detail, /^subscribe to job:42 refused: expired: .*render a fresh one/);
  assert.doesNotMatch(h.errors[1].detail, /expired-signature/);
  h.lp.close();
});

test('a forbidden topic on a connection the server took as anonymous, though a token was sent, says the token was not taken', () => {
  // The page slept past its token's expiry: under LIVEPUSH_AUTHENTICATE=optional it comes back
  // anonymous, and its user's topics are refused. No rule is missing: the session is.
  const h = harness({ token: 'expired-token' });
  h.last().hello({ session: null });
  collect(h.lp, 'user:7');
  h.last().receive({ op: 'refused', ref: h.last().frames('subscribe')[0].ref, reason: 'forbidden' });
  assert.match(h.errors[0].detail, /^subscribe to user:7 refused: forbidden: the server took this connection as anonymous although a token was sent/);
  assert.doesNotMatch(h.errors[0].detail, /expired-token/);
  assert.doesNotMatch(h.errors[0].detail, /token function/);
  assert.equal(h.sockets.length, 1, 'a fixed token has no renewal to reconnect with');
  // With the session in place, a forbidden topic is a missing rule.
  h.last().serverClose(1006);
  h.clock.advance(h.clock.pending()[0]);
  h.last().hello({ session: { subject: '7' } });
  collect(h.lp, 'admin:all');
  const frame = h.last().frames('subscribe').find((f) => f.topic === 'admin:all');
  h.last().receive({ op: 'refused', ref: frame.ref, reason: 'forbidden' });
  assert.match(h.errors.at(-1).detail, /^subscribe to admin:all refused: forbidden: no rule on the server allows it/);
  h.lp.close();
});

test('a forbidden topic on a connection taken as anonymous reconnects with the token the token function renewed, and subscribes again where it was', () => {
  // The page slept past its token's expiry and renewed it meanwhile (its own timer, a fetch):
  // under LIVEPUSH_AUTHENTICATE=optional the stale token made the connection anonymous.
  let token = 'expired-token';
  let asked = 0;
  const h = harness({ token: () => { asked += 1; return token; } });
  const refused = [];
  const user = collect(h.lp, 'user:7', { since: '41', onRefused: (reason) => refused.push(reason) });
  const news = collect(h.lp, 'public:news');
  const first = h.last();
  first.hello({ session: null });
  token = 'fresh-token';
  const [userFrame, newsFrame] = first.frames('subscribe');
  first.receive({ op: 'subscribed', ref: newsFrame.ref, topic: 'public:news', offset: '5' });
  first.receive({ op: 'refused', ref: userFrame.ref, reason: 'forbidden' });
  assert.equal(asked, 2, 'asked once at the connect and once for the refusal');
  assert.equal(h.sockets.length, 2, 'a new connection at once, no backoff');
  assert.deepEqual(first.closedByClient, { code: 1000, reason: 'token renewed' });
  assert.deepEqual(h.last().protocols, ['livepush', 'livepush.token.fresh-token']);
  assert.equal(asked, 2, 'the new connection offers the token the function gave, without asking again');
  assert.deepEqual(h.statuses.map((s) => s.status), ['open', 'reconnecting']);
  assert.equal(h.statuses.at(-1).reason, 'token renewed');
  assert.equal(h.statuses.at(-1).delayMs, 0);
  assert.equal(user.sub.state, 'pending');
  // A frame of the old connection still on its way is not heard.
  first.receive({ op: 'message', topic: 'public:news', offset: '6', data: 'old connection' });

  const ws = h.last();
  ws.hello({ session: { subject: '7' } });
  assert.deepEqual(
    ws.frames('subscribe').map(({ topic, since }) => ({ topic, since })),
    [{ topic: 'user:7', since: '41' }, { topic: 'public:news', since: '5' }],
  );
  ws.acceptSubscribes();
  ws.receive({ op: 'message', topic: 'user:7', offset: '42', data: 'for 7' });
  ws.receive({ op: 'message', topic: 'public:news', offset: '6', data: 'news' });
  assert.deepEqual(user.data(), ['for 7']);
  assert.deepEqual(news.data(), ['news']);
  assert.equal(user.sub.state, 'active');
  assert.deepEqual(refused, []);
  assert.deepEqual(h.errors, []);
  assert.equal(h.lp.status, 'open');
  h.lp.close();
});

test('a token function that gives the same stale token again, or none, changes nothing: the refusal is reported as before', () => {
  for (const renewed of ['expired-token', null, '']) {
    let token = 'expired-token';
    const h = harness({ token: () => token });
    const user = collect(h.lp, 'user:7');
    h.last().hello({ session: null });
    token = renewed; // not renewed yet, or the user signed out
    h.last().receive({ op: 'refused', ref: h.last().frames('subscribe')[0].ref, reason: 'forbidden' });
    assert.equal(h.sockets.length, 1, `no reconnect when the function gives ${JSON.stringify(renewed)}`);
    assert.equal(user.sub.state, 'refused');
    assert.deepEqual(h.errors.map((e) => e.reason), ['refused']);
    assert.match(h.errors[0].detail, /^subscribe to user:7 refused: forbidden: the server took this connection as anonymous although a token was sent .*, and the token function gave no other token the server took: sign the user in again/);
    assert.doesNotMatch(h.errors[0].detail, /expired-token/);
    h.lp.close();
  }
});

test('a topic refused again on the connection opened with a renewed token is reported, and not renewed again', () => {
  // The renewed token was not taken either, or the server takes no token at all
  // (LIVEPUSH_AUTHENTICATE=off): a function that makes a new token on every call must not
  // reconnect for ever.
  let n = 0;
  const h = harness({ token: () => `tok-${++n}` });
  const user = collect(h.lp, 'user:7', { since: '3' });
  refuseFirst(h);
  assert.equal(h.sockets.length, 2);
  assert.deepEqual(h.last().protocols, ['livepush', 'livepush.token.tok-2']);
  h.last().hello({ session: null });
  assert.equal(h.last().frames('subscribe')[0].since, '3');
  h.last().receive({ op: 'refused', ref: h.last().frames('subscribe')[0].ref, reason: 'forbidden' });
  assert.equal(h.sockets.length, 2, 'one reconnect for the renewal, not a loop');
  assert.equal(n, 2, 'the connection opened for the renewal does not ask again');
  assert.equal(user.sub.state, 'refused');
  assert.deepEqual(h.errors.map((e) => e.reason), ['refused']);
  assert.match(h.errors[0].detail, /the server took this connection as anonymous although a token was sent .*, and the token function gave no other token the server took/);
  // A later connection (the network dropped) renews again for a topic refused on it: one each.
  h.last().serverClose(1006);
  h.clock.advance(h.clock.pending()[0]);
  h.last().hello({ session: null });
  collect(h.lp, 'user:8');
  h.last().receive({ op: 'refused', ref: h.last().frames('subscribe')[0].ref, reason: 'forbidden' });
  assert.equal(h.sockets.length, 4);
  assert.deepEqual(h.last().protocols, ['livepush', 'livepush.token.tok-4']);
  h.lp.close();
});

test('a forbidden topic on a connection that has its session, or sent no token, asks no token function', () => {
  let asked = 0;
  const h = harness({ token: () => { asked += 1; return `tok-${asked}`; } });
  collect(h.lp, 'admin:all');
  refuseFirst(h, { subject: '7' });
  assert.equal(asked, 1);
  assert.equal(h.sockets.length, 1);
  assert.match(h.errors[0].detail, /no rule on the server allows it/);
  h.lp.close();

  const anonymous = harness({ token: () => { asked += 1; return null; } });
  collect(anonymous.lp, 'user:7');
  refuseFirst(anonymous);
  assert.equal(asked, 2, 'asked at the connect only');
  assert.equal(anonymous.sockets.length, 1);
  assert.match(anonymous.errors[0].detail, /no rule on the server allows it/);
  anonymous.lp.close();
});

/** A token function that gives a stale token at the connect, and what `renew()` does when asked again. */
function staleThen(renew) {
  let asked = 0;
  return () => (++asked === 1 ? 'expired-token' : renew());
}

test('a token function that throws when asked for a renewed token is reported, and so is the refusal', () => {
  const h = harness({ token: staleThen(() => { throw new Error('storage unavailable'); }) });
  const user = collect(h.lp, 'user:7');
  refuseFirst(h);
  assert.equal(h.sockets.length, 1);
  assert.equal(user.sub.state, 'refused');
  assert.deepEqual(h.errors.map((e) => e.reason), ['handler_error', 'refused']);
  assert.match(h.errors[0].detail, /token function.*storage unavailable/);
  h.lp.close();
});

test('a token function that closes the client when asked for a renewed token leaves it closed, with nothing reported', () => {
  const h = harness({ token: staleThen(() => { h.lp.close(); return 'fresh-token'; }) }); // the user signed out
  const user = collect(h.lp, 'user:7');
  refuseFirst(h);
  assert.equal(h.sockets.length, 1);
  assert.equal(h.lp.status, 'closed');
  assert.equal(user.sub.state, 'closed');
  assert.deepEqual(h.errors, []);
  assert.deepEqual(h.clock.pending(), []);
});

test('a transient refusal (unavailable) is retried with backoff, not dropped', () => {
  const h = harness({ random: () => 0.5 });
  const refused = [];
  const s = collect(h.lp, 'chat:a', { since: '4', onRefused: (r) => refused.push(r) });
  const ws = h.last();
  ws.hello();
  ws.receive({ op: 'refused', ref: ws.frames('subscribe')[0].ref, reason: 'unavailable' });
  h.clock.advance(499);
  assert.equal(ws.frames('subscribe').length, 1);
  h.clock.advance(1);
  const again = ws.frames('subscribe');
  assert.equal(again.length, 2);
  assert.equal(again[1].since, '4');
  ws.receive({ op: 'refused', ref: again[1].ref, reason: 'unavailable' });
  h.clock.advance(1000);
  assert.equal(ws.frames('subscribe').length, 3);
  ws.acceptSubscribes();
  assert.equal(s.sub.state, 'active');
  assert.deepEqual(refused, []);
  h.lp.close();
});

test('a subscribe refused unavailable tells onError once a run, so a page can say its updates wait', () => {
  // Retried for as long as the server's storage is down, with nothing said, a page could not tell
  // its user why nothing moves; once a run, not on every retry, and again after it was served.
  const h = harness({ random: () => 0.5 });
  const s = collect(h.lp, 'chat:a~sig', { onRefused: () => {} });
  const ws = h.last();
  ws.hello();
  ws.receive({ op: 'refused', ref: ws.frames('subscribe')[0].ref, reason: 'unavailable' });
  assert.deepEqual(h.errors, [{
    reason: 'unavailable',
    // Not only storage: an authorize() that raised or did not answer in time is refused so too,
    // and a page's developer sent to the database would look in the wrong place.
    detail: "subscribe to chat:a: the server could not serve it just now (it could not read the topic's history or state, or the app's authorize() failed or did not answer in time: the server's log says which): retried with backoff until it can (onSubscribed runs then)",
  }]);
  h.clock.advance(500);
  ws.receive({ op: 'refused', ref: ws.frames('subscribe').at(-1).ref, reason: 'unavailable' });
  assert.equal(h.errors.length, 1, 'said once a run');
  h.clock.advance(1000);
  ws.acceptSubscribes();
  assert.equal(s.sub.state, 'active');
  // Its resubscribe after a reconnect meets another outage: a new run, said again.
  const next = reconnect(h);
  next.receive({ op: 'refused', ref: next.frames('subscribe')[0].ref, reason: 'unavailable' });
  assert.deepEqual(h.errors.map((e) => e.reason), ['unavailable', 'unavailable']);
  assert.equal(s.sub.state, 'pending');
  h.lp.close();
});

test('an onError that unsubscribes the subscription it is told is unavailable leaves no retry timer', () => {
  const box = {};
  const h = harness({ onError: (e) => { if (e.reason === 'unavailable') box.sub.unsubscribe(); } });
  box.sub = h.lp.subscribe('chat:a', () => {});
  const ws = h.last();
  ws.hello();
  const timersWhenIdle = h.clock.pending().length; // the heartbeat's own
  ws.receive({ op: 'refused', ref: ws.frames('subscribe')[0].ref, reason: 'unavailable' });
  assert.equal(box.sub.state, 'closed');
  assert.equal(h.clock.pending().length, timersWhenIdle);
  h.lp.close();
});

test('unsubscribe sends the frame and stops delivery; it is not resent after a reconnect', () => {
  const h = harness();
  const s = collect(h.lp, 'chat:a');
  const other = collect(h.lp, 'chat:b');
  let ws = h.last();
  ws.hello();
  ws.acceptSubscribes();
  ws.receive({ op: 'message', topic: 'chat:a', offset: '1', data: 'one' });
  s.sub.unsubscribe();
  assert.equal(s.sub.state, 'closed');
  assert.deepEqual(ws.frames('unsubscribe'), [{ op: 'unsubscribe', topic: 'chat:a' }]);
  ws.receive({ op: 'message', topic: 'chat:a', offset: '2', data: 'two' });
  assert.deepEqual(s.data(), ['one']);
  s.sub.unsubscribe(); // twice is harmless
  assert.equal(ws.frames('unsubscribe').length, 1);
  ws = reconnect(h);
  assert.deepEqual(ws.frames('subscribe').map((f) => f.topic), ['chat:b']);
  assert.ok(other.sub.state === 'pending');
  h.lp.close();
});

test('two subscriptions on one topic each get their own history; the topic is released with the last', () => {
  const h = harness();
  const first = collect(h.lp, 'chat:a');
  const ws = h.last();
  ws.hello();
  ws.acceptSubscribes();
  ws.receive({ op: 'message', topic: 'chat:a', offset: '1', data: 1 });
  ws.receive({ op: 'message', topic: 'chat:a', offset: '2', data: 2 });
  const second = collect(h.lp, 'chat:a', { since: '1' });
  ws.acceptSubscribes();
  // The catch-up for the second subscription is a duplicate for the first.
  ws.receive({ op: 'message', topic: 'chat:a', offset: '2', data: 2 });
  ws.receive({ op: 'message', topic: 'chat:a', offset: '3', data: 3 });
  assert.deepEqual(first.data(), [1, 2, 3]);
  assert.deepEqual(second.data(), [2, 3]);
  first.sub.unsubscribe();
  assert.equal(ws.frames('unsubscribe').length, 0, 'the second subscription still needs the topic');
  second.sub.unsubscribe();
  assert.deepEqual(ws.frames('unsubscribe'), [{ op: 'unsubscribe', topic: 'chat:a' }]);
  h.lp.close();
});

test('a refused subscription releases its topic once no other subscription of the page needs it', () => {
  const h = harness();
  const ws = h.last();
  ws.hello();
  const old = collect(h.lp, 'job:42~1700000000~sig');
  ws.acceptSubscribes();
  const refuse = (reason) => ws.receive({ op: 'refused', ref: ws.frames('subscribe').at(-1).ref, reason });
  // Refused beside a subscription the server streams the topic for: that one keeps it.
  collect(h.lp, 'job:42~bad-signature', { onRefused: () => {} });
  refuse('invalid_signature');
  assert.equal(ws.frames('unsubscribe').length, 0);
  ws.receive({ op: 'message', topic: 'job:42', offset: '3', data: 'still heard' });
  assert.deepEqual(old.data(), ['still heard']);
  // A component that remounts with the signed topic the page rendered: the new subscription goes
  // out, the old one unsubscribes (not the last then), and the signature has expired meanwhile.
  const remounted = collect(h.lp, 'job:42~1700000000~sig', { onRefused: () => {} });
  old.sub.unsubscribe();
  assert.equal(ws.frames('unsubscribe').length, 0, 'the new subscription may still need the topic');
  refuse('expired');
  assert.equal(remounted.sub.state, 'refused');
  // Without it the server would stream job:42 to this connection, for nobody, until it closes.
  assert.deepEqual(ws.frames('unsubscribe'), [{ op: 'unsubscribe', topic: 'job:42' }]);
  h.lp.close();
});

test('an answer arriving after unsubscribe does not revive the subscription', () => {
  const h = harness();
  const s = collect(h.lp, 'chat:a');
  const ws = h.last();
  ws.hello();
  s.sub.unsubscribe();
  ws.acceptSubscribes();
  ws.receive({ op: 'message', topic: 'chat:a', offset: '1', data: 'late' });
  assert.deepEqual(s.data(), []);
  assert.equal(s.sub.state, 'closed');
  h.lp.close();
});

test('server error frames and throwing handlers are reported and the connection keeps going', () => {
  const h = harness();
  let calls = 0;
  h.lp.subscribe('chat:a', () => {
    calls += 1;
    throw new Error('boom');
  });
  const fine = collect(h.lp, 'chat:a');
  const ws = h.last();
  ws.hello();
  ws.acceptSubscribes();
  ws.receive({ op: 'error', reason: 'bad_frame', detail: 'expected an object' });
  ws.receive('not json');
  ws.receive({ op: 'message', topic: 'chat:a', offset: '1', data: 'x' });
  ws.receive({ op: 'future_op' });
  assert.equal(calls, 1);
  assert.deepEqual(fine.data(), ['x']);
  assert.deepEqual(
    h.errors.map((e) => e.reason),
    ['bad_frame', 'invalid_frame', 'handler_error'],
  );
  assert.equal(h.errors[0].detail, 'expected an object');
  assert.equal(h.lp.status, 'open');
  h.lp.close();
});

test('a handler that throws a value with no string form is reported, and the next handler still gets the message', () => {
  // A value with no toString (an object made with Object.create(null), as some libraries throw)
  // must not turn the report itself into an exception that skips the other subscriptions.
  const h = harness();
  h.lp.subscribe('chat:a', () => {
    throw Object.create(null);
  });
  const fine = collect(h.lp, 'chat:a');
  const ws = h.last();
  ws.hello();
  ws.acceptSubscribes();
  assert.doesNotThrow(() => ws.receive({ op: 'message', topic: 'chat:a', offset: '1', data: 'x' }));
  assert.deepEqual(fine.data(), ['x']);
  assert.deepEqual(h.errors.map((e) => [e.reason, e.detail]), [['handler_error', 'a value with no string form']]);
  assert.equal(h.lp.status, 'open');
  h.lp.close();
});

test('subscribe() rejects a missing topic or handler with a clear error', () => {
  const h = harness();
  assert.throws(() => h.lp.subscribe('', () => {}), /topic/);
  assert.throws(() => h.lp.subscribe('chat:a'), /onMessage/);
  // An offset rendered without quotes: the server could not answer the subscribe it makes.
  assert.throws(() => h.lp.subscribe('chat:a', () => {}, { since: 17 }), /since must be an offset string/);
  // Nor can it answer a since longer than any offset (a page that embedded the wrong value).
  assert.throws(() => h.lp.subscribe('chat:a', () => {}, { since: '1'.repeat(101) }), /since is 101 characters long, not an offset/);
  h.lp.subscribe('chat:a', () => {}, { since: '1'.repeat(100) });
  h.lp.close();
});

test("a since a template printed for a missing offset ('', 'None', 'null') is refused, not sent as one", () => {
  const h = harness();
  for (const since of ['', 'None', 'null', 'undefined', 'NaN']) {
    assert.throws(() => h.lp.subscribe('chat:a', () => {}, { since }), /since is ".*", which is no offset .*or null/);
  }
  h.last().hello();
  assert.deepEqual(h.last().frames('subscribe'), [], 'nothing went out');
  h.lp.close();
});

test('a subscribe made in an open listener goes out once', () => {
  const h = harness();
  collect(h.lp, 'chat:early');
  let late = null;
  h.lp.on('status', (status) => {
    if (status === 'open' && !late) late = collect(h.lp, 'chat:late');
  });
  const ws = h.last();
  ws.hello();
  // Each subscribe frame counts against the server's 100 a second: a copy wastes the budget.
  assert.deepEqual(ws.frames('subscribe').map((f) => f.topic).sort(), ['chat:early', 'chat:late']);
  ws.acceptSubscribes();
  assert.equal(late.sub.state, 'active');
  h.lp.close();
});

test('a subscription from now does not get the replay another subscription of its topic asked for', () => {
  const h = harness();
  const list = collect(h.lp, 'chat:a', { since: '5' }); // the rendered list: catch up after 5
  const badge = collect(h.lp, 'chat:a'); // counts what arrives from now on
  const ws = h.last();
  ws.hello();
  const [first, second] = ws.frames('subscribe');
  assert.deepEqual([first.since, second.since], ['5', null]);
  // The server answers in order: the catch-up of the first, then the second from where the
  // connection stands.
  ws.receive({ op: 'subscribed', ref: first.ref, topic: 'chat:a', offset: '7' });
  ws.receive({ op: 'message', topic: 'chat:a', offset: '6', data: 6 });
  ws.receive({ op: 'message', topic: 'chat:a', offset: '7', data: 7 });
  ws.receive({ op: 'subscribed', ref: second.ref, topic: 'chat:a', offset: '7' });
  ws.receive({ op: 'message', topic: 'chat:a', offset: '8', data: 8 });
  assert.deepEqual(list.data(), [6, 7, 8]);
  assert.deepEqual(badge.data(), [8], 'published before it subscribed: not news to it');
  h.lp.close();
});

test('subscribes go out at the pace the server takes, not all at once', () => {
  const h = harness();
  const subs = [];
  for (let i = 0; i < 60; i++) {
    for (let j = 0; j < 2; j++) subs.push(collect(h.lp, `dash:${i}`).sub); // 120 subscribes on 60 topics
  }
  let ws = h.last();
  ws.hello();
  assert.equal(ws.frames('subscribe').length, SUBSCRIBE_BURST);
  subs[SUBSCRIBE_BURST].unsubscribe(); // still waiting: never sent
  h.clock.advance(1000 / SUBSCRIBES_PER_SECOND);
  assert.equal(ws.frames('subscribe').length, SUBSCRIBE_BURST + 1);
  h.clock.advance(1000);
  const sent = ws.frames('subscribe');
  assert.equal(sent.length, 119);
  assert.ok(!sent.some((f) => f.ref === undefined));
  assert.equal(new Set(sent.map((f) => f.ref)).size, 119);
  ws.acceptSubscribes();
  assert.equal(subs.filter((s) => s.state === 'active').length, 119);

  // A new connection starts with a full burst again, and what waited on the old one is not
  // sent twice.
  for (let i = 0; i < 60; i++) collect(h.lp, `more:${i}`);
  ws = reconnect(h);
  assert.equal(ws.frames('subscribe').length, SUBSCRIBE_BURST);
  h.clock.advance(10_000);
  assert.equal(ws.frames('subscribe').length, 179);
  assert.equal(new Set(ws.frames('subscribe').map((f) => f.ref)).size, 179);
  h.lp.close();
  assert.deepEqual(h.clock.pending(), []);
});

test('a wall clock set back while connected does not hold the next subscribes back', () => {
  const h = harness();
  const ws = h.last();
  ws.hello();
  collect(h.lp, 'chat:a');
  // The system clock is corrected an hour back (a VM resumed, a user fixing the time): Date.now()
  // goes backwards, the timers do not.
  h.clock.t -= 3_600_000;
  collect(h.lp, 'chat:b');
  assert.deepEqual(ws.frames('subscribe').map((f) => f.topic), ['chat:a', 'chat:b']);
  for (let i = 0; i < 100; i++) collect(h.lp, `dash:${i}`);
  h.clock.advance(2_000);
  assert.equal(ws.frames('subscribe').length, 102, 'the rest follow at the usual pace');
  h.lp.close();
});

test('a reset that comes before a subscription has its own answer is not about it', () => {
  const h = harness();
  const resets = [];
  const stale = collect(h.lp, 'chat:a', { since: '1', onReset: () => resets.push('stale') });
  const fresh = collect(h.lp, 'chat:a', { since: '40', onReset: () => resets.push('fresh') });
  const ws = h.last();
  ws.hello();
  const [first, second] = ws.frames('subscribe');
  // The first since is older than the history kept; the second subscribe is not answered yet.
  ws.receive({ op: 'subscribed', ref: first.ref, topic: 'chat:a', offset: '42' });
  ws.receive({ op: 'reset', topic: 'chat:a' });
  assert.deepEqual(resets, ['stale']);
  // Its own answer and catch-up follow: it missed nothing and keeps its place.
  ws.receive({ op: 'subscribed', ref: second.ref, topic: 'chat:a', offset: '42' });
  ws.receive({ op: 'message', topic: 'chat:a', offset: '41', data: 41 });
  ws.receive({ op: 'message', topic: 'chat:a', offset: '42', data: 42 });
  assert.deepEqual(fresh.data(), [41, 42]);
  assert.deepEqual(stale.data(), []);
  h.lp.close();
});

test('a reset naming a subscribe reaches that subscription alone; the one beside it goes on, every message once', () => {
  const h = harness();
  const resets = [];
  const list = collect(h.lp, 'chat:a', { onReset: () => resets.push('list') });
  const ws = h.last();
  ws.hello();
  ws.receive({ op: 'subscribed', ref: ws.frames('subscribe')[0].ref, topic: 'chat:a', offset: '1767225600000000-5' });
  ws.receive({ op: 'message', topic: 'chat:a', offset: '1767225600000000-6', data: 6 });
  // A second subscription of the page, with an offset cached from an earlier epoch of the topic:
  // its own answer, then its own reset; the connection's stream goes on where it stood.
  const badge = collect(h.lp, 'chat:a', { since: '1-1', onReset: () => resets.push('badge') });
  const second = ws.frames('subscribe')[1];
  ws.receive({ op: 'subscribed', ref: second.ref, topic: 'chat:a', offset: '1767225600000000-9' });
  ws.receive({ op: 'reset', topic: 'chat:a', ref: second.ref });
  assert.deepEqual(resets, ['badge']);
  for (const n of [7, 8, 9, 10]) ws.receive({ op: 'message', topic: 'chat:a', offset: `1767225600000000-${n}`, data: n });
  assert.deepEqual(list.data(), [6, 7, 8, 9, 10]);
  assert.deepEqual(badge.data(), [10]);
  // A reset that names no subscribe is the topic's stream's: every subscription hears it.
  ws.receive({ op: 'reset', topic: 'chat:a' });
  assert.deepEqual(resets, ['badge', 'list', 'badge']);
  assert.deepEqual(h.errors, []);
  h.lp.close();
});

test('a reset naming a subscribe the page dropped since, or one this connection never sent, reaches nobody', () => {
  const h = harness();
  const resets = [];
  collect(h.lp, 'chat:a', { since: '1767225600000000-4', onReset: () => resets.push('stays') });
  const leaving = collect(h.lp, 'chat:a', { since: '1-1', onReset: () => resets.push('leaving') });
  let ws = h.last();
  ws.hello();
  const [first, second] = ws.frames('subscribe');
  ws.receive({ op: 'subscribed', ref: first.ref, topic: 'chat:a', offset: '1767225600000000-5' });
  ws.receive({ op: 'subscribed', ref: second.ref, topic: 'chat:a', offset: '1767225600000000-5' });
  leaving.sub.unsubscribe(); // while its reset was on its way
  ws.receive({ op: 'reset', topic: 'chat:a', ref: second.ref });
  ws.receive({ op: 'reset', topic: 'chat:a', ref: 'never-sent' });
  assert.deepEqual(resets, []);
  // The refs of a connection that is gone name nothing on the next one.
  ws = reconnect(h);
  ws.acceptSubscribes();
  ws.receive({ op: 'reset', topic: 'chat:a', ref: first.ref });
  assert.deepEqual(resets, []);
  assert.deepEqual(h.errors, [], 'a reset that is about no subscription of the page is no missed message');
  h.lp.close();
});

test('a reset naming the subscribe of a topic other than its own reaches nobody', () => {
  const h = harness();
  const resets = [];
  collect(h.lp, 'chat:a', { since: '1-1', onReset: (t) => resets.push(t) });
  collect(h.lp, 'chat:b', { onReset: (t) => resets.push(t) });
  const ws = h.last();
  ws.hello();
  ws.acceptSubscribes();
  ws.receive({ op: 'reset', topic: 'chat:b', ref: ws.frames('subscribe')[0].ref });
  assert.deepEqual(resets, []);
  ws.receive({ op: 'reset', topic: 'chat:a', ref: ws.frames('subscribe')[0].ref });
  assert.deepEqual(resets, ['chat:a']);
  h.lp.close();
});

/** What a subscription of a state topic delivered, as [event, offset] pairs. */
const versions = (c) => c.got.map(([data, offset]) => [data.event, offset]);

test('a state topic whose current version is below the offset held shows its snapshot and every version after it', () => {
  // The server sends the current state whenever `since` is not its version (docs/protocol.md). A
  // `since` above that version (kept from a database since restored or recreated, or an offset
  // that is no version of this state at all) says nothing about this state: the snapshot and
  // the versions that follow are news to the page, not duplicates.
  const h = harness();
  const restored = collect(h.lp, 'job:7', { since: '9' });
  const foreign = collect(h.lp, 'group:3', { since: '1767225600000000-17' });
  const gone = collect(h.lp, 'workflow:5', { since: '4' });
  const ws = h.last();
  ws.hello();
  const refs = Object.fromEntries(ws.frames('subscribe').map((f) => [f.topic, f.ref]));
  ws.receive({ op: 'subscribed', ref: refs['job:7'], topic: 'job:7', offset: '2' });
  ws.receive({ op: 'message', topic: 'job:7', offset: '2', data: { event: 'snapshot' } });
  ws.receive({ op: 'subscribed', ref: refs['group:3'], topic: 'group:3', offset: '6' });
  ws.receive({ op: 'message', topic: 'group:3', offset: '6', data: { event: 'snapshot' } });
  // No such run in this database (yet): the one created under that id starts at version 1.
  ws.receive({ op: 'subscribed', ref: refs['workflow:5'], topic: 'workflow:5', offset: null });
  for (const [topic, offset, event] of [['job:7', '3', 'started'], ['job:7', '3', 'started'], ['job:7', '4', 'succeeded'],
    ['group:3', '7', 'finished'], ['workflow:5', '1', 'started']]) {
    ws.receive({ op: 'message', topic, offset, data: { event } });
  }
  assert.deepEqual(versions(restored), [['snapshot', '2'], ['started', '3'], ['succeeded', '4']]);
  assert.deepEqual(versions(foreign), [['snapshot', '6'], ['finished', '7']]);
  assert.deepEqual(versions(gone), [['started', '1']]);
  assert.equal(restored.sub.offset, '4', 'a reconnect resumes from the version delivered');
  h.lp.close();
});

test('a state topic resumed at or below its current version still drops what it has seen', () => {
  const h = harness();
  const first = collect(h.lp, 'job:7', { since: '3' });
  h.last().hello();
  const ws = h.last();
  ws.receive({ op: 'subscribed', ref: ws.frames('subscribe')[0].ref, topic: 'job:7', offset: '5' });
  ws.receive({ op: 'message', topic: 'job:7', offset: '5', data: { event: 'snapshot' } });
  // A second subscription of the topic: its snapshot is the version the first one has.
  const second = collect(h.lp, 'job:7');
  const again = ws.frames('subscribe').at(-1).ref;
  ws.receive({ op: 'subscribed', ref: again, topic: 'job:7', offset: '5' });
  ws.receive({ op: 'message', topic: 'job:7', offset: '5', data: { event: 'snapshot' } });
  ws.receive({ op: 'message', topic: 'job:7', offset: '4', data: { event: 'stale' } });
  ws.receive({ op: 'message', topic: 'job:7', offset: '6', data: { event: 'succeeded' } });
  assert.deepEqual(versions(first), [['snapshot', '5'], ['succeeded', '6']]);
  assert.deepEqual(versions(second), [['snapshot', '5'], ['succeeded', '6']]);
  h.lp.close();
});

test('a subscription with since gets every message after it, even when live ones reach the topic before its answer', () => {
  // The page follows chat:a already (up to 10) and mounts a view rendered at offset 5. Until the
  // server takes the new subscribe, the topic's live messages keep coming for the first one;
  // then the server answers the new one and replays 6 onwards. Taken as news while pending,
  // live message 11 would move the new subscription past the replay: 6 to 10 would be dropped
  // as duplicates it never had.
  const h = harness();
  const live = collect(h.lp, 'chat:a', { since: '9' });
  const ws = h.last();
  ws.hello();
  const [first] = ws.frames('subscribe');
  ws.receive({ op: 'subscribed', ref: first.ref, topic: 'chat:a', offset: '10' });
  ws.receive({ op: 'message', topic: 'chat:a', offset: '10', data: 10 });
  const view = collect(h.lp, 'chat:a', { since: '5' });
  const second = ws.frames('subscribe').at(-1);
  assert.equal(second.since, '5');
  ws.receive({ op: 'message', topic: 'chat:a', offset: '11', data: 11 }); // live, for the first
  ws.receive({ op: 'subscribed', ref: second.ref, topic: 'chat:a', offset: '11' });
  for (let n = 6; n <= 12; n++) ws.receive({ op: 'message', topic: 'chat:a', offset: String(n), data: n });
  assert.deepEqual(view.data(), [6, 7, 8, 9, 10, 11, 12]);
  assert.deepEqual(live.data(), [10, 11, 12]);
  h.lp.close();
});

test('close() inside a callback ends delivery at once, for every subscription', () => {
  const h = harness();
  const closer = h.lp.subscribe('chat:a', () => h.lp.close());
  const sibling = collect(h.lp, 'chat:a');
  const elsewhere = collect(h.lp, 'chat:b');
  const ws = h.last();
  ws.hello();
  ws.acceptSubscribes();
  ws.receive({ op: 'message', topic: 'chat:a', offset: '1', data: 'after close' });
  assert.equal(h.lp.status, 'closed');
  assert.deepEqual(sibling.data(), [], 'a callback ran after close()');
  for (const sub of [closer, sibling.sub, elsewhere.sub]) assert.equal(sub.state, 'closed');
  assert.deepEqual(h.clock.pending(), []);
});

test('unsubscribing while a transient refusal waits for its retry leaves no timer behind', () => {
  const h = harness();
  const subs = [];
  const ws = h.last();
  ws.hello();
  const timersWhenIdle = h.clock.pending().length; // the heartbeat's own
  // A page that churns its subscriptions while the server's storage is down.
  for (let i = 0; i < 50; i++) {
    const s = collect(h.lp, `chat:${i}`);
    ws.receive({ op: 'refused', ref: ws.frames('subscribe').at(-1).ref, reason: 'unavailable' });
    s.sub.unsubscribe();
    subs.push(s);
  }
  assert.equal(h.clock.pending().length, timersWhenIdle);
  h.lp.close();
});

test('subscribe() refuses a topic longer than any the server takes, which would break every connection', () => {
  const h = harness();
  // Past 64 KiB the server closes the connection with 1009 instead of answering; resent after
  // every reconnect, such a frame would take the page's other subscriptions down with it.
  assert.throws(() => h.lp.subscribe('x'.repeat(70_000), () => {}), /topic is 70000 characters long/);
  assert.throws(() => h.lp.subscribe(`job:1~${'s'.repeat(400)}`, () => {}), TypeError);
  const fine = h.lp.subscribe(`job:1~${'s'.repeat(394)}`, () => {}); // 400: the longest signed topic
  h.last().hello();
  assert.equal(h.last().frames('subscribe').length, 1);
  assert.equal(fine.state, 'pending');
  h.lp.close();
});

test('a callback option that is not a function is refused when it is passed, not when it would run', () => {
  const h = harness();
  // The usual slip: the callback's result passed in its place (a Promise from an async call).
  const refetch = async () => {};
  for (const name of ['onReset', 'onSubscribed', 'onRefused']) {
    assert.throws(() => h.lp.subscribe('chat:a', () => {}, { [name]: refetch() }), {
      name: 'TypeError',
      message: `subscribe() options.${name} must be a function, not object: pass the function itself, not what calling it returns`,
    });
  }
  h.last().hello();
  assert.deepEqual(h.last().frames('subscribe'), [], 'nothing was subscribed');
  h.lp.close();
  assert.throws(() => harness({ reconnectAfterMs: 1000 }), {
    name: 'TypeError',
    message: /^LivePush options\.reconnectAfterMs must be a function, not number: .*\(tries\) => 1000/,
  });
  assert.throws(() => harness({ onError: 'console' }), {
    name: 'TypeError',
    message: /^LivePush options\.onError must be a function, not string/,
  });
});

test('a status listener that is not a function is refused when it is added, not at every status change', () => {
  const h = harness();
  const showStatus = () => {};
  assert.throws(() => h.lp.on('status', showStatus()), {
    name: 'TypeError',
    message: /^lp\.on\('status', fn\): fn must be a function, not undefined: pass the function itself/,
  });
  h.last().hello();
  h.last().serverClose(1006);
  assert.deepEqual(h.errors, [], 'no handler_error at each change');
  h.lp.close();
});

test('null options mean none, and options that are no object are refused at the call', async () => {
  const { LivePush, bindProgress } = await import('../livepush.js');
  const { FakeElement } = await import('../testing/fakes.mjs');
  const h = harness();
  const ws = h.last();
  ws.hello();
  const got = [];
  h.lp.subscribe('news', (data) => got.push(data), null);
  ws.acceptSubscribes();
  ws.receive({ op: 'message', topic: 'news', offset: '1', data: 'hi' });
  assert.deepEqual(got, ['hi']);
  bindProgress(h.lp, 'job:1', new FakeElement('div'), null);
  assert.throws(() => h.lp.subscribe('other', () => {}, () => {}),
    /subscribe\(topic, onMessage, options\) takes its options as an object, got function/);
  assert.throws(() => bindProgress(h.lp, 'job:2', new FakeElement('div'), 'x'),
    /bindProgress\(lp, topic, element, options\) takes its options as an object, got string/);
  assert.throws(() => new LivePush('ws://push.test/', 5), /new LivePush\(url, options\) takes its options as an object, got number/);
  h.lp.close();
});

test('an option the call does not read throws, naming it, instead of being ignored', async () => {
  const { LivePush, bindProgress } = await import('../livepush.js');
  const { FakeElement } = await import('../testing/fakes.mjs');
  const h = harness();
  // `offset` for `since` would subscribe from now: what was published since the page rendered
  // would be lost, with nothing said.
  assert.throws(() => h.lp.subscribe('chat:lobby', () => {}, { offset: '17' }), {
    name: 'TypeError',
    message: /subscribe\(topic, onMessage, options\) has no option "offset" \(did you mean "since"\?\): its options are since, onReset, onSubscribed, onRefused/,
  });
  assert.throws(() => h.lp.subscribe('chat:lobby', () => {}, { onreset: () => {} }), /has no option "onreset" \(did you mean "onReset"\?\)/);
  const element = new FakeElement('div');
  assert.throws(() => bindProgress(h.lp, 'job:1', element, { onFinished: () => {} }),
    /bindProgress\(lp, topic, element, options\) has no option "onFinished" \(did you mean "onFinish"\?\)/);
  assert.deepEqual(element.children, [], 'the element is left as it was');
  assert.throws(() => new LivePush('ws://push.test/', { WebSocket: h.sockets[0].constructor, onerror: () => {} }),
    /new LivePush\(url, options\) has no option "onerror" \(did you mean "onError"\?\)/);
  h.last().hello();
  assert.deepEqual(h.last().frames('subscribe'), [], 'nothing subscribed');
  // An option set to undefined (spread from a config that lacks it) is still an option read.
  h.lp.subscribe('chat:lobby', () => {}, { since: undefined, onReset: undefined });
  assert.equal(h.last().frames('subscribe').length, 1);
  h.lp.close();
});
