// Public API of livepush.js (the browser client). The JS file carries the same types as JSDoc.
// Options may be null wherever a call takes them, and so may each callback option: null means
// none, as leaving it out does.

export type LivePushStatus = 'connecting' | 'open' | 'reconnecting' | 'closed' | 'unauthorized';

export declare const Status: Readonly<{
  CONNECTING: 'connecting';
  OPEN: 'open';
  RECONNECTING: 'reconnecting';
  CLOSED: 'closed';
  UNAUTHORIZED: 'unauthorized';
}>;

export declare const CloseCode: Readonly<{
  NORMAL: 1000;
  GOING_AWAY: 1001;
  ABNORMAL: 1006;
  POLICY: 1008;
  TOO_BIG: 1009;
  SERVICE_RESTART: 1012;
  TRY_AGAIN_LATER: 1013;
  UNAUTHORIZED: 4401;
  REVOKED: 4403;
}>;

export declare const BACKOFF_BASE_MS: number;
export declare const BACKOFF_CAP_MS: number;
export declare const JITTER_MIN: number;
export declare const JITTER_MAX: number;
export declare const STABLE_AFTER_MS: number;
export declare const GOING_AWAY_MIN_MS: number;
export declare const GOING_AWAY_MAX_MS: number;
export declare const RETRY_MAX_MS: number;
export declare const WAKE_MIN_MS: number;
export declare const WAKE_MAX_MS: number;
export declare const CONNECT_TIMEOUT_MS: number;
export declare const HEARTBEAT_GRACE_MS: number;
/** The longest a server's replay may be silent while it waits out a store restart; a ping behind a subscribe gets at least this and the grace. */
export declare const REPLAY_SILENCE_MS: number;
/** The subprotocol the server selects; a token travels beside it as `livepush.token.<token>`. */
export declare const SUBPROTOCOL: 'livepush';
/** Subscribes sent at once on a new connection; the rest follow at SUBSCRIBES_PER_SECOND. */
export declare const SUBSCRIBE_BURST: number;
export declare const SUBSCRIBES_PER_SECOND: number;

/** What accompanies a status change. */
export interface StatusInfo {
  /** The close code that caused the change. */
  code?: number;
  /** The close reason, or why the client dropped the connection ("heartbeat timeout", ...). */
  reason?: string;
  /** For `reconnecting`: milliseconds until the next attempt. */
  delayMs?: number;
  /** For `reconnecting`: consecutive failed attempts so far. */
  tries?: number;
}

export interface LivePushError {
  /** A server `error` frame's reason ("bad_frame", "unknown_op", ...), "handler_error" when a
   * callback of yours threw, "invalid_frame" for a non-JSON frame, "connect_failed", "refused"
   * for a refused subscription that has no onRefused, "reset" for a reset one has no onReset for,
   * "unavailable" for a subscribe the server could not serve just now (once a run of retries). */
  reason: string;
  detail?: string;
  error?: unknown;
}

export interface LivePushOptions {
  /** Session token, sent in the `Sec-WebSocket-Protocol` header (`livepush.token.<token>`), never in
   * the URL; a function is asked on every connect, and for a renewed token when a topic is refused
   * `forbidden` on a connection that sent one the server did not take, or when the session it sent
   * ends while connected (close 4403): given another token, the client reconnects with it at once;
   * given the same one or none, it stops (`unauthorized` after 4403). Prefer the `__Host-livepush_session` cookie when
   * the push server is the page's own host. */
  token?: string | (() => string | null | undefined) | null;
  /** Server `error` frames and exceptions thrown by your callbacks. Never called before `new LivePush()`
   * returns, so it may name the client. Default: console.warn. */
  onError?: ((err: LivePushError) => void) | null;
  /** Delay before retry number `tries` (1-based). Default: 500 ms × 2^(tries-1), capped at
   * 30 s, times a uniform factor in [0.5, 1.5). */
  reconnectAfterMs?: ((tries: number) => number) | null;
  // Injectable for tests; the defaults use the globals.
  WebSocket?: new (url: string, protocols?: string | string[]) => WebSocketLike;
  random?: () => number;
  now?: () => number;
  setTimeout?: (fn: () => void, ms: number) => unknown;
  clearTimeout?: (handle: any) => void;
  /** Listened to for `visibilitychange`; null to not listen. */
  document?: EventTargetLike | null;
  /** Listened to for `online`; null to not listen. */
  window?: EventTargetLike | null;
}

export interface WebSocketLike {
  readyState: number;
  send(data: string): void;
  close(code?: number, reason?: string): void;
  // The client sets these and reads `data` of a message event and `code` and `reason` of a close
  // event. Typed `any`: a handler property typed with the narrower event would refuse the
  // browser's own WebSocket (and Node's `ws`), whose handlers take their full event classes.
  onmessage: ((ev: any) => void) | null;
  onclose: ((ev: any) => void) | null;
  onerror: ((ev: any) => void) | null;
}

export interface EventTargetLike {
  addEventListener(type: string, fn: (ev: any) => void): void;
  removeEventListener(type: string, fn: (ev: any) => void): void;
  visibilityState?: string;
}

export interface MessageMeta {
  /** The plain topic (never the signed form). */
  topic: string;
  /** The message's offset: opaque, increasing per topic. */
  offset: string | null;
}

export interface SubscribeOptions {
  /** The last offset the page already reflects, e.g. `livepush.latest_offset(topic)` rendered
   * into the page. Messages at or before it are not delivered. */
  since?: string | null;
  /** `since` is older than the history kept (or the page fell behind): refetch the state. A
   * reset that answers this subscription's own subscribe runs its onReset alone, not that of
   * another subscription of the topic. */
  onReset?: ((topic: string) => void) | null;
  /** After every (re)subscribe the server accepted; `offset` is the server's latest or null. */
  onSubscribed?: ((info: { topic: string; offset: string | null }) => void) | null;
  /** The server refused the topic; the subscription is dropped and never resent. `info.topic` is
   * the plain topic, never the signed form (the subscription's `topic` is the one given).
   * ("unavailable", the server's storage being briefly down or the app's authorize() failing or
   * not answering in time, is retried with backoff instead,
   * without calling onRefused; onError hears it once a run.) */
  onRefused?: ((
    reason: 'forbidden' | 'invalid_signature' | 'expired' | 'invalid_topic' | 'limit' | string,
    info: { topic: string },
  ) => void) | null;
}

export type SubscriptionState = 'pending' | 'active' | 'refused' | 'closed';

export declare class Subscription {
  /** The topic as given (plain or signed); resubscribes send exactly this. */
  readonly topic: string;
  /** The plain topic the server names in its frames. */
  readonly plainTopic: string;
  /** The last offset delivered, or the `since` it started from, or (a message topic subscribed
   * without `since`) the offset `subscribed` named; null when none (on a state topic, also once
   * `subscribed` named a version below the offset held, or no version). */
  readonly offset: string | null;
  /** `closed` after unsubscribe(), close() or `unauthorized`: nothing is delivered from then on. */
  readonly state: SubscriptionState;
  /** Stop delivery; the server is told once no other subscription of this client needs the topic. */
  unsubscribe(): void;
}

export declare class LivePush {
  /**
   * Connects at once. `url`: ws://, wss://, http(s):// (turned into ws(s)://) or a path
   * relative to the page.
   */
  constructor(url: string, options?: LivePushOptions | null);
  readonly status: LivePushStatus;
  /** The session announced in `hello`; null when anonymous or not connected. */
  readonly session: { subject: string } | null;
  /** Returns a function that removes the listener. */
  on(event: 'status', fn: (status: LivePushStatus, info: StatusInfo) => void): () => void;
  off(event: 'status', fn: (status: LivePushStatus, info: StatusInfo) => void): void;
  subscribe<T = any>(
    topic: string,
    onMessage: (data: T, meta: MessageMeta) => void,
    options?: SubscribeOptions | null,
  ): Subscription;
  /** Close for good: no reconnect, status `closed`. On a client already closed or `unauthorized` it changes nothing. */
  close(): void;
}

/** The default reconnect delay for retry number `tries` (1-based). */
export declare function defaultReconnectAfterMs(tries: number, random?: () => number): number;
/** The delay a close reason `retry=MS` asks for (capped at RETRY_MAX_MS), or null. */
export declare function retryDelayFromReason(reason: string): number | null;

/** Order two offsets of one topic ("17", "1700000000000-3"): negative, zero or positive. */
export declare function compareOffsets(a: string, b: string): number;

export interface ProgressView {
  kind: 'job' | 'group' | 'unknown';
  event: string;
  state: string | null;
  done: number | null;
  total: number | null;
  message: string | null;
  /** The job (succeeded, failed, cancelled) or group (finished; cancelled once none of its members is pending) reached a final state. */
  finished: boolean;
}

/** Read a `job:<id>` or `group:<id>` event into what a progress bar shows. */
export declare function describeProgress(data: unknown): ProgressView;

/** "done/total · state · message", leaving out what is unknown. */
export declare function progressText(view: ProgressView): string;

export interface BindProgressOptions {
  /** Once per arrival at a final state. */
  onFinish?: ((view: ProgressView, data: any) => void) | null;
  /** After every render. */
  onUpdate?: ((view: ProgressView, data: any) => void) | null;
  /** The version the page was rendered at: what the element shows stays until a newer one comes,
   * and a final `data-state` rendered with it stays through a refusal. */
  since?: string | null;
}

export interface ProgressBinding {
  readonly topic: string;
  readonly offset: string | null;
  unsubscribe(): void;
}

/**
 * Render a `<progress>` bar and a text line into `element` for a `job:<id>` or `group:<id>`
 * topic (plain or signed). Re-subscribes by itself after a `reset`. Binding an element again ends its
 * earlier binding. Throws a TypeError when `element` is not an element (null from getElementById)
 * or shows no children (a <progress> of the page's own: pass its container, e.g. a <div>),
 * or `topic` is not a job's or a group's (a workflow's is a graph of steps: subscribe to it).
 * On a closed client it throws as subscribe() does, before the element is touched.
 */
export declare function bindProgress(
  lp: LivePush,
  topic: string,
  element: Element,
  options?: BindProgressOptions | null,
): ProgressBinding;
