//! The event bus (spec cluster-runtime.md "Packages: events"; reference-facts.md "Events").
//!
//! - An event has an id, a type, a time, the node that raised it and a JSON payload.
//! - `node.*` events are this node's own view (raised locally, never fanned out); the others
//!   (`file.*`, `replica.*`, `config.changed`, `job.*`, `app.*`) are batched to every member
//!   (`events/publish`, signed): an idle bus gathers for 200 ms, a busy one sends the next batch
//!   as soon as the last is acknowledged; a batch not acknowledged is resent after 2 s until it
//!   is, and de-duplicated by id on arrival: at-least-once delivery, once in the ring.
//! - Every node keeps the recent events in a bounded ring, each with a local sequence number,
//!   so a subscriber that reconnects resumes with `since=` and misses nothing still in the ring
//!   (beyond the reference, whose feed has no resume).
//!
//! Pure: the node feeds it time, ids (from its seeded RNG) and peers' batches, and carries out
//! the sends it asks for.

use crate::ids::NodeId;
use crate::time::Millis;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Events a node keeps for subscribers (oldest dropped first).
pub const RING_MAX: usize = 10_000;
/// Event ids remembered for de-duplication.
pub const SEEN_MAX: usize = 100_000;
/// Events waiting for one peer (oldest dropped first, counted, when a peer is away that long).
pub const OUTBOX_MAX: usize = 10_000;
/// Events in one `events/publish` batch.
pub const BATCH_MAX: usize = 1_000;
/// How long events gather before a batch goes out.
pub const BATCH_EVERY_MS: u64 = 200;
/// How long before an unacknowledged batch is sent again.
pub const RETRY_MS: u64 = 2_000;
/// Largest `app.*` payload (JSON bytes).
pub const APP_DATA_MAX_BYTES: usize = 64 * 1024;
/// How often `node.*` events are computed.
pub const NODE_EVENTS_EVERY_MS: u64 = 5_000;

/// The types a node raises or accepts (besides `app.*`).
pub const KNOWN_TYPES: &[&str] = &[
    "file.created",
    "file.removed",
    "file.renamed",
    "replica.verified",
    "replica.stale",
    "node.joined",
    "node.online",
    "node.offline",
    "node.left",
    "node.diskfull",
    "config.changed",
    "job.completed",
    "job.failed",
];

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// Wall time it was raised (ms).
    pub time: u64,
    /// The node that raised it.
    pub node: NodeId,
    #[serde(default)]
    pub data: Value,
    /// This node's sequence number for it (0 on the wire).
    #[serde(default)]
    pub seq: u64,
}

impl Event {
    /// Whether `kind` is fanned out to the cluster (everything but this node's own `node.*`).
    pub fn fans_out(kind: &str) -> bool {
        !kind.starts_with("node.")
    }
}

/// Why an event was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    #[error("only app.* events may be published (app.NAME: letters, digits, '.', '_', '-'; at most 128 bytes)")]
    NotApp,
    #[error("an event's data is at most 64 KiB of JSON")]
    TooLarge,
}

/// Check a user's `app.*` event before it is raised.
pub fn check_app(kind: &str, data: &Value) -> Result<(), EventError> {
    let name = kind.strip_prefix("app.").ok_or(EventError::NotApp)?;
    if name.is_empty() || kind.len() > 128 || !name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) {
        return Err(EventError::NotApp);
    }
    if serde_json::to_vec(data).map(|b| b.len()).unwrap_or(usize::MAX) > APP_DATA_MAX_BYTES {
        return Err(EventError::TooLarge);
    }
    Ok(())
}

/// Whether an event type matches a filter: `*` any run of characters, `?` one; no filter or an
/// empty one matches everything.
pub fn type_matches(filter: &str, kind: &str) -> bool {
    if filter.is_empty() {
        return true;
    }
    let (p, s): (Vec<char>, Vec<char>) = (filter.chars().collect(), kind.chars().collect());
    let (mut pi, mut si) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, si));
                pi += 1;
            }
            Some(c) if *c == '?' || *c == s[si] => {
                pi += 1;
                si += 1;
            }
            _ => match star {
                Some((sp, ss)) => {
                    pi = sp + 1;
                    si = ss + 1;
                    star = Some((sp, ss + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// One peer's pending events and the batch on its way.
#[derive(Clone, Debug, Default)]
struct Outbox {
    queue: VecDeque<Event>,
    /// Events of `queue`'s front in the batch sent, and when it may be sent again.
    in_flight: Option<(usize, Millis)>,
    /// When the next batch may go (batching, or the retry after a failure).
    next_at: Millis,
}

/// A batch to send to one peer.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    pub to: NodeId,
    pub events: Vec<Event>,
}

/// The body of `events/publish`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PublishBody {
    pub events: Vec<Event>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BusStats {
    pub raised: u64,
    pub received: u64,
    pub duplicates: u64,
    pub sent: u64,
    /// Events dropped from a peer's outbox while it was away too long.
    pub outbox_dropped: u64,
}

/// The bus of one node.
#[derive(Clone, Debug, Default)]
pub struct EventBus {
    ring: VecDeque<Event>,
    next_seq: u64,
    seen: BTreeSet<String>,
    seen_order: VecDeque<String>,
    outboxes: BTreeMap<NodeId, Outbox>,
    stats: BusStats,
}

impl EventBus {
    pub fn new() -> EventBus {
        EventBus { next_seq: 1, ..EventBus::default() }
    }

    /// Keep an event in the ring (a new sequence number) unless it was seen; false for a
    /// duplicate.
    fn keep(&mut self, mut e: Event) -> Option<Event> {
        if self.seen.contains(&e.id) {
            self.stats.duplicates += 1;
            return None;
        }
        self.seen.insert(e.id.clone());
        self.seen_order.push_back(e.id.clone());
        while self.seen_order.len() > SEEN_MAX {
            if let Some(old) = self.seen_order.pop_front() {
                self.seen.remove(&old);
            }
        }
        e.seq = self.next_seq.max(1);
        self.next_seq = e.seq + 1;
        self.ring.push_back(e.clone());
        while self.ring.len() > RING_MAX {
            self.ring.pop_front();
        }
        Some(e)
    }

    /// Raise an event here: kept, and queued for every peer when its type fans out.
    pub fn raise(&mut self, now: Millis, e: Event, peers: &[NodeId]) {
        self.stats.raised += 1;
        let fans = Event::fans_out(&e.kind);
        if let Some(kept) = self.keep(e) {
            if fans {
                self.queue(now, &kept, peers);
            }
        }
    }

    fn queue(&mut self, now: Millis, e: &Event, peers: &[NodeId]) {
        let wire = Event { seq: 0, ..e.clone() };
        for p in peers {
            let o = self.outboxes.entry(p.clone()).or_default();
            if o.queue.is_empty() && o.in_flight.is_none() {
                o.next_at = o.next_at.max(now.plus(BATCH_EVERY_MS));
            }
            o.queue.push_back(wire.clone());
            let sent = o.in_flight.map_or(0, |(n, _)| n);
            while o.queue.len() > OUTBOX_MAX && o.queue.len() > sent {
                // Drop the oldest not in the batch on its way.
                o.queue.remove(sent);
                self.stats.outbox_dropped += 1;
            }
        }
    }

    /// A peer's batch arrived: keep what is new (a fanned-out type raised elsewhere). Answers
    /// how many were new.
    pub fn receive(&mut self, _from: &NodeId, events: Vec<Event>) -> usize {
        let mut new = 0;
        for e in events {
            if !Event::fans_out(&e.kind) {
                continue;
            }
            self.stats.received += 1;
            if self.keep(Event { seq: 0, ..e }).is_some() {
                new += 1;
            }
        }
        new
    }

    /// Forget a member (removed or left): its outbox goes.
    pub fn forget_peer(&mut self, peer: &NodeId) {
        self.outboxes.remove(peer);
    }

    /// The batches due now (one per peer at most: the next only after this one is answered).
    pub fn due(&mut self, now: Millis) -> Vec<Batch> {
        let mut out = Vec::new();
        for (peer, o) in self.outboxes.iter_mut() {
            if o.queue.is_empty() || now < o.next_at {
                continue;
            }
            if let Some((_, retry_at)) = o.in_flight {
                if now < retry_at {
                    continue;
                }
            }
            let n = o.queue.len().min(BATCH_MAX);
            o.in_flight = Some((n, now.plus(RETRY_MS * 5)));
            self.stats.sent += n as u64;
            out.push(Batch { to: peer.clone(), events: o.queue.iter().take(n).cloned().collect() });
        }
        out
    }

    /// The answer to the batch sent to `peer`: delivered (those events leave its outbox) or
    /// not (sent again after [`RETRY_MS`]).
    pub fn sent(&mut self, now: Millis, peer: &NodeId, delivered: bool) {
        let Some(o) = self.outboxes.get_mut(peer) else { return };
        let Some((n, _)) = o.in_flight.take() else { return };
        if delivered {
            // What gathered while this batch was on its way goes at once: under load batches
            // follow each other back to back, and the 200 ms wait only gathers an idle bus's.
            o.queue.drain(..n.min(o.queue.len()));
            o.next_at = now;
        } else {
            o.next_at = now.plus(RETRY_MS);
        }
    }

    /// When a batch is next due (`None`: nothing waits).
    pub fn poll_timeout(&self) -> Option<Millis> {
        self.outboxes
            .values()
            .filter(|o| !o.queue.is_empty())
            .map(|o| match o.in_flight {
                Some((_, retry_at)) => retry_at,
                None => o.next_at,
            })
            .min()
    }

    /// Events after sequence `since` whose type matches `filter`, oldest first, at most
    /// `limit`; and the newest sequence number in the ring.
    pub fn since(&self, since: u64, filter: &str, limit: usize) -> (Vec<Event>, u64) {
        let start = self.ring.partition_point(|e| e.seq <= since);
        let events =
            self.ring.iter().skip(start).filter(|e| type_matches(filter, &e.kind)).take(limit).cloned().collect();
        (events, self.last_seq())
    }

    /// The oldest sequence number still in the ring (0: empty).
    pub fn first_seq(&self) -> u64 {
        self.ring.front().map_or(0, |e| e.seq)
    }

    pub fn last_seq(&self) -> u64 {
        self.ring.back().map_or(0, |e| e.seq)
    }

    pub fn stats(&self) -> &BusStats {
        &self.stats
    }

    /// Events waiting for each peer.
    pub fn backlog(&self) -> BTreeMap<NodeId, usize> {
        self.outboxes.iter().map(|(p, o)| (p.clone(), o.queue.len())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(id: &str, kind: &str) -> Event {
        Event { id: id.into(), kind: kind.into(), time: 1, node: NodeId::new("a"), data: json!({}), seq: 0 }
    }

    fn peers() -> Vec<NodeId> {
        vec![NodeId::new("b"), NodeId::new("c")]
    }

    #[test]
    fn type_filters_are_globs() {
        assert!(type_matches("file.*", "file.created"));
        assert!(!type_matches("file.*", "node.online"));
        assert!(type_matches("*", "app.x"));
        assert!(type_matches("", "app.x"));
        assert!(type_matches("app.?", "app.x"));
        assert!(!type_matches("app.?", "app.xy"));
        assert!(type_matches("*.stale", "replica.stale"));
        assert!(type_matches("a*b*c", "aXbYbZc"));
        assert!(!type_matches("a*b*c", "aXbYbZ"));
    }

    #[test]
    fn only_app_events_with_small_data_are_published() {
        assert_eq!(check_app("app.build-done", &json!({"ok": true})), Ok(()));
        assert_eq!(check_app("file.created", &json!({})), Err(EventError::NotApp));
        assert_eq!(check_app("app.", &json!({})), Err(EventError::NotApp));
        assert_eq!(check_app("app.a b", &json!({})), Err(EventError::NotApp));
        let big = json!("x".repeat(APP_DATA_MAX_BYTES));
        assert_eq!(check_app("app.big", &big), Err(EventError::TooLarge));
    }

    /// Raised events are batched after 200 ms, one batch per peer; an unanswered or failed batch
    /// is sent again (2 s); a delivered one leaves the outbox; node.* never fans out.
    #[test]
    fn batches_go_after_200_ms_and_are_retried_until_delivered() {
        let mut b = EventBus::new();
        b.raise(Millis(0), ev("1", "file.created"), &peers());
        b.raise(Millis(50), ev("2", "node.online"), &peers());
        b.raise(Millis(100), ev("3", "app.x"), &peers());
        assert_eq!(b.poll_timeout(), Some(Millis(200)));
        assert!(b.due(Millis(199)).is_empty());
        let batches = b.due(Millis(200));
        assert_eq!(batches.len(), 2);
        assert_eq!(batches[0].events.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), ["1", "3"]);
        assert!(b.due(Millis(300)).is_empty(), "one batch on its way per peer");
        b.sent(Millis(400), &NodeId::new("b"), true);
        b.sent(Millis(400), &NodeId::new("c"), false);
        assert!(b.due(Millis(500)).is_empty());
        let again = b.due(Millis(2_400));
        assert_eq!((again.len(), again[0].to.as_str()), (1, "c"));
        b.sent(Millis(2_500), &NodeId::new("c"), true);
        assert_eq!(b.poll_timeout(), None);
        assert_eq!(b.since(0, "", 10).0.len(), 3, "node.* is kept here");
    }

    #[test]
    fn a_batch_received_twice_is_kept_once() {
        let mut b = EventBus::new();
        let from = NodeId::new("a");
        assert_eq!(b.receive(&from, vec![ev("1", "app.x"), ev("2", "file.created")]), 2);
        assert_eq!(b.receive(&from, vec![ev("1", "app.x"), ev("2", "file.created")]), 0);
        assert_eq!(b.receive(&from, vec![ev("3", "node.online")]), 0, "another node's node.* is not ours");
        assert_eq!(b.since(0, "", 10).0.len(), 2);
        assert_eq!(b.stats().duplicates, 2);
    }

    /// A subscriber resumes after the last sequence it saw and misses nothing still in the ring;
    /// the ring is bounded.
    #[test]
    fn since_resumes_and_the_ring_is_bounded() {
        let mut b = EventBus::new();
        for i in 0..(RING_MAX + 10) {
            b.raise(Millis(i as u64), ev(&i.to_string(), "node.x"), &[]);
        }
        assert_eq!(b.first_seq(), 11);
        let (got, last) = b.since(RING_MAX as u64, "", 100);
        assert_eq!(got.iter().map(|e| e.seq).collect::<Vec<_>>(), (RING_MAX as u64 + 1..=last).collect::<Vec<_>>());
        assert_eq!(b.since(5, "", 1).0[0].seq, 11, "what fell out of the ring is gone");
    }

    #[test]
    fn an_outbox_is_bounded_while_a_peer_is_away() {
        let mut b = EventBus::new();
        let p = vec![NodeId::new("b")];
        for i in 0..(OUTBOX_MAX + 5) {
            b.raise(Millis(0), ev(&i.to_string(), "app.x"), &p);
        }
        assert_eq!(b.backlog()[&p[0]], OUTBOX_MAX);
        assert_eq!(b.stats().outbox_dropped, 5);
    }
}
