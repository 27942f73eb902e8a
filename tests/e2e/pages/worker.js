// A module worker holding a LivePush connection, as a page that shares one socket between its
// tabs would. A worker has no window and no document. Query: ?ws=http://127.0.0.1:PORT&url=URL
// (URL as given to LivePush). It posts {status, delayMs} and {error} messages to the page, and
// on the message 'online' fires the `online` event a worker's global scope gets from the browser.

const params = new URLSearchParams(location.search);
const mod = await import(`${params.get('ws')}/livepush.js`);
const lp = new mod.LivePush(params.get('url'), { onError: (err) => postMessage({ error: String(err.reason) }) });
lp.on('status', (status, info) => postMessage({ status, delayMs: info.delayMs ?? null }));
self.onmessage = (ev) => {
  if (ev.data === 'online') self.dispatchEvent(new Event('online'));
};
