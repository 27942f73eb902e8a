// Test doubles for the livepush client: a fake clock, a fake WebSocket, a seeded random and a
// tiny DOM. Kept outside test/ so `node --test` does not run this file as a test of its own.

import { LivePush } from '../livepush.js';

/** Timers that run only when the test advances time, in due order. */
export class FakeClock {
  constructor(start = 1_000_000) {
    this.t = start;
    this.seq = 0;
    /** @type {Map<number, {id: number, at: number, fn: () => void}>} */
    this.timers = new Map();
    this.now = () => this.t;
    this.setTimeout = (fn, ms) => {
      const id = ++this.seq;
      this.timers.set(id, { id, at: this.t + Math.max(0, ms), fn });
      return id;
    };
    this.clearTimeout = (id) => {
      this.timers.delete(id);
    };
  }

  /** Move time forward by ms, running every timer that falls due on the way. */
  advance(ms) {
    const end = this.t + ms;
    for (;;) {
      let next = null;
      for (const tm of this.timers.values()) {
        if (tm.at <= end && (!next || tm.at < next.at || (tm.at === next.at && tm.id < next.id))) next = tm;
      }
      if (!next) break;
      this.timers.delete(next.id);
      this.t = Math.max(this.t, next.at); // an overdue timer runs late, never in the past
      next.fn();
    }
    this.t = end;
  }

  /**
   * Move time forward by ms without running timers on the way, then run every overdue one, in due
   * order, all late: what a browser does to a hidden tab (it holds timers back to about once a
   * minute) or to a laptop that slept.
   */
  late(ms) {
    this.t += ms;
    for (;;) {
      let next = null;
      for (const tm of this.timers.values()) {
        if (tm.at <= this.t && (!next || tm.at < next.at || (tm.at === next.at && tm.id < next.id))) next = tm;
      }
      if (!next) break;
      this.timers.delete(next.id);
      next.fn();
    }
  }

  /**
   * The machine slept for ms: the wall clock (now) moves on, but pending timers resume where they
   * were, with the time they had left, as browsers' timers do after a sleep.
   */
  sleep(ms) {
    this.t += ms;
    for (const tm of this.timers.values()) tm.at += ms;
  }

  /** Milliseconds until each pending timer, sorted. */
  pending() {
    return [...this.timers.values()].map((tm) => tm.at - this.t).sort((a, b) => a - b);
  }
}

/** A WebSocket class whose instances the test drives from the server side. */
export function fakeWebSocketClass() {
  /** @type {FakeSocket[]} */
  const sockets = [];
  class FakeSocket {
    constructor(url, protocols) {
      this.url = url;
      this.protocols = protocols;
      this.readyState = 0;
      /** @type {any[]} frames the client sent, parsed */
      this.sent = [];
      this.closedByClient = null;
      this.onmessage = null;
      this.onclose = null;
      this.onerror = null;
      sockets.push(this);
    }

    send(text) {
      if (this.readyState !== 1) throw new Error('InvalidStateError: not open');
      this.sent.push(JSON.parse(text));
    }

    close(code, reason) {
      this.readyState = 3;
      this.closedByClient = { code, reason };
    }

    // -- the server's side --

    /** Complete the handshake and send hello. */
    hello({ heartbeat = 30, session = null } = {}) {
      this.readyState = 1;
      this.receive({ op: 'hello', session, heartbeat });
    }

    receive(frame) {
      this.onmessage?.({ data: typeof frame === 'string' ? frame : JSON.stringify(frame) });
    }

    serverClose(code, reason = '') {
      this.readyState = 3;
      this.onclose?.({ code, reason });
    }

    /** Frames of one op the client sent. */
    frames(op) {
      return this.sent.filter((f) => f.op === op);
    }

    /** Answer every subscribe frame not yet answered with `subscribed`. */
    acceptSubscribes() {
      this._answered ??= new Set();
      for (const f of this.frames('subscribe')) {
        if (this._answered.has(f.ref)) continue;
        this._answered.add(f.ref);
        this.receive({ op: 'subscribed', ref: f.ref, topic: f.topic.split('~')[0], offset: null });
      }
    }
  }
  return { WebSocket: FakeSocket, sockets };
}

/** Deterministic uniform [0, 1) numbers (mulberry32). */
export function seededRandom(seed = 42) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A minimal EventTarget for document/window. */
export class FakeTarget {
  constructor(props = {}) {
    Object.assign(this, props);
    this.listeners = new Map();
  }
  addEventListener(type, fn) {
    if (!this.listeners.has(type)) this.listeners.set(type, new Set());
    this.listeners.get(type).add(fn);
  }
  removeEventListener(type, fn) {
    this.listeners.get(type)?.delete(fn);
  }
  dispatch(type) {
    for (const fn of [...(this.listeners.get(type) ?? [])]) fn({ type });
  }
}

/** A LivePush wired to fakes, plus handles on them. */
export function harness({ url = 'ws://push.test/', ...options } = {}) {
  const clock = new FakeClock();
  const { WebSocket, sockets } = fakeWebSocketClass();
  const document = new FakeTarget({ visibilityState: 'visible' });
  const window = new FakeTarget();
  const errors = [];
  const lp = new LivePush(url, {
    WebSocket,
    now: clock.now,
    setTimeout: clock.setTimeout,
    clearTimeout: clock.clearTimeout,
    random: seededRandom(7),
    document,
    window,
    onError: (e) => errors.push(e),
    ...options,
  });
  const statuses = [];
  lp.on('status', (status, info) => statuses.push({ status, ...info }));
  return { lp, clock, sockets, last: () => sockets[sockets.length - 1], document, window, errors, statuses };
}

/** A tiny DOM element: children, attributes, textContent, ownerDocument.createElement. */
export class FakeElement {
  constructor(tag = 'div', ownerDocument = null) {
    this.tagName = tag.toUpperCase();
    this.children = [];
    this.attributes = {};
    this.className = '';
    this._text = '';
    this.ownerDocument = ownerDocument ?? { createElement: (t) => new FakeElement(t, this.ownerDocument) };
  }
  appendChild(child) {
    this.children.push(child);
    return child;
  }
  replaceChildren(...nodes) {
    this.children = nodes;
    this._text = '';
  }
  get textContent() {
    return this._text + this.children.map((c) => c.textContent).join('');
  }
  set textContent(v) {
    this.children = [];
    this._text = String(v);
  }
  setAttribute(name, value) {
    this.attributes[name] = String(value);
  }
  removeAttribute(name) {
    delete this.attributes[name];
  }
  getAttribute(name) {
    return name in this.attributes ? this.attributes[name] : null;
  }
  get innerHTML() {
    throw new Error('innerHTML must not be used');
  }
  set innerHTML(_v) {
    throw new Error('innerHTML must not be used');
  }
}
