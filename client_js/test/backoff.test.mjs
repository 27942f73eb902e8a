import assert from 'node:assert/strict';
import test from 'node:test';

import {
  BACKOFF_BASE_MS,
  BACKOFF_CAP_MS,
  compareOffsets,
  defaultReconnectAfterMs,
} from '../livepush.js';
import { harness, seededRandom } from '../testing/fakes.mjs';

function draws(tries, n, random) {
  return Array.from({ length: n }, () => defaultReconnectAfterMs(tries, random));
}

test('each delay stays within 50–150 % of the backoff and spreads across that range', () => {
  const random = seededRandom(1);
  for (const tries of [1, 2, 3, 5, 8]) {
    const backoff = Math.min(BACKOFF_CAP_MS, BACKOFF_BASE_MS * 2 ** (tries - 1));
    const ds = draws(tries, 2000, random);
    const min = Math.min(...ds);
    const max = Math.max(...ds);
    assert.ok(min >= 0.5 * backoff, `tries=${tries}: min ${min} below 50 % of ${backoff}`);
    assert.ok(max < 1.5 * backoff, `tries=${tries}: max ${max} at or above 150 % of ${backoff}`);
    // Spread: the draws reach close to both ends and are not a handful of repeated values.
    assert.ok(min < 0.55 * backoff, `tries=${tries}: min ${min} never got near 50 %`);
    assert.ok(max > 1.45 * backoff, `tries=${tries}: max ${max} never got near 150 %`);
    assert.ok(new Set(ds).size > 1900, `tries=${tries}: too few distinct delays`);
    const mean = ds.reduce((a, b) => a + b, 0) / ds.length;
    assert.ok(Math.abs(mean - backoff) < 0.05 * backoff, `tries=${tries}: mean ${mean} is not near ${backoff}`);
  }
});

test('the backoff doubles from 500 ms and is capped at 30 s', () => {
  const mid = () => 0.5; // factor 1.0: the delay equals the backoff
  assert.deepEqual(
    [1, 2, 3, 4, 5, 6, 7, 8].map((t) => defaultReconnectAfterMs(t, mid)),
    [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000],
  );
  for (const tries of [7, 10, 50, 1000, 1e9]) {
    assert.equal(defaultReconnectAfterMs(tries, () => 0), 15000);
    assert.ok(defaultReconnectAfterMs(tries, () => 0.999999) < 45000);
  }
});

test('a herd of clients that lose the connection at once comes back spread out', () => {
  // 200 pages, each with its own randomness, see the same abnormal close at the same instant.
  const delays = [];
  for (let i = 0; i < 200; i++) {
    const h = harness({ random: seededRandom(1000 + i) });
    h.last().hello();
    h.last().serverClose(1006);
    delays.push(h.statuses.at(-1).delayMs);
    h.lp.close();
  }
  const min = Math.min(...delays);
  const max = Math.max(...delays);
  assert.ok(min >= 250 && max < 750, `delays ${min}..${max} outside 50–150 % of 500 ms`);
  assert.ok(max - min > 400, `spread ${max - min} ms is too narrow`);
});

test('offsets compare as tuples of integers, exactly, even past 2^53', () => {
  assert.ok(compareOffsets('9', '10') < 0);
  assert.ok(compareOffsets('10', '9') > 0);
  assert.equal(compareOffsets('17', '17'), 0);
  assert.equal(compareOffsets('007', '7'), 0);
  assert.ok(compareOffsets('1700000000000-3', '1700000000000-10') < 0);
  assert.ok(compareOffsets('1700000000001-0', '1700000000000-99') > 0);
  assert.ok(compareOffsets('1.2', '1.10') < 0);
  assert.ok(compareOffsets('5', '5-1') < 0);
  assert.ok(compareOffsets('90071992547409931', '90071992547409930') > 0);
});
