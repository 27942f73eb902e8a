// livepush browser client: one ES module, no dependencies, no build step.
//
// The server serves this exact file at /livepush.js, so it imports nothing. It is laid out in
// sections, one concern each, in the order they depend on one another:
//
//   1. constants      timings, close codes, statuses
//   2. offsets        ordering of the server's opaque offsets (duplicate detection)
//   3. backoff        reconnect delays with jitter
//   4. timers         a one-shot timer and the heartbeat watchdog, on injectable clocks
//   5. subscriptions  Subscription objects and the registry that routes frames to them
//   6. socket         LivePush: the connection, its state machine and the wire protocol
//   7. progress       bindProgress(): a <progress> bar for job:<id> and group:<id> topics
//
// The wire protocol is docs/reference.md#5-wire-protocol; the reconnect guarantee is #7-guarantees.

// ---------------------------------------------------------------------------------------------
// 1. Constants
// ---------------------------------------------------------------------------------------------

/** Backoff before the first retry; doubles per failed try. */
export const BACKOFF_BASE_MS = 500;
/** The backoff never grows past this (the jittered delay is at most 150 % of it). */
export const BACKOFF_CAP_MS = 30_000;
/** Each delay is drawn uniformly from [JITTER_MIN, JITTER_MAX) times the backoff. */
export const JITTER_MIN = 0.5;
export const JITTER_MAX = 1.5;
/**
 * A connection that received `hello` and then stayed up this long counts as stable: when it
 * drops, the backoff starts again from the base instead of continuing to grow.
 */
export const STABLE_AFTER_MS = 5_000;
/**
 * After close 1001 (server going away, i.e. a restart or deploy) or 1012 (service restart, which
 * proxies send when they restart) the client waits a delay drawn uniformly from this range.
 * Never zero: thousands of pages lose their socket in the same instant, and a 2.5 s spread
 * keeps them from hammering the new server in one burst.
 */
export const GOING_AWAY_MIN_MS = 500;
export const GOING_AWAY_MAX_MS = 3_000;
/**
 * A draining server (`livepush serve --drain-seconds`) closes with 1001 and the reason `retry=MS`:
 * the client waits MS before its next attempt, the server having spread those delays over its
 * fleet of pages. At most this long, so no server or proxy can park a page for longer.
 */
export const RETRY_MAX_MS = 300_000;
/**
 * When the page becomes visible again or the network comes back while the client is waiting
 * to reconnect, it retries after a delay drawn from this range (small, but not zero, because
 * `online` fires on every page of a machine at once).
 */
export const WAKE_MIN_MS = 50;
export const WAKE_MAX_MS = 1_000;
/** Without `hello` this long after opening a socket, the attempt is abandoned and retried. */
export const CONNECT_TIMEOUT_MS = 10_000;
/** The subprotocol the server selects; a token travels beside it as `livepush.token.<token>`. */
export const SUBPROTOCOL = 'livepush';
const TOKEN_SUBPROTOCOL = 'livepush.token.';
/** What a subprotocol can carry: an HTTP token (RFC 7230, section 3.2.6). */
const SUBPROTOCOL_CHARS = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
/**
 * How long a ping may go unanswered on top of the heartbeat before the connection is declared
 * dead; also all a waking page gives the server to answer the ping it sends at once (while no
 * subscribe awaits its answer or its replay).
 */
export const HEARTBEAT_GRACE_MS = 2_000;
/**
 * The longest a server may send nothing while it serves a subscribe's replay (or reads on from
 * history for a client behind) whose history read Postgres or Redis fails, before it gives up
 * with `reset`: 20 s of retries counted from the start of the first failing read, and its last
 * read's half second (docs/protocol.md#connecting). The pong of a ping sent meanwhile waits
 * behind it, so while a subscribe is awaited a ping gets this and the grace, whatever the heartbeat.
 */
export const REPLAY_SILENCE_MS = 21_000;
/**
 * The server takes at most 100 subscribes a second per connection, in bursts of 100, and refuses
 * the rest with `limit`, which drops them for good (docs/reference.md#8-trust-boundaries-and-abuse).
 * A page may hold more subscriptions than that (two listeners on a topic are two subscribes),
 * and sends them all at once on every (re)connect, so the client paces its own: a burst of
 * SUBSCRIBE_BURST, then SUBSCRIBES_PER_SECOND. Both stay below the server's, so frames the
 * network delivers bunched together still fit.
 */
export const SUBSCRIBE_BURST = 90;
export const SUBSCRIBES_PER_SECOND = 50;

/** Close codes the client treats specially (docs/reference.md#5-wire-protocol). */
export const CloseCode = Object.freeze({
  NORMAL: 1000,
  GOING_AWAY: 1001,
  ABNORMAL: 1006,
  POLICY: 1008,
  TOO_BIG: 1009,
  SERVICE_RESTART: 1012,
  TRY_AGAIN_LATER: 1013,
  UNAUTHORIZED: 4401,
  REVOKED: 4403,
});

/** Codes after which retrying is pointless: the session is missing, expired or revoked. */
const FATAL_CODES = new Set(/** @type {number[]} */ ([CloseCode.UNAUTHORIZED, CloseCode.REVOKED]));
/**
 * Codes that say this client misbehaved or is overloaded; the backoff keeps growing even if
 * the connection had been up for a while, so a client that trips the limit again and again
 * does not reconnect at the base rate forever.
 */
const PENALTY_CODES = new Set(
  /** @type {number[]} */ ([CloseCode.POLICY, CloseCode.TOO_BIG, CloseCode.TRY_AGAIN_LATER]),
);

/** @typedef {'connecting' | 'open' | 'reconnecting' | 'closed' | 'unauthorized'} LivePushStatus */

/**
 * @type {Readonly<{CONNECTING: 'connecting', OPEN: 'open', RECONNECTING: 'reconnecting',
 *   CLOSED: 'closed', UNAUTHORIZED: 'unauthorized'}>}
 */
export const Status = Object.freeze({
  CONNECTING: 'connecting',
  OPEN: 'open',
  RECONNECTING: 'reconnecting',
  CLOSED: 'closed',
  UNAUTHORIZED: 'unauthorized',
});

/**
 * Refusal reasons that describe the server's state, not the topic (its database was briefly
 * unreachable): the subscribe is retried with backoff instead of being dropped.
 */
const TRANSIENT_REFUSALS = new Set(['unavailable']);

/**
 * What a page can do about a refusal: said to onError when the subscription has no onRefused,
 * since the server logs client mistakes at debug level only, and a refusal nobody hears leaves
 * a page that shows nothing with no clue why.
 * @type {Readonly<Record<string, string>>}
 */
const REFUSAL_HINTS = Object.freeze({
  forbidden: 'no rule on the server allows it for this session: add one, or subscribe to a signed topic (sign_topic)',
  invalid_signature: "the signature does not match: pass the signed topic as sign_topic() made it, with the server's LIVEPUSH_SECRET",
  expired: 'the signed topic ran out of time: render a fresh one (the page reloads with one)',
  invalid_topic: 'not a topic: 1 to 200 of [A-Za-z0-9_.:/-]; job:, group: and workflow: take a plain decimal id and a server with a database',
  limit: 'the connection holds as many subscriptions as the server takes: unsubscribe from what the page no longer shows',
});

/** The longest `since` the server reads (docs/protocol.md); offsets are far shorter. */
const MAX_OFFSET_LENGTH = 100;
/** What a template prints for a value it did not have: no server gives these as offsets. */
const NOT_OFFSETS = new Set(['', 'None', 'null', 'undefined', 'NaN']);
/** The longest topic the server takes: a signed one (a plain topic is at most 200 characters). */
const MAX_TOPIC_LENGTH = 400;

/**
 * The longest delay a timer holds: browsers and Node run one set any longer at once, so a
 * `reconnectAfterMs` meaning "wait for ever" would retry in a tight loop.
 */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** The schemes a WebSocket URL may have (http and https are turned into ws and wss). */
const SOCKET_SCHEMES = new Set(['ws:', 'wss:', 'http:', 'https:']);

/**
 * Throw a TypeError unless `url` is a path or has a scheme a WebSocket takes. `localhost:8765`
 * reads as the scheme `localhost:`: every attempt would fail the same way, retried for as long
 * as the page is open, so it is said at the call. Only the scheme is quoted: a URL may carry a
 * token in its query.
 * @param {string} url
 */
function checkUrlScheme(url) {
  const scheme = /^([A-Za-z][A-Za-z0-9+.-]*:)/.exec(url)?.[1].toLowerCase();
  if (scheme === undefined || SOCKET_SCHEMES.has(scheme)) return;
  const hostPort = /^[A-Za-z0-9.-]+:\d+(?:[/?]|$)/.test(url);
  throw new TypeError(`LivePush needs a ws://, wss://, http:// or https:// URL, or a path: this one starts with the scheme "${scheme}", which no WebSocket takes`
    + (hostPort ? ` (for a host and port, write ws://${url.split(/[?#]/)[0]})` : ''));
}

/**
 * Throw a TypeError unless `token` is a string, a function or absent. Anything else (a Promise,
 * from `token: getToken()` with an async getToken) could never be sent: every attempt would fail
 * the same way, reported as connect_failed for as long as the page is open, so it is said at the
 * call. Only its kind is named: it may be a token.
 * @param {unknown} token
 */
function checkToken(token) {
  if (token === undefined || token === null || typeof token === 'string' || typeof token === 'function') return;
  const kind = typeof (/** @type {any} */ (token)).then === 'function' ? 'a Promise'
    : typeof token === 'object' ? 'an object' : `a ${typeof token}`;
  throw new TypeError(`LivePush options.token is ${kind}: pass the token string, or a function that returns it`
    + (kind === 'a Promise' ? ' (await the token before creating the LivePush, or keep the latest one at hand for the function to return)' : ''));
}

/** WebSocket.OPEN; spelled out so a fake WebSocket class need not define it. */
const WS_OPEN = 1;

// ---------------------------------------------------------------------------------------------
// 2. Offsets
// ---------------------------------------------------------------------------------------------

/**
 * Compare two offsets of the same topic. Offsets are opaque strings that increase per topic;
 * today they are "17" (Postgres, local) or "1700000000000-3" (Redis), so they are compared as
 * tuples of integers separated by "." or "-". Digits are compared as strings (length first),
 * so values past 2^53 stay exact.
 *
 * @param {string} a
 * @param {string} b
 * @returns {number} negative when a < b, 0 when equal, positive when a > b
 */
export function compareOffsets(a, b) {
  const pa = String(a).split(/[.-]/);
  const pb = String(b).split(/[.-]/);
  const n = Math.max(pa.length, pb.length);
  for (let i = 0; i < n; i++) {
    if (i >= pa.length) return -1;
    if (i >= pb.length) return 1;
    const c = comparePart(pa[i], pb[i]);
    if (c !== 0) return c;
  }
  return 0;
}

/**
 * @param {string} x
 * @param {string} y
 * @returns {number}
 */
function comparePart(x, y) {
  if (/^\d+$/.test(x) && /^\d+$/.test(y)) {
    const sx = x.replace(/^0+(?=\d)/, '');
    const sy = y.replace(/^0+(?=\d)/, '');
    if (sx.length !== sy.length) return sx.length - sy.length;
    return sx < sy ? -1 : sx > sy ? 1 : 0;
  }
  // Not a number: still give a total order rather than guessing.
  return x < y ? -1 : x > y ? 1 : 0;
}

// ---------------------------------------------------------------------------------------------
// 3. Backoff
// ---------------------------------------------------------------------------------------------

/**
 * The default reconnect schedule: an exponential backoff (base 500 ms, doubling, capped at
 * 30 s) and a delay drawn uniformly from 50–150 % of it. Jitter is what spreads thousands of
 * pages that lost their socket at the same instant.
 *
 * @param {number} tries consecutive failed attempts, 1 for the first retry
 * @param {() => number} [random] uniform in [0, 1), Math.random by default
 * @returns {number} milliseconds to wait
 */
export function defaultReconnectAfterMs(tries, random = Math.random) {
  const exponent = Math.max(0, Math.min(tries - 1, 30)); // 2^30 is far past the cap: no overflow
  const backoff = Math.min(BACKOFF_CAP_MS, BACKOFF_BASE_MS * 2 ** exponent);
  return backoff * (JITTER_MIN + (JITTER_MAX - JITTER_MIN) * random());
}

/**
 * The reconnect delay a close reason asks for: `retry=MS`, MS a whole number of milliseconds,
 * capped at RETRY_MAX_MS. Anything else (another reason, `retry=soon`, `retry=-5`) is `null`,
 * and the client's own delay applies.
 *
 * @param {string} reason the close frame's reason
 * @returns {number | null} milliseconds to wait, or null
 */
export function retryDelayFromReason(reason) {
  const match = /^retry=(\d+)$/.exec(String(reason ?? ''));
  return match ? Math.min(Number(match[1]), RETRY_MAX_MS) : null;
}

/**
 * @param {number} min
 * @param {number} max
 * @param {() => number} random
 * @returns {number}
 */
function uniform(min, max, random) {
  return min + (max - min) * random();
}

// ---------------------------------------------------------------------------------------------
// 4. Timers
// ---------------------------------------------------------------------------------------------

/**
 * @typedef {object} Clock
 * @property {() => number} now milliseconds, monotonic enough for intervals
 * @property {(fn: () => void, ms: number) => unknown} setTimeout
 * @property {(handle: any) => void} clearTimeout
 */

/** A restartable one-shot timer; scheduling again replaces the pending run. */
class Timer {
  /**
   * @param {Clock} clock
   * @param {() => void} fn
   */
  constructor(clock, fn) {
    this._clock = clock;
    this._fn = fn;
    /** @type {unknown} */
    this._handle = null;
    /** @type {number | null} when the pending run is due, on clock.now() */
    this.dueAt = null;
  }

  /** @param {number} ms */
  schedule(ms) {
    this.cancel();
    this.dueAt = this._clock.now() + ms;
    this._handle = this._clock.setTimeout(() => {
      this._handle = null;
      this.dueAt = null;
      this._fn();
    }, ms);
  }

  cancel() {
    if (this._handle !== null) this._clock.clearTimeout(this._handle);
    this._handle = null;
    this.dueAt = null;
  }

  get pending() {
    return this._handle !== null;
  }
}

/**
 * Keeps a connection honest once `hello` told the heartbeat: sends a ping every `heartbeat`
 * seconds and declares the connection dead when nothing at all arrived for heartbeat +
 * HEARTBEAT_GRACE_MS after a ping went out. A TCP connection cut by a sleeping laptop or a NAT
 * timeout never fires `close`, so this is the only way such a connection gets replaced.
 *
 * Silence is measured from the ping the client actually sent, not from the last frame: a browser
 * holds a hidden tab's timers back and runs them late, all together, so its ping goes out long
 * after the last answer, and a check of the time since the last frame, running beside it,
 * would find a silence the page caused itself and drop a live connection again and again.
 *
 * The server answers a connection's frames in order, so a ping sent while it still decides the
 * client's subscribes (an `authorize` may take seconds each), or sends a replay after their
 * `subscribed` (one waiting out a store restart sends nothing for up to REPLAY_SILENCE_MS), is
 * answered only after them: while any is awaited (`hooks.busy`), a ping gets the whole heartbeat,
 * or REPLAY_SILENCE_MS when that is longer, and the grace, never the grace alone.
 */
class Heartbeat {
  /**
   * @param {Clock} clock
   * @param {{ping: () => void, onDead: () => void, busy: () => boolean}} hooks
   */
  constructor(clock, hooks) {
    this._clock = clock;
    this._hooks = hooks;
    this._intervalMs = 0;
    /** when the pending ping is due, on clock.now() */
    this._pingDueAt = 0;
    this._pingTimer = new Timer(clock, () => {
      // A ping more than a heartbeat behind its time: the page slept or was frozen, and the
      // socket may have died meanwhile, so the answer gets only the grace. (A hidden tab's late
      // ping is answered long before its held-back timers run again.)
      const late = this._clock.now() - this._pingDueAt > this._intervalMs;
      this.probe(late ? HEARTBEAT_GRACE_MS : this._intervalMs + HEARTBEAT_GRACE_MS);
      this._schedulePing();
    });
    // Armed while a ping is unanswered; anything arriving disarms it.
    this._deadTimer = new Timer(clock, () => {
      this.stop();
      this._hooks.onDead();
    });
  }

  /** @param {number} seconds the server's `hello.heartbeat`; 0 or less turns checks off */
  start(seconds) {
    this.stop();
    if (!(seconds > 0)) return;
    this._intervalMs = seconds * 1000;
    this._schedulePing();
  }

  _schedulePing() {
    this._pingDueAt = this._clock.now() + this._intervalMs;
    this._pingTimer.schedule(this._intervalMs);
  }

  /** Something arrived from the server: every ping sent so far is answered. */
  touch() {
    this._deadTimer.cancel();
  }

  /**
   * Ping now; the connection is dead unless something arrives within `answerMs` (or the
   * earlier bound of a ping still unanswered). Also used when the page wakes up, as a laptop
   * that slept has a dead socket that never reported `close`.
   * @param {number} answerMs
   */
  probe(answerMs) {
    if (!this._intervalMs) return;
    // Subscribes still awaited: the answer queues behind them, and each answer to them counts.
    // A replay may be silent for REPLAY_SILENCE_MS, longer than a short heartbeat.
    if (this._hooks.busy()) {
      answerMs = Math.max(answerMs, Math.max(this._intervalMs, REPLAY_SILENCE_MS) + HEARTBEAT_GRACE_MS);
    }
    this._hooks.ping();
    const now = this._clock.now();
    const dueAt = this._deadTimer.dueAt;
    // A bound past due that has not run: the machine slept, and its timer resumes with what it
    // had left, while this ping's answer is all that matters now.
    if (dueAt === null || now + answerMs < dueAt || dueAt <= now) this._deadTimer.schedule(answerMs);
  }

  stop() {
    this._pingTimer.cancel();
    this._deadTimer.cancel();
    this._intervalMs = 0;
  }
}

// ---------------------------------------------------------------------------------------------
// 5. Subscriptions
// ---------------------------------------------------------------------------------------------

/**
 * @typedef {object} MessageMeta
 * @property {string} topic the plain topic
 * @property {string | null} offset
 */

/**
 * @typedef {object} SubscribeOptions
 * @property {string | null} [since] the last offset the page already reflects, e.g.
 *   `livepush.latest_offset(topic)` embedded by the server when it rendered the page
 * @property {((topic: string) => void) | null} [onReset] `since` was older than the history the server
 *   keeps (or the page fell behind): refetch the state. The next resubscribe starts where the
 *   live messages after the reset began, so none is lost. A reset that answers this subscription's
 *   own subscribe runs its onReset alone, not that of another subscription of the topic.
 * @property {((info: {topic: string, offset: string | null}) => void) | null} [onSubscribed]
 *   called after every (re)subscribe the server accepted
 * @property {((reason: string, info: {topic: string}) => void) | null} [onRefused] the server refused
 *   the topic ("forbidden", "invalid_signature", "expired", "invalid_topic", "limit"; `info.topic`
 *   is the plain topic, as in every callback: the subscription's `topic` is the one given); the
 *   subscription is dropped and never resent. ("unavailable", the server's storage being
 *   briefly down, or the app's authorize() failing or not answering in time, is not a refusal:
 *   the subscribe is retried with backoff, and onError hears it once a run.)
 */

/** What SubscribeOptions holds. */
const SUBSCRIBE_OPTIONS = Object.freeze(['since', 'onReset', 'onSubscribed', 'onRefused']);

/** @typedef {'pending' | 'active' | 'refused' | 'closed'} SubscriptionState */

/**
 * Throw a TypeError naming `what` unless `value` is a function or absent (undefined or null).
 * @param {string} what
 * @param {unknown} value
 * @param {string} hint what to pass instead
 */
function checkCallback(what, value, hint) {
  if (value !== undefined && value !== null && typeof value !== 'function') {
    throw new TypeError(`${what} must be a function, not ${typeof value}: ${hint}`);
  }
}

/**
 * An argument's kind for an error message, never its contents (a string may be a signed topic).
 * @param {unknown} value
 * @returns {string}
 */
function describeArg(value) {
  return value === null || value === undefined ? String(value) : typeof value;
}

/**
 * A value a page's callback threw or returned, as text for an error's detail. String() itself
 * throws on a value with no string form (an object made by Object.create(null), or whose toString
 * throws): a report that threw would skip the other handlers of a frame, or the next attempt.
 * @param {unknown} value
 * @returns {string}
 */
function describeValue(value) {
  try {
    return String(value);
  } catch {
    return 'a value with no string form';
  }
}

/** Names a page gives the offset it rendered at, for the option that takes it. */
const OFFSET_NAMES = new Set(['offset', 'from', 'after', 'lastoffset', 'last_offset', 'latest_offset', 'latestoffset']);

/**
 * A call's options: an object, or null or nothing for none. Anything else (a callback passed
 * where the options go) is said at the call, not as a property of null read later; so is a name
 * the call does not read: ignored, a misspelt `since` would subscribe from now and lose what was
 * published since the page rendered, with nothing said.
 * @template T
 * @param {T | null | undefined} options
 * @param {string} call
 * @param {readonly string[]} known the option names the call reads
 * @returns {NonNullable<T>}
 */
function optionsOf(options, call, known) {
  if (options === null || options === undefined) return /** @type {NonNullable<T>} */ ({});
  if (typeof options !== 'object') {
    throw new TypeError(`${call} takes its options as an object, got ${describeArg(options)}: e.g. {since: offset}`);
  }
  for (const name of Object.keys(options)) {
    if (known.includes(name)) continue;
    const guess = guessOption(name, known);
    throw new TypeError(`${call} has no option ${JSON.stringify(name.slice(0, 40))}${guess ? ` (did you mean ${JSON.stringify(guess)}?)` : ''}: its options are ${known.join(', ')}`);
  }
  return options;
}

/**
 * The known option a misspelt `name` most likely meant: the same but for case, one that it
 * starts with or that starts with it (onFinished, onSubscribe), or `since` for an offset's name.
 * @param {string} name
 * @param {readonly string[]} known
 * @returns {string | undefined}
 */
function guessOption(name, known) {
  const lower = name.toLowerCase();
  return known.find((n) => n.toLowerCase() === lower)
    ?? (lower.length >= 4 ? known.find((n) => lower.startsWith(n.toLowerCase()) || n.toLowerCase().startsWith(lower)) : undefined)
    ?? (OFFSET_NAMES.has(lower) && known.includes('since') ? 'since' : undefined);
}

/** The plain topic of a possibly signed one: `~` never appears in a plain topic. */
function plainTopicOf(/** @type {string} */ topic) {
  const i = topic.indexOf('~');
  return i < 0 ? topic : topic.slice(0, i);
}

/** Topics whose frames are states (snapshots and versions), not a stream of messages. */
const STATE_PREFIXES = ['job:', 'group:', 'workflow:'];

/** @param {string} plainTopic */
function isStateTopic(plainTopic) {
  return STATE_PREFIXES.some((prefix) => plainTopic.startsWith(prefix));
}

/** One call to `subscribe()`. Its offset and duplicate filter are its own. */
export class Subscription {
  /**
   * @param {LivePush} client
   * @param {string} topic
   * @param {(data: any, meta: MessageMeta) => void} onMessage
   * @param {SubscribeOptions} options
   */
  constructor(client, topic, onMessage, options) {
    this._client = client;
    /** The topic as given: plain or signed. Resubscribes send exactly this. */
    this.topic = topic;
    /** The plain topic the server uses in its frames. */
    this.plainTopic = plainTopicOf(topic);
    this._onMessage = onMessage;
    this._options = options;
    for (const name of /** @type {const} */ (['onReset', 'onSubscribed', 'onRefused'])) {
      // Called only when the server answers, and then reported as a bare "is not a function":
      // said here, at the line that passed the callback's result in its place.
      checkCallback(`subscribe() options.${name}`, options[name], 'pass the function itself, not what calling it returns');
    }
    /** @type {string | null} */
    this._offset = options.since ?? null;
    if (this._offset !== null && typeof this._offset !== 'string') {
      // A number (an offset rendered without quotes) would go on the wire as one, which the
      // server refuses without naming the subscribe: it would stay pending for ever.
      throw new TypeError(`subscribe() options.since must be an offset string (as latest_offset() gave it) or null, not ${typeof this._offset} ${String(this._offset)}`);
    }
    if (this._offset !== null && NOT_OFFSETS.has(this._offset)) {
      // `since: '{{ offset }}'` with no offset at hand: the server would take it for one it no
      // longer holds and answer `reset`, and the page would refetch on every load.
      throw new TypeError(`subscribe() options.since is ${JSON.stringify(this._offset)}, which is no offset (a template's empty or None value?): pass the offset latest_offset() gave, or null (or leave since out) to start from the next message`);
    }
    if (this._offset !== null && this._offset.length > MAX_OFFSET_LENGTH) {
      // The server refuses such a frame the same way (no offset is that long): pending for
      // ever, and resent as a bad frame on every reconnect.
      throw new TypeError(`subscribe() options.since is ${this._offset.length} characters long, not an offset (at most ${MAX_OFFSET_LENGTH}): ${this._offset.slice(0, 40)}…`);
    }
    /** @type {SubscriptionState} */
    this._state = 'pending';
    /** transient refusals in a row, for the retry backoff */
    this._retries = 0;
    /** @type {Timer | null} the retry after a transient refusal, while it waits */
    this._retryTimer = null;
    /**
     * On a message topic, where the server's last `subscribed` said this subscription stood,
     * until a message moves it on: what live messages follow a `reset` that came before any.
     * @type {string | null}
     */
    this._standing = null;
  }

  /** The last offset delivered (or the `since` it started from, or where `subscribed` said a
   * subscription from now stands on a message topic); null when none yet. */
  get offset() {
    return this._offset;
  }

  /** @returns {SubscriptionState} */
  get state() {
    return this._state;
  }

  /** Stop delivery; the server is told once no other subscription needs the topic. */
  unsubscribe() {
    if (this._state === 'closed' || this._state === 'refused') return;
    this._state = 'closed';
    this._client._unsubscribe(this);
  }

  /** @param {{topic: string, offset?: string | null, data: any}} frame */
  _deliver(frame) {
    if (this._state === 'closed' || this._state === 'refused') return;
    // Nothing before this subscription's own `subscribed` is about it: it is another
    // subscription's catch-up or live stream on the same topic (the server answers in order), or
    // was sent before the server took this subscribe. A subscription from now starts where its
    // `subscribed` says; one with an offset gets everything after it in the replay that follows
    // `subscribed`, which a live message taken now, past that offset, would make it drop as
    // duplicates it never had.
    if (this._state === 'pending') return;
    const offset = frame.offset ?? null;
    if (offset !== null) {
      // Replays after a reconnect, a second subscription's catch-up and the seam between
      // history and live messages may repeat what this subscription already handed over.
      if (this._offset !== null && compareOffsets(offset, this._offset) <= 0) return;
      this._offset = offset;
      this._standing = null;
    }
    this._client._call(this._onMessage, frame.data, { topic: frame.topic, offset });
  }

  _reset() {
    if (this._state === 'closed' || this._state === 'refused') return;
    // Not answered yet on this connection: the reset is about another subscription of the
    // topic (the server answers each subscribe before anything else about it), and this one's
    // own catch-up, from its own offset, is still to come.
    if (this._state === 'pending') return;
    // The page refetches; the live messages after the reset follow it without a gap, so the
    // next resubscribe must not ask for "from now", which would lose what is published while
    // the page is away. A reset before any message (`since` older than the history kept, or
    // unknown) resumes where `subscribed` said live messages start: the old offset would only
    // get `reset` again. A reset after messages (the page fell behind) keeps the last offset
    // delivered: history still holds what was dropped.
    if (this._standing !== null) this._offset = this._standing;
    const onReset = this._options.onReset;
    if (onReset) this._client._call(onReset, this.plainTopic);
    else {
      // Unheard, a reset leaves the page showing a view with a hole in it and no clue why.
      this._client._report({
        reason: 'reset',
        detail: `${this.plainTopic}: messages were missed (the page was away longer than the server keeps history, or fell behind): pass onReset to refetch what the page shows`,
      });
    }
  }

  /** @param {{topic?: string, offset?: string | null}} frame */
  _subscribed(frame) {
    if (this._state !== 'pending') return;
    this._state = 'active';
    this._retries = 0;
    if (typeof frame.offset === 'string' && !isStateTopic(this.plainTopic)) this._standing = frame.offset;
    if (isStateTopic(this.plainTopic) && this._offset !== null &&
        (typeof frame.offset !== 'string' || compareOffsets(frame.offset, this._offset) < 0)) {
      // The state is older than the offset held, or there is no such row: that offset is no
      // version of this state (a `since` kept from a database since restored or recreated, or
      // not a version at all). Kept, it would drop the snapshot that follows (the server sends
      // one whenever `since` is not the current version) and every version up to it. Nothing
      // this server sent on the topic can be newer than the version it answers with here.
      this._offset = null;
    }
    if (this._offset === null && typeof frame.offset === 'string' && !isStateTopic(this.plainTopic)) {
      // Subscribed "from now": the server says where that is. A reconnect before the first
      // message resumes from there, or what was published meanwhile would be lost. (A state
      // topic's offset is the version of the snapshot that follows: keeping it would drop it.)
      this._offset = frame.offset;
    }
    const cb = this._options.onSubscribed;
    if (cb) this._client._call(cb, { topic: frame.topic ?? this.plainTopic, offset: frame.offset ?? null });
  }

  /** @param {string} reason */
  _refused(reason) {
    if (this._state === 'closed' || this._state === 'refused') return;
    this._state = 'refused';
    const cb = this._options.onRefused;
    // The plain topic, as every other callback names it: a signed one's signature is the
    // permission, and a page that logs what it is told would log it. `this.topic` keeps it.
    if (cb) this._client._call(cb, reason, { topic: this.plainTopic });
    else {
      // The plain topic: a signed one's signature is the permission, and this may reach a log.
      const hint = this._client._refusalHint(reason);
      this._client._report({ reason: 'refused', detail: `subscribe to ${this.plainTopic} refused: ${reason}: ${hint}` });
    }
  }
}

/** Live subscriptions by plain topic, plus the subscribe refs awaiting an answer. */
class Registry {
  constructor() {
    /** @type {Map<string, Set<Subscription>>} */
    this._byTopic = new Map();
    /** @type {Map<string, Subscription>} refs of this connection only */
    this._pending = new Map();
    /**
     * Refs of subscribes sent with a `since`, not refused, and their subscriptions: after
     * `subscribed` the server sends their replay (or snapshot), and answers a ping sent meanwhile
     * only once it is done. A `reset` that answers one of them (its `since` history cannot
     * resume from) comes in that time too, naming its ref: the ref still finds its subscription.
     * @type {Map<string, Subscription>}
     */
    this._replaying = new Map();
  }

  /** @param {Subscription} sub */
  add(sub) {
    let set = this._byTopic.get(sub.plainTopic);
    if (!set) this._byTopic.set(sub.plainTopic, (set = new Set()));
    set.add(sub);
  }

  /**
   * @param {Subscription} sub
   * @returns {boolean} whether the topic has no subscription left
   */
  remove(sub) {
    const set = this._byTopic.get(sub.plainTopic);
    if (!set) return true;
    set.delete(sub);
    if (set.size === 0) this._byTopic.delete(sub.plainTopic);
    return set.size === 0;
  }

  /**
   * A snapshot, so callbacks may subscribe or unsubscribe while we iterate.
   * @param {string} plainTopic
   * @returns {Subscription[]}
   */
  forTopic(plainTopic) {
    const set = this._byTopic.get(plainTopic);
    return set ? [...set] : [];
  }

  /** @returns {Subscription[]} */
  all() {
    /** @type {Subscription[]} */
    const out = [];
    for (const set of this._byTopic.values()) out.push(...set);
    return out;
  }

  /**
   * @param {string} ref
   * @param {Subscription} sub
   * @param {string | null} since the offset the subscribe asks to resume from
   */
  expect(ref, sub, since) {
    this._pending.set(ref, sub);
    if (since !== null && since !== undefined) this._replaying.set(ref, sub);
  }

  /**
   * @param {unknown} ref
   * @param {boolean} [refused] a refusal: no replay follows it
   * @returns {Subscription | undefined}
   */
  answer(ref, refused = false) {
    const key = String(ref);
    const sub = this._pending.get(key);
    this._pending.delete(key);
    if (refused) this._replaying.delete(key);
    return sub;
  }

  /**
   * The subscriptions a `reset` is about: the one whose subscribe it answers when it names a ref
   * (none when that ref is no subscribe of this connection's with a `since`, or of another
   * topic: the reset is about no subscription of the page), else every one of the topic.
   * @param {{topic: string, ref?: unknown}} frame
   * @returns {Subscription[]}
   */
  resetOf(frame) {
    if (frame.ref === undefined || frame.ref === null) return this.forTopic(frame.topic);
    const sub = this._replaying.get(String(frame.ref));
    return sub && sub.plainTopic === frame.topic ? [sub] : [];
  }

  /**
   * The pong of the ping sent with `ref` came. The server answers a connection's frames in order,
   * so a subscribe sent before that ping and still unanswered never will be: the server could
   * not read it and said so in an `error`, which has no ref. It stops counting as awaited, or
   * every later wake-up ping would wait the whole heartbeat for it. Their replays are done too.
   * @param {unknown} ref
   */
  answeredBefore(ref) {
    const upTo = Number(ref);
    if (!Number.isFinite(upTo)) return;
    // Refs increase and are expected in the order they are sent: the first one not below the
    // ping's went out after it.
    for (const refs of [this._pending, this._replaying]) {
      for (const key of refs.keys()) {
        if (Number(key) >= upTo) break;
        refs.delete(key);
      }
    }
  }

  /**
   * Whether a subscribe of this connection still awaits its answer, or its replay may still be
   * under way: no frame says a replay ended, only the pong of a ping sent after its subscribe.
   */
  get awaiting() {
    return this._pending.size > 0 || this._replaying.size > 0;
  }

  /** A new connection: answers to the old one's refs will never come. */
  forgetRefs() {
    this._pending.clear();
    this._replaying.clear();
  }

  /**
   * The server names the plain topic in `subscribed`; trust it over our own parsing.
   * @param {Subscription} sub
   * @param {string} plainTopic
   */
  rekey(sub, plainTopic) {
    if (sub.plainTopic === plainTopic) return;
    this.remove(sub);
    sub.plainTopic = plainTopic;
    this.add(sub);
  }
}

// ---------------------------------------------------------------------------------------------
// 6. Socket
// ---------------------------------------------------------------------------------------------

/**
 * @typedef {object} StatusInfo
 * @property {number} [code] the close code that caused the change
 * @property {string} [reason] the close reason, or why the client dropped the connection
 * @property {number} [delayMs] for `reconnecting`: how long until the next attempt
 * @property {number} [tries] for `reconnecting`: consecutive failed attempts so far
 */

/**
 * @typedef {object} LivePushError
 * @property {string} reason "bad_frame", "unknown_op", ... from a server `error` frame, or
 *   "handler_error" when one of your callbacks threw, or "invalid_frame" for an unparsable
 *   frame from the server, or "connect_failed" when a connection could not even be attempted,
 *   or "refused" for a refused subscription that has no onRefused, or "reset" for a `reset`
 *   that a subscription has no onReset for, or "unavailable" for a subscribe the server could
 *   not serve just now (once a run of retries)
 * @property {string} [detail]
 * @property {unknown} [error] the exception, for "handler_error"
 */

/**
 * @typedef {object} LivePushOptions
 * @property {string | (() => string | null | undefined) | null} [token] session token, sent in
 *   the `Sec-WebSocket-Protocol` header (`livepush`, `livepush.token.<token>`), which proxies do
 *   not log; a function is called on every connect (to hand over a fresh one), and for a renewed
 *   token when a topic is refused `forbidden` on a connection that sent one the server did not
 *   take, or when the session it sent ends while connected (close 4403): given another token,
 *   the client reconnects with it at once; given the same one or none, it stops. Prefer the
 *   `__Host-livepush_session` cookie when the server shares the page's site.
 * @property {((err: LivePushError) => void) | null} [onError] server `error` frames and exceptions from
 *   your callbacks; the connection keeps going. Never called before `new LivePush()` returns, so
 *   it may name the client. Default: console.warn.
 * @property {((tries: number) => number) | null} [reconnectAfterMs] the delay before retry number `tries`
 * @property {any} [WebSocket] WebSocket constructor (tests inject a fake)
 * @property {() => number} [random]
 * @property {() => number} [now]
 * @property {(fn: () => void, ms: number) => unknown} [setTimeout]
 * @property {(handle: any) => void} [clearTimeout]
 * @property {any} [document] for `visibilitychange`; null to not listen
 * @property {any} [window] for `online`; null to not listen
 */

/** What LivePushOptions holds. */
const LIVEPUSH_OPTIONS = Object.freeze(['token', 'onError', 'reconnectAfterMs', 'WebSocket', 'random', 'now',
  'setTimeout', 'clearTimeout', 'document', 'window']);

/**
 * A connection to a livepush server that survives restarts: it reconnects with jitter,
 * resubscribes every topic from the last offset it saw and drops duplicates.
 *
 * Statuses: `connecting` (first attempt), `open` (hello received), `reconnecting` (lost,
 * waiting or retrying), `closed` (you called close()), `unauthorized` (closed with 4401, or
 * with 4403 and no renewed token from a token function: never retried).
 */
export class LivePush {
  /**
   * @param {string} url ws://, wss://, http(s):// (turned into ws(s)://) or a path relative
   *   to the page
   * @param {LivePushOptions | null} [options] null means none
   */
  constructor(url, options = {}) {
    options = optionsOf(options, 'new LivePush(url, options)', LIVEPUSH_OPTIONS);
    if (typeof url !== 'string' || url === '') {
      throw new TypeError('LivePush needs the server URL, e.g. new LivePush("wss://push.example.com/")');
    }
    checkUrlScheme(url);
    // Asked only once something goes wrong: an onError that is no function would swallow every
    // error, and a delay given as a number would fail each retry with a bare "is not a function".
    checkCallback('LivePush options.onError', options.onError, 'pass the function itself, not what calling it returns');
    checkCallback('LivePush options.reconnectAfterMs', options.reconnectAfterMs,
      'it is asked for the delay before each retry, e.g. reconnectAfterMs: (tries) => 1000');
    checkToken(options.token);
    const g = /** @type {any} */ (globalThis);
    this._url = url;
    this._token = options.token ?? null;
    this._WebSocket = options.WebSocket ?? g.WebSocket;
    if (typeof this._WebSocket !== 'function') {
      throw new TypeError('LivePush needs a WebSocket implementation: pass {WebSocket} outside a browser');
    }
    this._random = options.random ?? Math.random;
    /** @type {Clock} */
    this._clock = {
      now: options.now ?? (() => Date.now()),
      setTimeout: options.setTimeout ?? ((fn, ms) => g.setTimeout(fn, ms)),
      clearTimeout: options.clearTimeout ?? ((h) => g.clearTimeout(h)),
    };
    this._reconnectAfterMs =
      options.reconnectAfterMs ?? ((/** @type {number} */ tries) => defaultReconnectAfterMs(tries, this._random));
    this._onError = options.onError ?? ((/** @type {LivePushError} */ err) => console.warn('livepush:', err));
    this._document = options.document === undefined ? g.document : options.document;
    // A worker has no window: its global scope hears `online` (and knows its location) itself.
    const inWorker = typeof g.WorkerGlobalScope === 'function' && g instanceof g.WorkerGlobalScope;
    this._window = options.window === undefined ? (g.window ?? (inWorker ? g : undefined)) : options.window;

    /** @type {LivePushStatus} */
    this._status = Status.CONNECTING;
    /** @type {Map<string, Set<Function>>} */
    this._listeners = new Map();
    this._registry = new Registry();
    this._refSeq = 0;
    this._tries = 0;
    /** @type {any} */
    this._ws = null;
    /** @type {number | null} when hello arrived on the current socket */
    this._helloAt = null;
    /** @type {{subject: string} | null} */
    this._session = null;
    this._stopped = false;
    /** @type {string | null} the token the current connection offered (its hello may still say anonymous) */
    this._sentToken = null;
    /**
     * Whether the current connection was opened with a token the token function renewed: one
     * that is taken as anonymous too does not renew again (see _renewToken).
     */
    this._renewedConnection = false;
    /** @type {number | null} the close code (4401, 4403) that refused the session for good */
    this._refusedCode = null;
    this._everOpened = false;
    /** @type {Set<Subscription>} subscribes of this connection waiting for the pace, in order */
    this._subscribeQueue = new Set();
    this._subscribeTokens = SUBSCRIBE_BURST;
    this._subscribeTokensAt = 0;
    this._subscribeTimer = new Timer(this._clock, () => this._sendQueuedSubscribes());

    this._reconnectTimer = new Timer(this._clock, () => this._connect());
    this._connectTimer = new Timer(this._clock, () => this._drop('no hello from the server'));
    this._heartbeat = new Heartbeat(this._clock, {
      ping: () => this._send({ op: 'ping', ref: this._nextRef() }),
      onDead: () => this._drop('heartbeat timeout'),
      busy: () => this._registry.awaiting,
    });

    this._onVisibility = () => {
      if (this._document && this._document.visibilityState === 'visible') this._wake();
    };
    this._onOnline = () => this._wake();
    this._document?.addEventListener?.('visibilitychange', this._onVisibility);
    this._window?.addEventListener?.('online', this._onOnline);

    /** @type {LivePushError[] | null} what went wrong while the constructor ran, said once it returned */
    this._heldReports = [];
    this._connect();
    const held = this._heldReports;
    this._heldReports = null;
    if (held.length > 0) {
      // The page's onError may name the client it is given to (`lp.close()` on connect_failed),
      // which the page holds only once `new` returned: what the first attempt reported is said
      // just after, as a browser's WebSocket says its own failures; not once the page closed it.
      queueMicrotask(() => {
        for (const err of held) if (!this._stopped) this._report(err);
      });
    }
  }

  /** @returns {LivePushStatus} */
  get status() {
    return this._status;
  }

  /** The session the server announced in `hello` (null when anonymous or not connected). */
  get session() {
    return this._session;
  }

  /**
   * Listen to an event. The only event is `status`: fn(status, info).
   * @param {'status'} event
   * @param {(status: LivePushStatus, info: StatusInfo) => void} fn
   * @returns {() => void} call it to stop listening
   */
  on(event, fn) {
    if (event !== 'status') throw new TypeError(`LivePush has no "${event}" event; listen to "status"`);
    if (typeof fn !== 'function') {
      // Kept, it would fail at every status change, reported as a bare "is not a function".
      throw new TypeError(`lp.on('status', fn): fn must be a function, not ${describeArg(fn)}: pass the function itself, not what calling it returns`);
    }
    let set = this._listeners.get(event);
    if (!set) this._listeners.set(event, (set = new Set()));
    set.add(fn);
    return () => this.off(event, fn);
  }

  /**
   * @param {'status'} event
   * @param {Function} fn
   */
  off(event, fn) {
    this._listeners.get(event)?.delete(fn);
  }

  /**
   * Receive the messages of a topic. Call it while connecting, open or reconnecting: the
   * subscribe frame goes out as soon as the connection is open, and again after every
   * reconnect. After close() or `unauthorized` it throws.
   *
   * @param {string} topic a plain topic or a signed one (`topic~signature`)
   * @param {(data: any, meta: MessageMeta) => void} onMessage
   * @param {SubscribeOptions | null} [options] null means none
   * @returns {Subscription}
   */
  subscribe(topic, onMessage, options = {}) {
    options = optionsOf(options, 'subscribe(topic, onMessage, options)', SUBSCRIBE_OPTIONS);
    if (this._stopped) {
      // A page that never called close() must not be sent looking for who did: after 4401 or
      // 4403 the session is what ended it, and only a new one brings the client back.
      throw new Error(this._refusedCode === null
        ? 'this LivePush is closed: create a new one to subscribe again'
        : `this LivePush is closed for good: the server refused its session (${this._refusedCode}: `
          + `${this._refusedCode === CloseCode.REVOKED ? 'revoked or expired' : 'none valid where one is required'}): `
          + 'sign the user in again and create a new LivePush with the new session');
    }
    if (typeof topic !== 'string' || topic === '') throw new TypeError('subscribe() needs a topic string');
    if (typeof onMessage !== 'function') throw new TypeError('subscribe() needs an onMessage function');
    if (topic.length > MAX_TOPIC_LENGTH) {
      // The server refuses it anyway, or, past its frame limit, closes the connection (1009)
      // instead of answering: resent after every reconnect, it would take every other
      // subscription of the page down with it.
      throw new TypeError(`subscribe() topic is ${topic.length} characters long, not a topic (at most ${MAX_TOPIC_LENGTH}, signed): ${topic.slice(0, 40)}…`);
    }
    const sub = new Subscription(this, topic, onMessage, options);
    this._registry.add(sub);
    if (this._status === Status.OPEN) this._sendSubscribe(sub);
    return sub;
  }

  /**
   * Close for good: no reconnect, status `closed`. On a client already ended (closed, or
   * `unauthorized`) it changes nothing: a page that tidies up on `unauthorized` must not turn
   * that status into `closed` for the listeners after it, which then never send the user to sign in.
   */
  close() {
    if (this._stopped) return;
    this._shutdown();
    this._setStatus(Status.CLOSED, { code: CloseCode.NORMAL });
  }

  // -- internals ------------------------------------------------------------------------------

  /** @param {string} [renewed] a token the token function just gave (_renewToken): not asked again */
  _connect(renewed) {
    this._reconnectTimer.cancel();
    if (this._stopped) return;
    // A renewal's attempt is never the first, even before any hello (a 4403 that came first).
    const again = this._tries > 0 || this._everOpened || renewed !== undefined;
    this._setStatus(again ? Status.RECONNECTING : Status.CONNECTING, {});
    /** @type {any} an instance of the browser's WebSocket or of the one injected */
    let ws;
    try {
      const token = renewed ?? this._currentToken();
      // The token function is the page's code: one that closed the client (the user signed out)
      // has ended it, and a socket opened now would bring it back to `open` after `closed`.
      if (this._stopped) return;
      ws = new this._WebSocket(this._socketUrl(), token ? [SUBPROTOCOL, TOKEN_SUBPROTOCOL + token] : [SUBPROTOCOL]);
      this._sentToken = token || null;
      this._renewedConnection = renewed !== undefined;
    } catch (err) {
      // A malformed URL throws synchronously; retrying with backoff will not fix it, but
      // surfacing it and backing off beats a tight loop or a silent stop. A token function that
      // closed the client before it threw has ended it: nothing is retried after `closed`.
      if (this._stopped) return;
      this._report({ reason: 'connect_failed', detail: describeValue(err), error: err });
      this._afterClose(CloseCode.ABNORMAL, 'connect failed');
      return;
    }
    this._ws = ws;
    this._helloAt = null;
    this._registry.forgetRefs();
    ws.onmessage = (/** @type {{data: any}} */ ev) => {
      if (ws === this._ws) this._onFrame(ev.data);
    };
    ws.onclose = (/** @type {{code?: number, reason?: string}} */ ev) => {
      if (ws === this._ws) this._onSocketClosed(ev?.code ?? CloseCode.ABNORMAL, ev?.reason ?? '');
    };
    ws.onerror = () => {}; // `close` always follows and carries what we need
    this._connectTimer.schedule(CONNECT_TIMEOUT_MS);
  }

  /** @returns {string} */
  _socketUrl() {
    // A worker has no window or document, and a page may pass `window: null` only to turn the
    // wake-up listeners off: the global `location` still knows where the script runs.
    const base = this._window?.location?.href ?? this._document?.baseURI ?? /** @type {any} */ (globalThis).location?.href;
    const url = new URL(this._url, base);
    // A fragment never reaches a server, and browsers that follow the older WebSocket standard
    // refuse a URL that has one, on every retry: `/push#` from a template would never connect.
    url.hash = '';
    if (url.protocol === 'http:') url.protocol = 'ws:';
    else if (url.protocol === 'https:') url.protocol = 'wss:';
    return url.toString();
  }

  /**
   * The token to offer: options.token, or what the token function gives now. It travels as the
   * subprotocol `livepush.token.<token>` beside `livepush` (which the server selects): a header
   * rather than the query string, since proxies and load balancers log URLs, not this header.
   * @returns {string | null | undefined}
   */
  _currentToken() {
    const source = this._token;
    const asked = typeof source === 'function';
    /** @type {unknown} */
    const token = typeof source === 'function' ? source() : source;
    if (token !== null && token !== undefined && typeof token !== 'string') {
      // An async token function is the usual slip: its Promise would go out as the token
      // "[object Promise]", which the browser refuses in a message that does not say why.
      const what = asked ? 'the token function returned' : 'options.token is';
      throw new TypeError(typeof (/** @type {any} */ (token)).then === 'function'
        ? `${what} a Promise: return the token itself, a string (fetch it before connecting, and keep the renewed one at hand for the reconnects)`
        : `${what} ${typeof token}: a token is a string (or null for none)`);
    }
    if (token && !SUBPROTOCOL_CHARS.test(token)) {
      // The browser would refuse it with a SyntaxError that quotes the token into the console,
      // on every retry; this says what is wrong without it.
      throw new TypeError('the token has characters a WebSocket subprotocol cannot carry (whitespace, such as the newline '
        + 'ending a response body, quotes or commas): pass it exactly as livepush.sessions.issue() made it');
    }
    return token;
  }

  /** @param {any} text */
  _onFrame(text) {
    this._heartbeat.touch();
    let frame;
    try {
      frame = JSON.parse(typeof text === 'string' ? text : String(text));
    } catch {
      this._report({ reason: 'invalid_frame', detail: 'the server sent a frame that is not JSON' });
      return;
    }
    if (!frame || typeof frame !== 'object') return;
    switch (frame.op) {
      case 'hello':
        return this._onHello(frame);
      case 'subscribed': {
        const sub = this._registry.answer(frame.ref);
        if (!sub || sub.state !== 'pending') return; // unsubscribed while the answer was on its way
        // Map by ref: for a signed topic the server answers with the plain one.
        if (typeof frame.topic === 'string') this._registry.rekey(sub, frame.topic);
        return sub._subscribed(frame);
      }
      case 'refused': {
        const sub = this._registry.answer(frame.ref, true);
        if (!sub || sub.state !== 'pending') return;
        const reason = String(frame.reason ?? 'refused');
        if (TRANSIENT_REFUSALS.has(reason)) return this._retrySubscribe(sub);
        // Still pending and registered: the new connection sends it again, from its offset. A
        // connection that has its session was not refused for want of one.
        if (reason === 'forbidden' && this._session === null && this._renewToken({})) return;
        // A subscription of the topic unsubscribed while this one waited (it was not the last
        // then) left the server streaming the topic: with this one gone, nobody hears it.
        if (this._registry.remove(sub)) this._release(sub.plainTopic);
        return sub._refused(reason);
      }
      case 'message':
        for (const sub of this._registry.forTopic(frame.topic)) sub._deliver(frame);
        return;
      case 'reset':
        // A reset that names a subscribe is that subscription's alone: the others of the topic
        // lost nothing, and a refetch would show again what their next messages add.
        for (const sub of this._registry.resetOf(frame)) sub._reset();
        return;
      case 'pong':
        // Its arrival already fed the heartbeat; and it comes after every answer to what was sent before its ping.
        this._registry.answeredBefore(frame.ref);
        return;
      case 'error':
        this._report({ reason: String(frame.reason ?? 'error'), detail: frame.detail });
        return;
      default:
        return; // newer servers may add frames; ignore what we do not know
    }
  }

  /** @param {any} frame */
  _onHello(frame) {
    this._connectTimer.cancel();
    this._helloAt = this._clock.now();
    this._everOpened = true;
    this._session = frame.session ?? null;
    this._heartbeat.start(Number(frame.heartbeat) || 0);
    // The server counts subscribes per connection: a new one starts with a full burst.
    this._subscribeTokens = SUBSCRIBE_BURST;
    this._subscribeTokensAt = this._helloAt;
    // Subscribe only now: sending earlier would race a 4401 close on `required` servers. And
    // before announcing `open`: a listener that subscribes sends its own frame, which this
    // loop would send a second time (each copy counts against the server's subscribe rate).
    for (const sub of this._registry.all()) this._sendSubscribe(sub);
    this._setStatus(Status.OPEN, {});
  }

  /**
   * Send the subscribe at the pace the server takes (SUBSCRIBE_BURST), after those waiting.
   * @param {Subscription} sub
   */
  _sendSubscribe(sub) {
    sub._state = 'pending';
    sub._standing = null; // this connection's `subscribed` will say
    this._subscribeQueue.add(sub);
    this._sendQueuedSubscribes();
  }

  _sendQueuedSubscribes() {
    const now = this._clock.now();
    // Never below zero: `now` is the wall clock by default, and one set back an hour would
    // otherwise cost an hour's worth of subscribes, holding every next one back that long.
    const earned = (Math.max(0, now - this._subscribeTokensAt) * SUBSCRIBES_PER_SECOND) / 1000;
    this._subscribeTokens = Math.min(SUBSCRIBE_BURST, this._subscribeTokens + earned);
    this._subscribeTokensAt = now;
    for (const sub of this._subscribeQueue) {
      if (this._subscribeTokens < 1) break;
      this._subscribeQueue.delete(sub);
      if (sub.state !== 'pending') continue; // unsubscribed while it waited
      this._subscribeTokens -= 1;
      const ref = this._nextRef();
      this._registry.expect(ref, sub, sub.offset);
      // Its offset is where the subscription stood when it was queued: a pending one takes no
      // message, so the replay this asks for is all it gets of what came after.
      this._send({ op: 'subscribe', topic: sub.topic, since: sub.offset, ref });
    }
    if (this._subscribeQueue.size > 0 && !this._subscribeTimer.pending) {
      this._subscribeTimer.schedule(Math.ceil(((1 - this._subscribeTokens) * 1000) / SUBSCRIBES_PER_SECOND));
    }
  }

  /**
   * The server could not serve the topic just now; ask again later on this connection (a
   * reconnect resends it anyway).
   * @param {Subscription} sub
   */
  _retrySubscribe(sub) {
    sub._retries += 1;
    if (sub._retries === 1) {
      // Once a run, not on every retry: a page that hears nothing cannot tell its user why its
      // updates wait. onSubscribed runs when the subscription is served again.
      this._report({
        reason: 'unavailable',
        // Storage is not the only cause: the app's authorize() failing or timing out is answered
        // so too, and a page's developer sent to the database would look in the wrong place.
        detail: `subscribe to ${sub.plainTopic}: the server could not serve it just now (it could not read the topic's history or state, or the app's authorize() failed or did not answer in time: the server's log says which): retried with backoff until it can (onSubscribed runs then)`,
      });
    }
    const delayMs = this._delayFor(sub._retries);
    // The page's onError, here or in _delayFor, may have closed the client, which ended it, or
    // unsubscribed: nothing is left to retry then.
    if (this._stopped || sub.state !== 'pending') return;
    const ws = this._ws;
    sub._retryTimer = new Timer(this._clock, () => {
      sub._retryTimer = null;
      if (this._ws === ws && this._status === Status.OPEN && sub.state === 'pending') this._sendSubscribe(sub);
    });
    sub._retryTimer.schedule(delayMs);
  }

  /** @param {Subscription} sub */
  _unsubscribe(sub) {
    // A page that churns its subscriptions must not grow the queue, nor keep a timer (and the
    // subscription it holds) per subscription it dropped while the server was unavailable.
    this._subscribeQueue.delete(sub);
    sub._retryTimer?.cancel();
    sub._retryTimer = null;
    // Other subscriptions of this page may still need the topic; one server subscription
    // serves them all.
    if (this._registry.remove(sub)) this._release(sub.plainTopic);
  }

  /**
   * No subscription of this page needs the topic any more: the server stops streaming it. (One
   * it never streamed ignores the frame.) A connection not open holds no topic.
   * @param {string} plainTopic
   */
  _release(plainTopic) {
    if (this._status === Status.OPEN) this._send({ op: 'unsubscribe', topic: plainTopic });
  }

  /** @param {object} frame */
  _send(frame) {
    const ws = this._ws;
    if (!ws || ws.readyState !== WS_OPEN) return false;
    try {
      ws.send(JSON.stringify(frame));
      return true;
    } catch {
      return false; // the socket is closing; its close event schedules the reconnect
    }
  }

  _nextRef() {
    this._refSeq += 1;
    return String(this._refSeq);
  }

  /**
   * The client decided the connection is dead (no hello, heartbeat lost). Closing a dead TCP
   * connection can take minutes to report `close`, so stop listening to it and go on now.
   * @param {string} reason
   */
  _drop(reason) {
    if (this._closeSocket(reason)) this._onSocketClosed(CloseCode.ABNORMAL, reason, true);
  }

  /**
   * Stop listening to the current socket and close it, going on at once: its `close` event may
   * take minutes to come (a dead TCP connection), and is not waited for.
   * @param {string} reason
   * @returns {boolean} whether there was a socket
   */
  _closeSocket(reason) {
    const ws = this._ws;
    if (!ws) return false;
    this._detach(ws);
    try {
      ws.close(CloseCode.NORMAL, reason);
    } catch {
      // already closed
    }
    return true;
  }

  /** @param {any} ws */
  _detach(ws) {
    ws.onmessage = ws.onclose = ws.onerror = null;
    if (this._ws === ws) this._ws = null;
  }

  /**
   * @param {number} code
   * @param {string} reason
   * @param {boolean} [detached]
   */
  _onSocketClosed(code, reason, detached = false) {
    if (!detached && this._ws) this._detach(this._ws);
    this._forgetConnection();
    if (this._stopped) return;
    if (FATAL_CODES.has(code)) {
      // 4403: the session ended while connected, and a token function may hold a renewed one.
      // 4401 is not asked: the token was taken from it for this very handshake.
      if (code === CloseCode.REVOKED && this._renewToken({ code })) return;
      // 4401/4403: the session is missing or revoked; retrying would only hammer the server
      // and never succeed. The page must log in again and create a new LivePush.
      this._refusedCode = code;
      this._shutdown();
      this._setStatus(Status.UNAUTHORIZED, { code, reason });
      return;
    }
    this._afterClose(code, reason);
  }

  /** What belonged to the connection that is gone: its timers, its subscribes' refs, its session. */
  _forgetConnection() {
    this._heartbeat.stop();
    this._connectTimer.cancel();
    this._cancelRetries();
    this._registry.forgetRefs();
    this._session = null;
  }

  /**
   * The token the connection sent no longer holds a session: a topic refused `forbidden` on a
   * connection taken as anonymous (the token expired or was revoked while the page was away,
   * LIVEPUSH_AUTHENTICATE=optional), or the session expired or was revoked while connected
   * (4403). A token function may hold a renewed one by now: asked once for this, a token other
   * than the one sent is worth a new connection at once, on which every subscription goes out
   * again from its offset. The same token or none (the user signed out) is not: revocation stays
   * final. A connection opened that way renews no more, unless its session held for
   * STABLE_AFTER_MS before a 4403 ended it: its token was not taken either, or the server takes
   * none (`off`), and a function that makes a new token each call would otherwise reconnect for
   * ever. A connection that sent no token had its session, if any, from the cookie,
   * which no token function renews.
   * @param {StatusInfo} info what `reconnecting` says besides the renewal (the close code)
   * @returns {boolean} whether that is dealt with: the client reconnects with a renewed token, or
   *   the token function closed it (the user signed out)
   */
  _renewToken(info) {
    // A renewed session that then held for a while was taken: its end, later, is the next
    // expiry of a page that renews its token on a timer, not the loop the rule above prevents.
    const held = info.code === CloseCode.REVOKED && this._helloAt !== null
      && this._clock.now() - this._helloAt >= STABLE_AFTER_MS;
    if (typeof this._token !== 'function' || this._sentToken === null || (this._renewedConnection && !held)) return false;
    let token;
    try {
      token = this._currentToken();
    } catch (error) {
      this._report({ reason: 'handler_error', detail: `the token function, asked for a renewed token: ${describeValue(error)}`, error });
      // An onError that closed the client on hearing it has ended it, as the function may.
      return this._stopped;
    }
    // A token function that closed the client (the user signed out) has ended it: nothing is
    // reported or announced after `closed`.
    if (this._stopped) return true;
    if (!token || token === this._sentToken) return false;
    // After a 4403 the socket is gone already; after a refusal it is still open.
    this._closeSocket('token renewed');
    this._forgetConnection();
    this._helloAt = null;
    this._setStatus(Status.RECONNECTING, { ...info, reason: 'token renewed', delayMs: 0, tries: this._tries });
    this._connect(token);
    return true;
  }

  /**
   * @param {number} code
   * @param {string} reason
   */
  _afterClose(code, reason) {
    const helloAt = this._helloAt;
    this._helloAt = null;
    const stable = helloAt !== null && this._clock.now() - helloAt >= STABLE_AFTER_MS;
    if (stable && !PENALTY_CODES.has(code)) this._tries = 0;
    this._tries += 1;
    let delayMs = this._delayFor(this._tries);
    // What reported the failed attempt, and _delayFor, ran the page's callbacks: an onError that
    // gave up and closed the client has ended it, and nothing may be scheduled after `closed`.
    if (this._stopped) return;
    if (code === CloseCode.GOING_AWAY || code === CloseCode.SERVICE_RESTART) {
      // A restart or deploy: come back soon, spread out, never at once; when a draining server
      // said when (`retry=MS`, a livepush server's word, so after 1001 only), then, since it
      // spread the whole herd's delays. If the server keeps going away (tries grows), the normal
      // backoff takes over.
      const asked = code === CloseCode.GOING_AWAY ? retryDelayFromReason(reason) : null;
      const short = asked ?? uniform(GOING_AWAY_MIN_MS, GOING_AWAY_MAX_MS, this._random);
      delayMs = this._tries > 1 ? Math.max(short, delayMs) : short;
    }
    this._reconnectTimer.schedule(delayMs);
    this._setStatus(Status.RECONNECTING, { code, reason, delayMs, tries: this._tries });
  }

  /** The page is visible again or the network is back. */
  _wake() {
    if (this._stopped) return;
    if (this._reconnectTimer.pending) {
      const delayMs = uniform(WAKE_MIN_MS, WAKE_MAX_MS, this._random);
      const due = this._reconnectTimer.dueAt ?? Infinity;
      const now = this._clock.now();
      // Past due and not run: the machine slept, and browsers' timers resume after a sleep with
      // the time they had left, up to the whole backoff, while the wall clock moved on.
      if (now + delayMs < due || due <= now) {
        this._reconnectTimer.schedule(delayMs);
        // A newly scheduled attempt: a page showing "retrying in 30 s" shows the new wait.
        this._setStatus(Status.RECONNECTING, { delayMs, tries: this._tries });
      }
    } else if (this._status === Status.OPEN) {
      // After a sleep, or when the network changed, the socket may be dead without a close
      // event: ask the server at once, and give it only the grace to answer.
      this._heartbeat.probe(HEARTBEAT_GRACE_MS);
    }
  }

  /** The connection is gone: its waiting subscribes go out again after the next hello. */
  _cancelRetries() {
    for (const sub of this._registry.all()) {
      sub._retryTimer?.cancel();
      sub._retryTimer = null;
    }
    this._subscribeQueue.clear();
    this._subscribeTimer.cancel();
  }

  _shutdown() {
    this._stopped = true;
    this._reconnectTimer.cancel();
    this._connectTimer.cancel();
    this._heartbeat.stop();
    this._cancelRetries();
    this._registry.forgetRefs();
    // Nothing is delivered after this, not even the rest of the frame whose callback called
    // close(); and the page's callbacks are let go with the subscriptions that held them.
    for (const sub of this._registry.all()) {
      sub._state = 'closed';
      this._registry.remove(sub);
    }
    this._closeSocket('client closed');
    // Not connected any more: `session` is null then, as after a lost connection (a page that
    // signed the user out and closed the client must not go on showing who was signed in).
    this._session = null;
    this._document?.removeEventListener?.('visibilitychange', this._onVisibility);
    this._window?.removeEventListener?.('online', this._onOnline);
  }

  /**
   * @param {LivePushStatus} status
   * @param {StatusInfo} info
   */
  _setStatus(status, info) {
    const changed = status !== this._status;
    // `reconnecting` is announced again with each newly scheduled attempt (info.delayMs), so
    // a page can show "retrying in 4 s"; an attempt merely starting stays quiet.
    const rescheduled = status === Status.RECONNECTING && info.delayMs !== undefined;
    if (!changed && !rescheduled) return;
    this._status = status;
    const listeners = this._listeners.get('status') ?? new Set();
    for (const fn of [...listeners]) {
      // A listener that changed the status (close() on `reconnecting`) has had every listener
      // told the new one: the old one, handed on, would leave the later ones showing it.
      if (this._status !== status) break;
      // One removed by an earlier listener (a component torn down on this change) is not called,
      // as with DOM events: it would run against what its page just removed.
      if (listeners.has(fn)) this._call(fn, status, info);
    }
  }

  /**
   * What a page can do about a refusal, for onError. A token the server did not take (expired
   * while the page was away, or revoked) makes the connection anonymous under the `optional`
   * mode, and the user's topics are then forbidden: the session is missing, not a rule.
   * @param {string} reason
   * @returns {string}
   */
  _refusalHint(reason) {
    if (reason === 'forbidden' && this._sentToken !== null && this._session === null) {
      // A token function was asked for a renewed token already (_renewToken), to no avail.
      const renewal = typeof this._token === 'function' ? ', and the token function gave no other token the server took' : '';
      return 'the server took this connection as anonymous although a token was sent (expired or revoked, '
        + `or the server runs with LIVEPUSH_AUTHENTICATE=off)${renewal}: sign the user in again and create a new LivePush with a fresh token`;
    }
    return REFUSAL_HINTS[reason] ?? 'pass onRefused to handle it';
  }

  /**
   * Run a user callback; an exception in one must not break the connection for the others.
   * @param {Function} fn
   * @param {...any} args
   */
  _call(fn, ...args) {
    try {
      fn(...args);
    } catch (error) {
      this._report({ reason: 'handler_error', detail: describeValue(error), error });
    }
  }

  /**
   * Hand an error to the user's onError. It is a user callback too: one that throws must not
   * unwind what reported to it (a reconnect being scheduled, a frame being handled).
   * @param {LivePushError} err
   */
  _report(err) {
    if (this._heldReports) {
      this._heldReports.push(err);
      return;
    }
    try {
      this._onError(err);
    } catch {
      // an onError that throws has nowhere left to report to
    }
  }

  /**
   * The delay before retry number `tries`, from the user's `reconnectAfterMs`. It is a user
   * callback: if it throws or gives no usable delay, the default backoff applies, since a
   * missing delay would leave the client without a next attempt and NaN or a negative delay
   * would retry at once, hammering the server. A delay past what a timer holds waits that long
   * instead, for the same reason.
   * @param {number} tries
   * @returns {number}
   */
  _delayFor(tries) {
    let ms;
    try {
      ms = this._reconnectAfterMs(tries);
    } catch (error) {
      this._report({ reason: 'handler_error', detail: `reconnectAfterMs threw: ${describeValue(error)}`, error });
      return defaultReconnectAfterMs(tries, this._random);
    }
    if (typeof ms !== 'number' || !Number.isFinite(ms) || ms < 0) {
      this._report({ reason: 'handler_error', detail: `reconnectAfterMs(${tries}) gave ${describeValue(ms)}, not a delay in milliseconds` });
      return defaultReconnectAfterMs(tries, this._random);
    }
    return Math.min(ms, MAX_TIMER_MS);
  }
}

// ---------------------------------------------------------------------------------------------
// 7. Progress
// ---------------------------------------------------------------------------------------------

/**
 * @typedef {object} ProgressView
 * @property {'job' | 'group' | 'unknown'} kind
 * @property {string} event
 * @property {string | null} state
 * @property {number | null} done
 * @property {number | null} total
 * @property {string | null} message
 * @property {boolean} finished the job or group reached a final state
 */

const JOB_FINAL = new Set(['succeeded', 'failed', 'cancelled']);
// A cancelled group is not finished yet while members it told to stop still run (they may even
// succeed): it finishes, and runs its callbacks, once none is pending.
const GROUP_FINAL = new Set(['finished', 'cancelled']);

/**
 * Read a `job:<id>` or `group:<id>` event (docs/reference.md#6-events-on-state-topics) into what a progress bar shows.
 * @param {any} data
 * @returns {ProgressView}
 */
export function describeProgress(data) {
  const event = String(data?.event ?? '');
  const num = (/** @type {any} */ v) => (typeof v === 'number' && Number.isFinite(v) ? v : null);
  if (data && typeof data.job === 'object' && data.job) {
    const job = data.job;
    const state = job.state ?? null;
    let message = job.progress?.message ?? null;
    // A snapshot names no `retrying` event: a page that loads or reconnects while the job waits
    // for its next attempt (scheduled, or due and available, with an attempt behind it) would
    // lose the error the live stream showed. A job retried by hand starts over at attempt 0.
    const awaitingRetry = (state === 'scheduled' || state === 'available') && num(job.attempt) !== null && job.attempt > 0;
    if (job.error && (state === 'failed' || event === 'retrying' || event === 'failed' || awaitingRetry)) {
      message = errorText(job.error);
    }
    return {
      kind: 'job',
      event,
      state,
      done: num(job.progress?.done),
      total: num(job.progress?.total),
      message: message === null ? null : String(message),
      finished: JOB_FINAL.has(state),
    };
  }
  if (data && typeof data.group === 'object' && data.group) {
    const g = data.group;
    const succeeded = num(g.succeeded) ?? 0;
    const failed = num(g.failed) ?? 0;
    const cancelled = num(g.cancelled) ?? 0;
    const notes = [];
    if (failed) notes.push(`${failed} failed`);
    if (cancelled) notes.push(`${cancelled} cancelled`);
    return {
      kind: 'group',
      event,
      state: g.state ?? null,
      done: succeeded + failed + cancelled,
      total: num(g.total),
      message: notes.length ? notes.join(', ') : null,
      finished: GROUP_FINAL.has(g.state) && (g.state === 'finished' || num(g.pending) === 0),
    };
  }
  return { kind: 'unknown', event, state: null, done: null, total: null, message: null, finished: false };
}

/** @param {any} error */
function errorText(error) {
  if (typeof error === 'string') return error;
  if (error && typeof error.message === 'string') {
    return error.type ? `${error.type}: ${error.message}` : error.message;
  }
  return JSON.stringify(error);
}

/**
 * The text line under the bar: "done/total · state · message", leaving out what is unknown.
 * @param {ProgressView} view
 * @returns {string}
 */
export function progressText(view) {
  const parts = [];
  if (view.total !== null) parts.push(`${view.done ?? 0}/${view.total}`);
  if (view.state) parts.push(view.state);
  if (view.message) parts.push(view.message);
  return parts.join(' · ');
}

/**
 * @typedef {{readonly topic: string, readonly offset: string | null, unsubscribe(): void}} ProgressBinding
 */

/**
 * The binding that renders into each element. One element shows one progress: a page that binds
 * it to the next job would otherwise keep the earlier binding's subscription until it closes, and
 * that job's states would go on overwriting the element's `data-state` and running its onFinish.
 * @type {WeakMap<object, ProgressBinding>}
 */
const progressBindings = new WeakMap();

/**
 * Elements whose children a browser does not show. Handed one (a page's `<progress id="bar">`
 * is the usual slip), bindProgress would render its bar and text where nothing is seen, and the
 * page's own bar would stay indeterminate for good, with no error anywhere.
 */
const CHILDLESS_TAGS = new Set(['progress', 'meter', 'input', 'textarea', 'select', 'img', 'canvas']);

/** The topics whose events describeProgress() reads. */
const PROGRESS_PREFIXES = ['job:', 'group:'];

/**
 * Throw a TypeError unless `topic` is a job's or a group's, plain or signed. Bound to anything
 * else, the element would show an empty bar for good, every message being one it cannot read.
 * Only the plain topic is quoted: the signature is a permission.
 * @param {unknown} topic
 */
function checkProgressTopic(topic) {
  if (typeof topic !== 'string' || topic === '') {
    throw new TypeError(`bindProgress() needs the topic, got ${describeArg(topic)}: job:<id> or group:<id>, e.g. handle.signed_topic`);
  }
  const plain = plainTopicOf(topic);
  if (PROGRESS_PREFIXES.some((prefix) => plain.startsWith(prefix))) return;
  const hint = plain.startsWith('workflow:')
    ? 'a workflow is a graph of steps: subscribe to it and draw them, or bind a fan-out step\'s group:<id>'
    : 'subscribe() to it to show its messages';
  throw new TypeError(`bindProgress() shows a job:<id> or group:<id> topic, not ${plain.slice(0, 200)}: ${hint}`);
}

/**
 * @typedef {object} BindProgressOptions
 * @property {((view: ProgressView, data: any) => void) | null} [onFinish] called once, when the job or
 *   group reaches a final state (job: succeeded, failed, cancelled; group: finished, or
 *   cancelled once none of its members is pending)
 * @property {((view: ProgressView, data: any) => void) | null} [onUpdate] called after every render
 * @property {string | null} [since] the version the page was rendered at: what the element shows
 *   stays until a newer one comes, and a final `data-state` rendered with it through a refusal
 */

/** What BindProgressOptions holds. */
const BIND_PROGRESS_OPTIONS = Object.freeze(['onFinish', 'onUpdate', 'since']);

/**
 * Show a job's or a group's progress in `element`: a `<progress>` bar and a text line
 * (done/total, state, last message). The element's children are replaced; its
 * `data-state` attribute follows the state, for CSS. On `reset` it subscribes afresh, so
 * the server sends a new snapshot. Binding an element again ends its earlier binding.
 *
 * @param {LivePush} lp
 * @param {string} topic `job:<id>` or `group:<id>`, plain or signed (e.g. `handle.signed_topic`)
 * @param {any} element a DOM element
 * @param {BindProgressOptions | null} [given] its options; null means none
 * @returns {ProgressBinding} a handle like a Subscription that stays valid across the
 *   re-subscribe after a reset
 */
export function bindProgress(lp, topic, element, given = {}) {
  // A const, not the parameter reassigned: the callbacks below read it, never null.
  const options = optionsOf(given, 'bindProgress(lp, topic, element, options)', BIND_PROGRESS_OPTIONS);
  // The usual slip is an id the page does not have (getElementById gives null), or the arguments
  // in another order: said here, before anything is subscribed, rather than as a property of
  // null read deep inside.
  if (typeof lp?.subscribe !== 'function') {
    throw new TypeError(`bindProgress() needs the LivePush to subscribe with, got ${describeArg(lp)}: bindProgress(lp, topic, element)`);
  }
  if (element === null || typeof element !== 'object' ||
      (typeof element.replaceChildren !== 'function' && typeof element.appendChild !== 'function')) {
    throw new TypeError(`bindProgress() needs the element to render into, got ${describeArg(element)}: check the id or selector that looked it up`);
  }
  const tag = String(element.tagName ?? '').toLowerCase();
  if (CHILDLESS_TAGS.has(tag)) {
    throw new TypeError(`bindProgress() renders its own <progress> bar and text line inside the element: pass a container such as a <div>, not a <${tag}>, whose children a browser does not show`);
  }
  checkProgressTopic(topic);
  for (const name of /** @type {const} */ (['onFinish', 'onUpdate'])) {
    // Run only when the job reports: said here, before the element is cleared, instead.
    checkCallback(`bindProgress() options.${name}`, options[name], 'pass the function itself, not what calling it returns');
  }
  const doc = element.ownerDocument ?? /** @type {any} */ (globalThis).document;
  const bar = doc.createElement('progress');
  bar.className = 'livepush-progress-bar';
  const label = doc.createElement('span');
  label.className = 'livepush-progress-text';
  let shown = false;
  const show = () => {
    if (shown) return;
    shown = true;
    if (typeof element.replaceChildren === 'function') element.replaceChildren(bar, label);
    else {
      element.textContent = '';
      element.appendChild(bar);
      element.appendChild(label);
    }
  };
  let finished = false;
  /** Whether the binding was ended: unsubscribed, or its element bound again. */
  let ended = false;
  // With `since`, whether the page rendered a final state (its `data-state`, as render() sets it
  // for CSS): a refusal leaves that shown until a newer version replaces it, as it does one this
  // binding rendered. (A group's `cancelled` is not final while members run: not read as one.)
  const renderedState = (options.since ?? null) === null ? null : element.getAttribute?.('data-state');
  const renderedFinal = plainTopicOf(topic).startsWith('job:') ? JOB_FINAL.has(renderedState) : renderedState === 'finished';

  /** @param {ProgressView} view */
  const render = (view) => {
    show();
    if (view.total !== null && view.total > 0) {
      bar.setAttribute('max', String(view.total));
      bar.setAttribute('value', String(Math.min(view.done ?? 0, view.total)));
    } else if (view.finished) {
      bar.setAttribute('max', '1');
      bar.setAttribute('value', view.state === 'succeeded' || view.state === 'finished' ? '1' : '0');
    } else {
      bar.removeAttribute('value'); // indeterminate until the first progress report
    }
    // textContent, never innerHTML: messages are user data.
    label.textContent = progressText(view);
    if (view.state) element.setAttribute?.('data-state', view.state);
  };

  /** @param {any} data */
  const onMessage = (data) => {
    const view = describeProgress(data);
    if (view.kind === 'unknown') return;
    render(view);
    // Each callback on its own: an onUpdate that throws must not cost the page its onFinish.
    if (options.onUpdate) lp._call(options.onUpdate, view, data);
    // An onUpdate that ended this binding (it bound the element to the next job, or unsubscribed)
    // has moved the page on: this binding's onFinish no longer runs, as after any ending.
    if (ended) return;
    if (view.finished && !finished) {
      finished = true;
      if (options.onFinish) lp._call(options.onFinish, view, data);
    }
    // A retried job leaves its final state again; let onFinish fire for the next ending.
    if (!view.finished) finished = false;
  };

  const subscribeOptions = {
    since: options.since ?? null,
    onReset: () => {
      // The page missed events older than the kept history; a fresh subscription brings
      // the current state as a snapshot.
      current.unsubscribe();
      current = lp.subscribe(topic, onMessage, { ...subscribeOptions, since: null });
    },
    onRefused: (/** @type {string} */ reason) => {
      // A resubscribe after a reconnect, refused (a signed topic's TTL ran out while the page
      // stayed open): the final state shown is still the job's or group's, and "not allowed" in
      // its place would read as if the work had failed. So is one the server rendered.
      if (finished || (renderedFinal && !shown)) return;
      show();
      label.textContent = `not allowed: ${reason}`;
      element.setAttribute?.('data-state', 'refused');
    },
  };
  // Subscribed before anything of the page's is touched: on a closed client this throws, and the
  // element and its earlier binding stay as they were instead of cleared for a binding never made.
  let current = lp.subscribe(topic, onMessage, subscribeOptions);
  progressBindings.get(element)?.unsubscribe();
  // With `since`, the page already shows that version (rendered by the server): it stays until a
  // newer one comes. Cleared at once, a job that had finished at that version left an empty bar
  // for good, since the server sends nothing newer.
  if ((options.since ?? null) === null) show();
  /** @type {ProgressBinding} */
  const binding = {
    topic,
    get offset() {
      return current.offset;
    },
    unsubscribe() {
      ended = true;
      current.unsubscribe();
      if (progressBindings.get(element) === binding) progressBindings.delete(element);
    },
  };
  progressBindings.set(element, binding);
  return binding;
}
