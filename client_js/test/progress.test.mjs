import assert from 'node:assert/strict';
import test from 'node:test';

import { bindProgress, describeProgress } from '../livepush.js';
import { FakeElement, harness } from '../testing/fakes.mjs';

function setup(topic, options) {
  const h = harness();
  const el = new FakeElement('div');
  const finished = [];
  const handle = bindProgress(h.lp, topic, el, { onFinish: (view) => finished.push(view.state), ...options });
  const ws = h.last();
  ws.hello();
  ws.acceptSubscribes();
  const [bar, label] = el.children;
  let off = 0;
  const send = (data) => ws.receive({ op: 'message', topic: topic.split('~')[0], offset: String(++off), data });
  return { h, el, bar, label, finished, handle, ws, send };
}

const job = (event, state, progress, extra = {}) => ({
  event,
  job: { id: 42, name: 'import_row', queue: 'default', state, attempt: 1, max_attempts: 5, progress, error: null, run_at: null, ...extra },
});

test('bindProgress renders a job: bar, done/total, state and the last message', () => {
  const t = setup('job:42~sig');
  assert.equal(t.bar.tagName, 'PROGRESS');
  assert.equal(t.h.last().frames('subscribe')[0].topic, 'job:42~sig');

  t.send(job('snapshot', 'available', null));
  assert.equal(t.bar.getAttribute('value'), null, 'indeterminate before any progress');
  assert.equal(t.label.textContent, 'available');
  assert.equal(t.el.getAttribute('data-state'), 'available');

  t.send(job('progress', 'running', { done: 3, total: 10, message: 'parsing <b>rows</b>' }));
  assert.equal(t.bar.getAttribute('max'), '10');
  assert.equal(t.bar.getAttribute('value'), '3');
  assert.equal(t.label.textContent, '3/10 · running · parsing <b>rows</b>'); // as text, not markup
  assert.deepEqual(t.finished, []);

  t.send(job('succeeded', 'succeeded', { done: 10, total: 10, message: 'done' }));
  assert.equal(t.bar.getAttribute('value'), '10');
  assert.equal(t.label.textContent, '10/10 · succeeded · done');
  assert.deepEqual(t.finished, ['succeeded']);
  t.h.lp.close();
});

test('a failed job shows its error; a job without progress still fills the bar when it succeeds', () => {
  const t = setup('job:7');
  t.send(job('retrying', 'scheduled', { done: 1, total: 4, message: 'x' }, { error: { type: 'KeyError', message: "'id'" } }));
  assert.equal(t.label.textContent, "1/4 · scheduled · KeyError: 'id'");
  assert.deepEqual(t.finished, []);
  t.send(job('failed', 'failed', { done: 1, total: 4, message: 'x' }, { error: 'gave up' }));
  assert.equal(t.label.textContent, '1/4 · failed · gave up');
  assert.deepEqual(t.finished, ['failed']);
  t.h.lp.close();

  const u = setup('job:8');
  u.send(job('succeeded', 'succeeded', null));
  assert.equal(u.bar.getAttribute('max'), '1');
  assert.equal(u.bar.getAttribute('value'), '1');
  assert.equal(u.label.textContent, 'succeeded');
  u.h.lp.close();
});

test('a page that loads or reconnects while a job waits for its retry shows the error, as the retrying event did', () => {
  // The snapshot names no `retrying` event: a scheduled (or due, available) job with an error and
  // an attempt behind it is the same retry wait, and its error is what the page needs to see.
  const error = { type: 'KeyError', message: "'id'" };
  for (const state of ['scheduled', 'available']) {
    const t = setup('job:9');
    t.send(job('snapshot', state, null, { attempt: 1, error }));
    assert.equal(t.label.textContent, `${state} · KeyError: 'id'`);
    t.h.lp.close();
  }
  // Retried by hand (retry_failed), a job starts over from attempt 0: the old error is not its own.
  const u = setup('job:10');
  u.send(job('snapshot', 'available', null, { attempt: 0, error: 'gave up' }));
  assert.equal(u.label.textContent, 'available');
  u.h.lp.close();
});

test('bindProgress renders a group: done counts succeeded, failed and cancelled members', () => {
  const t = setup('group:9');
  const group = (event, state, counts) => ({ event, group: { id: 9, state, total: 200, pending: 0, succeeded: 0, failed: 0, cancelled: 0, ...counts } });
  t.send(group('snapshot', 'sealed', { pending: 200 }));
  assert.equal(t.label.textContent, '0/200 · sealed');
  assert.equal(t.bar.getAttribute('value'), '0');
  t.send(group('progress', 'sealed', { pending: 150, succeeded: 45, failed: 3, cancelled: 2 }));
  assert.equal(t.bar.getAttribute('max'), '200');
  assert.equal(t.bar.getAttribute('value'), '50');
  assert.equal(t.label.textContent, '50/200 · sealed · 3 failed, 2 cancelled');
  t.send(group('finished', 'finished', { succeeded: 195, failed: 3, cancelled: 2 }));
  assert.equal(t.label.textContent, '200/200 · finished · 3 failed, 2 cancelled');
  assert.equal(t.el.getAttribute('data-state'), 'finished');
  assert.deepEqual(t.finished, ['finished']);
  // Duplicates (same offset) do not fire onFinish again.
  t.ws.receive({ op: 'message', topic: 'group:9', offset: '3', data: group('finished', 'finished', { succeeded: 200 }) });
  assert.deepEqual(t.finished, ['finished']);
  t.h.lp.close();
});

test('a cancelled group finishes once nothing is pending: onFinish waits for its last members', () => {
  // cancel_group() shows state "cancelled" at once, while running members go on (they may even
  // succeed); the group finishes, and runs its callbacks, only once none is pending.
  const t = setup('group:9');
  const group = (event, counts) => ({ event, group: { id: 9, state: 'cancelled', total: 2, pending: 0, succeeded: 0, failed: 0, cancelled: 0, ...counts } });
  t.send({ event: 'snapshot', group: { id: 9, state: 'sealed', total: 2, pending: 2, succeeded: 0, failed: 0, cancelled: 0 } });
  t.send(group('cancelled', { pending: 2 }));
  assert.equal(t.label.textContent, '0/2 · cancelled');
  assert.deepEqual(t.finished, [], 'two members still run');
  t.send(group('progress', { pending: 1, succeeded: 1 }));
  assert.deepEqual(t.finished, []);
  t.send(group('finished', { succeeded: 2 }));
  assert.equal(t.label.textContent, '2/2 · cancelled');
  assert.deepEqual(t.finished, ['cancelled']);
  assert.equal(describeProgress(group('snapshot', { cancelled: 2 })).finished, true, 'a finished cancelled group');
  t.h.lp.close();
});

test('bindProgress re-subscribes after a reset to get a fresh snapshot, and unsubscribe ends it', () => {
  const t = setup('group:9');
  t.send({ event: 'snapshot', group: { id: 9, state: 'sealed', total: 10, pending: 10, succeeded: 0, failed: 0, cancelled: 0 } });
  t.ws.receive({ op: 'reset', topic: 'group:9' });
  assert.deepEqual(t.ws.frames('unsubscribe'), [{ op: 'unsubscribe', topic: 'group:9' }]);
  const again = t.ws.frames('subscribe').at(-1);
  assert.equal(again.since, null);
  assert.equal(t.ws.frames('subscribe').length, 2);
  t.ws.acceptSubscribes();
  t.ws.receive({ op: 'message', topic: 'group:9', offset: '90', data: { event: 'snapshot', group: { id: 9, state: 'sealed', total: 10, pending: 4, succeeded: 6, failed: 0, cancelled: 0 } } });
  assert.equal(t.label.textContent, '6/10 · sealed');
  assert.equal(t.handle.offset, '90');
  t.handle.unsubscribe();
  assert.equal(t.ws.frames('unsubscribe').length, 2);
  t.ws.receive({ op: 'message', topic: 'group:9', offset: '91', data: { event: 'finished', group: { id: 9, state: 'finished', total: 10, pending: 0, succeeded: 10, failed: 0, cancelled: 0 } } });
  assert.equal(t.label.textContent, '6/10 · sealed');
  t.h.lp.close();
});

test('a refused progress topic says so in the text line', () => {
  const h = harness();
  const el = new FakeElement('div');
  bindProgress(h.lp, 'job:1~bad', el);
  h.last().hello();
  h.last().receive({ op: 'refused', ref: h.last().frames('subscribe')[0].ref, reason: 'invalid_signature' });
  assert.equal(el.children[1].textContent, 'not allowed: invalid_signature');
  assert.equal(el.getAttribute('data-state'), 'refused');
  h.lp.close();
});

test('a finished job stays shown when its signed topic expired by the time a reconnect resubscribes', () => {
  // A page left open past the signed topic's TTL (a day by default) meets a deploy: the resubscribe
  // is refused `expired`, which says nothing about a job that had already ended.
  const t = setup('job:42~1767225600~sig');
  t.send(job('snapshot', 'running', { done: 9, total: 10, message: 'rows' }));
  t.send(job('succeeded', 'succeeded', { done: 10, total: 10, message: 'done' }));
  assert.deepEqual(t.finished, ['succeeded']);
  t.ws.serverClose(1001);
  t.h.clock.advance(t.h.clock.pending()[0]);
  const ws = t.h.last();
  ws.hello();
  ws.receive({ op: 'refused', ref: ws.frames('subscribe')[0].ref, reason: 'expired' });
  assert.equal(t.el.children[1].textContent, '10/10 · succeeded · done');
  assert.equal(t.el.getAttribute('data-state'), 'succeeded');
  assert.equal(t.bar.getAttribute('value'), '10');
  assert.deepEqual(t.finished, ['succeeded']);
  assert.deepEqual(t.h.errors, []);
  t.h.lp.close();

  // A job that had not ended says it is no longer followed.
  const u = setup('job:43~1767225600~sig');
  u.send(job('snapshot', 'running', { done: 3, total: 10, message: 'rows' }));
  u.ws.serverClose(1001);
  u.h.clock.advance(u.h.clock.pending()[0]);
  u.h.last().hello();
  u.h.last().receive({ op: 'refused', ref: u.h.last().frames('subscribe')[0].ref, reason: 'expired' });
  assert.equal(u.el.children[1].textContent, 'not allowed: expired');
  assert.equal(u.el.getAttribute('data-state'), 'refused');
  u.h.lp.close();
});

test('a final state the server rendered stays shown when a resubscribe is refused expired', () => {
  // The page rendered the finished job at version 7 (data-state for its CSS, as bindProgress sets
  // it) and nothing newer came; a day later a deploy's resubscribe is refused `expired`, which
  // says nothing about a job that had already ended.
  const render = (state, topic) => {
    const h = harness();
    const el = new FakeElement('div');
    const rendered = new FakeElement('span');
    rendered.textContent = state;
    el.appendChild(rendered);
    el.setAttribute('data-state', state);
    bindProgress(h.lp, topic, el, { since: '7' });
    h.last().hello();
    h.last().acceptSubscribes();
    h.last().serverClose(1001);
    h.clock.advance(h.clock.pending()[0]);
    h.last().hello();
    h.last().receive({ op: 'refused', ref: h.last().frames('subscribe')[0].ref, reason: 'expired' });
    return { h, el, rendered };
  };
  for (const [state, topic] of [['succeeded', 'job:42~1767225600~sig'], ['failed', 'job:43~1767225600~sig'], ['finished', 'group:9~1767225600~sig']]) {
    const t = render(state, topic);
    assert.deepEqual(t.el.children, [t.rendered], `${state}: the server's rendering stays`);
    assert.equal(t.el.getAttribute('data-state'), state);
    assert.deepEqual(t.h.errors, []);
    t.h.lp.close();
  }
  // One still running says it is no longer followed, as one bindProgress rendered does.
  const u = render('running', 'job:44~1767225600~sig');
  assert.equal(u.el.children[1].textContent, 'not allowed: expired');
  assert.equal(u.el.getAttribute('data-state'), 'refused');
  u.h.lp.close();
});

test('describeProgress ignores data that is neither a job nor a group event', () => {
  assert.equal(describeProgress({ text: 'hi' }).kind, 'unknown');
  assert.equal(describeProgress(null).kind, 'unknown');
});

test('an onUpdate that throws does not keep onFinish from running', () => {
  const t = setup('job:42', {
    onUpdate: () => {
      throw new Error('bug in the page');
    },
  });
  t.send(job('progress', 'running', { done: 9, total: 10, message: null }));
  t.send(job('succeeded', 'succeeded', { done: 10, total: 10, message: null }));
  assert.deepEqual(t.finished, ['succeeded']);
  assert.equal(t.label.textContent, '10/10 · succeeded');
  assert.deepEqual(t.h.errors.map((e) => e.reason), ['handler_error', 'handler_error']);
  t.h.lp.close();
});

test('bindProgress without an element to render into says so, and subscribes to nothing', () => {
  const h = harness();
  // What document.getElementById() gives for an id the page does not have.
  assert.throws(() => bindProgress(h.lp, 'job:42', null), {
    name: 'TypeError',
    message: /bindProgress\(\) needs the element to render into, got null/,
  });
  assert.throws(() => bindProgress(undefined, 'job:42', new FakeElement('div')), {
    name: 'TypeError',
    message: /bindProgress\(\) needs the LivePush to subscribe with, got undefined/,
  });
  h.last().hello();
  assert.deepEqual(h.last().frames('subscribe'), []);
  h.lp.close();
});

test('bindProgress given a <progress> (or another element that shows no children) says to pass a container', () => {
  // Its bar and text would go inside, where a browser shows nothing: the page's own bar would stay
  // indeterminate for good, with no error anywhere.
  const h = harness();
  for (const tag of ['progress', 'meter', 'input']) {
    const el = new FakeElement(tag);
    assert.throws(() => bindProgress(h.lp, 'job:42', el), {
      name: 'TypeError',
      message: new RegExp(`bindProgress\\(\\) renders its own <progress> bar and text line inside the element: pass a container such as a <div>, not a <${tag}>`),
    });
    assert.deepEqual(el.children, [], 'the element is left as it was');
  }
  h.last().hello();
  assert.deepEqual(h.last().frames('subscribe'), []);
  h.lp.close();
});

test('bindProgress refuses an onFinish or onUpdate that is not a function, before it renders or subscribes', () => {
  const h = harness();
  const element = new FakeElement('div');
  const refresh = async () => {};
  for (const name of ['onFinish', 'onUpdate']) {
    assert.throws(() => bindProgress(h.lp, 'job:42', element, { [name]: refresh() }), {
      name: 'TypeError',
      message: `bindProgress() options.${name} must be a function, not object: pass the function itself, not what calling it returns`,
    });
  }
  assert.deepEqual(element.children, [], 'the element is left as it was');
  h.last().hello();
  assert.deepEqual(h.last().frames('subscribe'), []);
  h.lp.close();
});

test('binding an element again ends its earlier binding: one element shows one progress', () => {
  const h = harness();
  const el = new FakeElement('div');
  const finished = [];
  const first = bindProgress(h.lp, 'job:1', el, { onFinish: (view) => finished.push(['job:1', view.state]) });
  const ws = h.last();
  ws.hello();
  ws.acceptSubscribes();
  ws.receive({ op: 'message', topic: 'job:1', offset: '1', data: job('snapshot', 'running', null, { id: 1 }) });
  assert.equal(el.getAttribute('data-state'), 'running');

  // A page that starts another job shows it in the same place.
  bindProgress(h.lp, 'job:2', el, { onFinish: (view) => finished.push(['job:2', view.state]) });
  assert.deepEqual(ws.frames('unsubscribe'), [{ op: 'unsubscribe', topic: 'job:1' }]);
  ws.acceptSubscribes();
  ws.receive({ op: 'message', topic: 'job:2', offset: '1', data: job('snapshot', 'available', null, { id: 2 }) });
  ws.receive({ op: 'message', topic: 'job:1', offset: '2', data: job('failed', 'failed', null, { id: 1 }) });
  assert.equal(el.getAttribute('data-state'), 'available', 'the earlier job no longer writes into the element');
  assert.equal(el.children[1].textContent, 'available');
  assert.deepEqual(finished, []);
  first.unsubscribe(); // ended already: nothing more to do, and the new binding stays
  ws.receive({ op: 'message', topic: 'job:2', offset: '2', data: job('succeeded', 'succeeded', null, { id: 2 }) });
  assert.deepEqual(finished, [['job:2', 'succeeded']]);
  assert.equal(ws.frames('unsubscribe').length, 1);
  h.lp.close();
});

test('a binding ended from its own onUpdate runs no onFinish for that message', () => {
  // The page moves on as soon as it sees the last update: it binds the element to the next job,
  // or unsubscribes. The ended binding's onFinish must not run after that, for that same message.
  for (const end of ['rebind', 'unsubscribe']) {
    const h = harness();
    const el = new FakeElement('div');
    const finished = [];
    const first = bindProgress(h.lp, 'job:1', el, {
      onUpdate: (view) => {
        if (view.state !== 'succeeded') return;
        if (end === 'rebind') bindProgress(h.lp, 'job:2', el, { onFinish: (v) => finished.push(['job:2', v.state]) });
        else first.unsubscribe();
      },
      onFinish: (view) => finished.push(['job:1', view.state]),
    });
    const ws = h.last();
    ws.hello();
    ws.acceptSubscribes();
    ws.receive({ op: 'message', topic: 'job:1', offset: '1', data: job('succeeded', 'succeeded', null, { id: 1 }) });
    assert.deepEqual(finished, [], `${end}: the ended binding's onFinish does not run`);
    h.lp.close();
  }
});

test('bindProgress with since keeps what the page shows until a newer version comes', () => {
  const h = harness();
  const el = new FakeElement('div');
  const rendered = new FakeElement('span');
  el.appendChild(rendered); // the server rendered the finished job at version 7
  const finished = [];
  bindProgress(h.lp, 'job:42', el, { since: '7', onFinish: (view) => finished.push(view.state) });
  const ws = h.last();
  ws.hello();
  ws.acceptSubscribes();
  assert.equal(ws.frames('subscribe')[0].since, '7');
  assert.deepEqual(el.children, [rendered], 'nothing newer yet: the rendered version stays');
  ws.receive({ op: 'message', topic: 'job:42', offset: '8', data: job('retrying', 'scheduled', null, { error: 'x' }) });
  const [bar, label] = el.children;
  assert.equal(bar.tagName, 'PROGRESS');
  assert.equal(label.textContent, 'scheduled · x');
  h.lp.close();
});

test('bindProgress on a topic that is no job or group throws at the call, before the element or the server hears of it', () => {
  const h = harness();
  const element = new FakeElement('div');
  const earlier = bindProgress(h.lp, 'job:1', element);
  const shown = [...element.children];
  // A workflow is a graph of steps, and a message topic carries no progress: either would leave
  // an empty bar for good, with nothing said anywhere.
  assert.throws(() => bindProgress(h.lp, 'workflow:7~sig', element), {
    name: 'TypeError',
    message: /bindProgress\(\) shows a job:<id> or group:<id> topic, not workflow:7: a workflow is a graph of steps/,
  });
  assert.throws(() => bindProgress(h.lp, 'chat:lobby', element), {
    name: 'TypeError',
    message: /bindProgress\(\) shows a job:<id> or group:<id> topic, not chat:lobby/,
  });
  for (const topic of [undefined, '', 42]) {
    assert.throws(() => bindProgress(h.lp, topic, element), { name: 'TypeError', message: /bindProgress\(\) needs the topic/ });
  }
  assert.deepEqual(element.children, shown, 'the element still shows the earlier binding');
  const ws = h.last();
  ws.hello();
  assert.deepEqual(ws.frames('subscribe').map((f) => f.topic), ['job:1'], 'nothing else subscribed');
  assert.equal(earlier.offset, null);
  ws.acceptSubscribes();
  ws.receive({ op: 'message', topic: 'job:1', offset: '1', data: job('snapshot', 'running', null, { id: 1 }) });
  assert.equal(element.getAttribute('data-state'), 'running', 'and goes on showing it');
  h.lp.close();
});

test('bindProgress on a closed client throws before it touches the element or the earlier binding', () => {
  // A page that binds after close() (signed out, or `unauthorized`) gets the error, and the
  // element still shows what it showed: its bar is not cleared for a binding that never came.
  const h = harness();
  const el = new FakeElement('div');
  bindProgress(h.lp, 'job:1', el);
  const ws = h.last();
  ws.hello();
  ws.acceptSubscribes();
  ws.receive({ op: 'message', topic: 'job:1', offset: '1', data: job('succeeded', 'succeeded', null, { id: 1 }) });
  const shown = [...el.children];
  h.lp.close();
  assert.throws(() => bindProgress(h.lp, 'job:2', el), { message: /this LivePush is closed/ });
  assert.deepEqual(el.children, shown, 'the element still shows the finished job');
  assert.equal(el.children[1].textContent, 'succeeded');
  assert.equal(el.getAttribute('data-state'), 'succeeded');
});
