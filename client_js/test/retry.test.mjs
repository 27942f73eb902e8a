import assert from 'node:assert/strict';
import test from 'node:test';

import { GOING_AWAY_MAX_MS, GOING_AWAY_MIN_MS, RETRY_MAX_MS, retryDelayFromReason } from '../livepush.js';
import { harness } from '../testing/fakes.mjs';

const MID = () => 0.5; // jitter factor 1.0: backoff delays are exact; the 1001 range gives 1750 ms

/** Delays announced with each `reconnecting` status. */
const delays = (h) => h.statuses.filter((s) => s.status === 'reconnecting').map((s) => s.delayMs);

test('retry=MS parses to MS, capped at RETRY_MAX_MS; anything else is null', () => {
  assert.equal(retryDelayFromReason('retry=1500'), 1500);
  assert.equal(retryDelayFromReason('retry=0'), 0);
  assert.equal(retryDelayFromReason('retry=0250'), 250);
  assert.equal(RETRY_MAX_MS, 5 * 60 * 1000);
  assert.equal(retryDelayFromReason('retry=300001'), RETRY_MAX_MS);
  assert.equal(retryDelayFromReason(`retry=${'9'.repeat(40)}`), RETRY_MAX_MS);
  for (const bad of ['', 'retry=', 'retry=soon', 'retry=-5', 'retry=1.5', 'retry=1e3', ' retry=5', 'retry=5 ',
    'Retry=5', 'retry=5;x', 'going away', null, undefined]) {
    assert.equal(retryDelayFromReason(bad), null, `reason ${JSON.stringify(bad)}`);
  }
});

test('close 1001 with retry=MS waits exactly MS, then resumes every subscription from its offset', () => {
  const h = harness({ random: MID });
  const got = [];
  h.lp.subscribe('chat:a', (data, meta) => got.push(meta.offset));
  h.last().hello();
  h.last().acceptSubscribes();
  h.last().receive({ op: 'message', topic: 'chat:a', offset: '7', data: 'x' });
  h.clock.advance(60_000);
  h.last().serverClose(1001, 'retry=4321');
  assert.deepEqual(h.statuses.at(-1), { status: 'reconnecting', code: 1001, reason: 'retry=4321', delayMs: 4321, tries: 1 });
  assert.deepEqual(h.clock.pending(), [4321]);
  h.clock.advance(4320);
  assert.equal(h.sockets.length, 1, 'reconnected before the delay the server asked for');
  h.clock.advance(1);
  assert.equal(h.sockets.length, 2);
  h.last().hello();
  assert.deepEqual(h.last().frames('subscribe').map(({ topic, since }) => ({ topic, since })), [{ topic: 'chat:a', since: '7' }]);
  assert.deepEqual(got, ['7']);
  h.lp.close();
});

test('a retry delay past the cap waits RETRY_MAX_MS', () => {
  const h = harness({ random: MID });
  h.last().hello();
  h.last().serverClose(1001, 'retry=86400000');
  assert.equal(delays(h).at(-1), RETRY_MAX_MS);
  h.lp.close();
});

test('a malformed retry reason falls back to the usual jittered 1001 delay', () => {
  for (const reason of ['retry=soon', 'retry=-1', 'retry=', 'retry=1.5']) {
    const h = harness({ random: MID });
    h.last().hello();
    h.last().serverClose(1001, reason);
    const d = delays(h).at(-1);
    assert.equal(d, GOING_AWAY_MIN_MS + (GOING_AWAY_MAX_MS - GOING_AWAY_MIN_MS) / 2, `reason ${reason}`);
    h.lp.close();
  }
});

test('retry=MS counts only with 1001: another close keeps its own backoff', () => {
  const h = harness({ random: MID });
  h.last().hello();
  h.last().serverClose(1000, 'retry=9000');
  assert.equal(delays(h).at(-1), 500);
  h.clock.advance(500);
  h.last().serverClose(1008, 'retry=9000');
  assert.equal(delays(h).at(-1), 1000);
  h.lp.close();
});

test('a server that keeps sending the client away with retry=MS: the growing backoff takes over when longer', () => {
  const h = harness({ random: MID });
  for (let i = 0; i < 6; i++) {
    h.last().serverClose(1001, 'retry=3000');
    h.clock.advance(h.clock.pending()[0]);
  }
  assert.deepEqual(delays(h), [3000, 3000, 3000, 4000, 8000, 16000]);
  h.lp.close();
});

test('the page becoming visible again still cuts a long server-given wait short', () => {
  const h = harness({ random: MID });
  h.last().hello();
  h.last().serverClose(1001, 'retry=60000');
  assert.equal(delays(h).at(-1), 60_000);
  h.document.dispatch('visibilitychange');
  h.clock.advance(1_000);
  assert.equal(h.sockets.length, 2);
  h.lp.close();
});
