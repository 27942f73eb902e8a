// What a TypeScript page writes against livepush.d.ts; types.test.mjs type-checks it.
import { LivePush, bindProgress, CloseCode, Status, type Subscription } from '../../livepush.js';

const lp = new LivePush('wss://push.example.com/', {
  token: () => sessionStorage.getItem('push-token'),
  onError: (err) => console.warn(err.reason, err.detail),
  // The injectable parts take what the platform has: the browser's own WebSocket class.
  WebSocket,
  document,
  window,
});

lp.on('status', (status, info) => {
  if (status === Status.UNAUTHORIZED && info.code === CloseCode.REVOKED) location.href = '/login';
});

const sub: Subscription = lp.subscribe<{ text: string }>('chat:lobby', (data, { offset }) => {
  console.log(data.text, offset);
}, { since: null, onReset: () => location.reload(), onRefused: (reason, { topic }) => console.warn(topic, reason) });
sub.unsubscribe();

const element = document.getElementById('import');
if (element) bindProgress(lp, 'job:42~signature', element, { onFinish: (view) => console.log(view.state) }).unsubscribe();
// Options may be null, meaning none, wherever a call takes them (the README says so).
const quiet = new LivePush('/push', null);
quiet.subscribe('chat:lobby', () => {}, null).unsubscribe();
if (element) bindProgress(quiet, 'job:42~signature', element, null).unsubscribe();
// A callback left out as null is absent, as the client takes it (e.g. `onRefused: debug ? log : null`).
const debug = sessionStorage.getItem('debug') === '1';
const log = debug ? (...args: unknown[]) => console.log(...args) : null;
const plain = new LivePush('/push', { onError: log, reconnectAfterMs: null });
plain.subscribe('chat:lobby', () => {}, { onReset: log, onSubscribed: log, onRefused: log }).unsubscribe();
if (element) bindProgress(plain, 'job:42~signature', element, { onFinish: log, onUpdate: log }).unsubscribe();
plain.close();
quiet.close();
lp.close();
