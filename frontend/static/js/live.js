// Live events over the websocket, with resume: the client remembers the last seq of each stream and,
// after a reconnect, subscribes again with it, so the server replays exactly what was missed.
// onStatus tells "connecting", "live" (the socket is open), "reconnecting" or "signed out".
// watch("jobs") follows a team feed: onNotice gets {"type": "notice", "feed": "jobs", "id", ...} when a job
// of one of your teams changes state, is created or annotated. Notices are not replayed: a page re-reads
// its rows when the socket comes back ("live" after "reconnecting").
// Subscriptions ask for batches ("batch": true): a frame {"type": "events", "stream", "events": [...]} carries
// several events of a stream (a busy job publishes thousands a second); a single-event frame is still
// understood. onEvent is called once per event either way.


export class LiveClient {
  constructor({ url, onEvent = () => {}, onStatus = () => {}, onError = () => {}, onSubscribed = () => {},
                onNotice = () => {}, onWatching = () => {} } = {}) {
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    this.url = url || `${proto}//${location.host}/ws/live/`;
    this.handlers = { onEvent, onStatus, onError, onSubscribed, onNotice, onWatching };
    this.lastSeq = new Map();   // stream -> last seq delivered to the page
    this.feeds = new Set();     // team feeds watched
    this.backoff = 500;
    this.closedByUser = false;
    this.connect();
  }

  connect() {
    this.handlers.onStatus("connecting");
    this.ws = new WebSocket(this.url);
    this.ws.addEventListener("open", () => {
      this.backoff = 500;
      this.handlers.onStatus("live");
      for (const [stream, seq] of this.lastSeq) this.send({ action: "subscribe", stream, last_seq: seq, batch: true });
      for (const feed of this.feeds) this.send({ action: "watch", feed });
    });
    this.ws.addEventListener("message", (msg) => this.receive(JSON.parse(msg.data)));
    this.ws.addEventListener("close", (ev) => {
      if (this.closedByUser) return;
      if (ev.code === 4401) { this.handlers.onStatus("signed out"); return; }
      this.handlers.onStatus("reconnecting");
      setTimeout(() => this.connect(), this.backoff);
      this.backoff = Math.min(this.backoff * 2, 10000);
    });
  }

  receive(m) {
    if (m.type === "subscribed") { this.handlers.onSubscribed(m); return; }
    if (m.type === "unsubscribed" || m.type === "unwatched") return;
    if (m.type === "watching") { this.handlers.onWatching(m); return; }
    if (m.type === "notice") { if (this.feeds.has(m.feed)) this.handlers.onNotice(m); return; }
    if (m.type === "error") { this.handlers.onError(m); return; }
    if (m.type === "events") { for (const e of m.events) this.receiveEvent(e); return; }
    this.receiveEvent(m);
  }

  receiveEvent(m) {
    if (!this.lastSeq.has(m.stream)) return;  // unsubscribed meanwhile
    if (m.seq <= this.lastSeq.get(m.stream)) return;
    this.lastSeq.set(m.stream, m.seq);
    this.handlers.onEvent(m);
  }

  send(obj) { if (this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(obj)); }

  subscribe(stream, lastSeq = 0) {
    if (!this.lastSeq.has(stream)) this.lastSeq.set(stream, lastSeq);
    this.send({ action: "subscribe", stream, last_seq: this.lastSeq.get(stream), batch: true });
  }

  unsubscribe(stream) { this.lastSeq.delete(stream); this.send({ action: "unsubscribe", stream }); }

  subscribed(stream) { return this.lastSeq.has(stream); }

  watch(feed) { this.feeds.add(feed); this.send({ action: "watch", feed }); }

  unwatch(feed) { this.feeds.delete(feed); this.send({ action: "unwatch", feed }); }

  close() { this.closedByUser = true; this.ws.close(); }
}
