// A module worker holding a LivePush connection, as a page that shares one socket between its
// tabs would. A worker has no window and no document. Query: ?ws=http://127.0.0.1:PORT&url=URL
// (URL as given to LivePush); it posts {status} and {error} messages to the page.

const params = new URLSearchParams(location.search);
const mod = await import(`${params.get('ws')}/livepush.js`);
const lp = new mod.LivePush(params.get('url'), { onError: (err) => postMessage({ error: String(err.reason) }) });
lp.on('status', (status) => postMessage({ status }));
