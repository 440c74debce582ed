//! The metadata store of one node: records, the leader lease and the replicated log
//! (spec: "Metadata store (ACMS)"; reference-facts.md "Lease", "Log entry").
//!
//! - `submit` applies a change locally at once. On the leader it is appended to the log (next
//!   sequence number) and pushed to the peers (`meta/append`, one request in flight per peer,
//!   so appends batch themselves under load). On a follower it is queued as pending (persisted)
//!   and sent to the leader (`meta/submit`), retried every 15 s or as soon as a leader is known;
//!   it leaves the queue when the leader has appended it. The leader's answer carries the
//!   entries that took the submitter's records when they are all its own and no append to it
//!   is in flight (read as an append: the writer needs no separate one). A record submitted
//!   with [`Meta::submit_lingering`] (an audit entry) waits up to `linger_ms` for another
//!   change to travel with.
//! - Records merge per register, so applying entries in any order, twice, or from a snapshot is
//!   safe; the log's numbering only serves catch-up. A follower that sees a gap reads the
//!   missing range with `meta/log?after=N` (pages of 500, only that range is read); a compacted
//!   range (410) or a leader of another term falls back to `meta/snapshot`, which carries
//!   tombstones. After a snapshot the follower sends back whatever it holds that the snapshot
//!   lacks, so changes acknowledged on the losing side of a partition are not lost.
//! - Every lease push carries the leader's last sequence number and state digest; a follower
//!   that is caught up, has nothing pending and still differs exchanges snapshots (anti-entropy).
//! - Compaction every 1,000 appends keeps the newest 10,000 entries. Tombstones are purged after
//!   7 days on every node; each purged key is persisted with its tombstone's version
//!   ([`MetaPersist::PutPurged`]) and put back by [`Meta::restore`], so an older copy from a
//!   stale peer is refused after a restart too.
//! - One bad entry never blocks the log. Every record kept or sent keeps [`Record::shape_ok`]
//!   (bounded JSON depth and size), so every stored or sent form decodes by construction. Entries
//!   and submitted records from a peer are still decoded one by one: an entry this build cannot
//!   read, or a record out of bounds, is refused on its own (counted in `status`, and reported as
//!   [`MetaOutput::Refused`] for the shell to log) and the log goes on past it; a peer that
//!   refuses an append or a submit is reported the same way. A stored record or pending submit
//!   out of bounds (written by an older build) is dropped at restore, reported, never fatal.

mod replies;
mod serve;

use crate::answer::{ErrorKind, PeerAnswer, Reply};
use crate::hlc::{Hlc, Version};
use crate::ids::{LogIndex, NodeId, Term};
use crate::meta::lease::{Candidate, Lease, LeaseAction, LeaseConfig, LeaseState, PushVerdict};
use crate::meta::log::{Entry, LogMeta, MetaPersist, Pending};
use crate::meta::records::{Record, RecordKey, RecordKind, RecordSet};
use crate::meta::state::MetaState;
use crate::time::Millis;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Default of [`MetaConfig::append_gap_ms`].
pub const APPEND_GAP_MS: u64 = 5;

#[derive(Clone, Debug, PartialEq)]
pub struct MetaConfig {
    pub lease: LeaseConfig,
    pub page_max: usize,
    pub compact_every: u64,
    pub keep_entries: u64,
    pub submit_retry_ms: u64,
    pub request_timeout_ms: u64,
    pub anti_entropy_every_ms: u64,
    /// Records per snapshot page (a snapshot of a big namespace is read in pages).
    pub snapshot_page_max: usize,
    pub purge_every_ms: u64,
    /// Most records sent in one submit or append.
    pub batch_max: usize,
    /// Most submits in flight to the leader at once (issue 18). With more than one, a write
    /// need not wait behind the submit of another; records are last-writer-wins by version, so
    /// the order the leader takes them in does not matter. The default is 1: from 16 clients a
    /// window of 2 sent 65 % more submits for the same writes and cost more CPU per write
    /// (BENCHMARKS.md, issue 18, twelfth session), and audit entries, which a wider window was
    /// first meant to let pass, linger and travel with the next change instead.
    pub submit_window: usize,
    /// How long a record queued with [`Meta::submit_lingering`] (an audit entry) may wait for
    /// another change to travel with (issue 18): one request then carries both, instead of a
    /// submit and two appends each.
    pub linger_ms: u64,
    /// How long a follower holding entries beyond a hole in its log waits for the hole to fill
    /// by itself before it reads the range from the leader (issue 18): the answers to several
    /// submits in flight, each carrying entries, can arrive in any order.
    pub reorder_wait_ms: u64,
    /// Least time between two appends to one peer when nothing in the range waits on that
    /// peer (issue 18): entries that came in followers' submits are already held by two nodes
    /// (the submitter and this leader), so no acknowledgement waits for a third; sending them
    /// a moment later in one bigger append costs the peer and this leader one request instead
    /// of several. Entries this leader made itself go at once (its own acknowledgements wait
    /// on a follower). 0 sends every append as soon as the previous one is answered.
    pub append_gap_ms: u64,
}

impl Default for MetaConfig {
    fn default() -> Self {
        MetaConfig {
            lease: LeaseConfig::default(),
            page_max: 500,
            compact_every: 1_000,
            keep_entries: 10_000,
            submit_retry_ms: 15_000,
            request_timeout_ms: 20_000,
            anti_entropy_every_ms: 30_000,
            snapshot_page_max: 2_000,
            purge_every_ms: 60_000,
            batch_max: 500,
            submit_window: 1,
            linger_ms: 20,
            reorder_wait_ms: 100,
            append_gap_ms: APPEND_GAP_MS,
        }
    }
}

/// Why a request was sent, so its answer can be routed back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetaPurpose {
    LeasePush,
    Append {
        through: LogIndex,
    },
    Submit {
        ids: Vec<u64>,
    },
    CatchUp,
    /// One page of a snapshot, after the cursor (hex of `kind\nkey`), from the start with `None`.
    Snapshot {
        after: Option<String>,
    },
    /// A leader asks what a member holds at the paths its own queued removes and moves were
    /// decided from ([`Meta::own_based_checked`]).
    Based,
}

#[derive(Clone, Debug, PartialEq)]
// Made once and moved once to the node's outputs: boxing a record in it would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum MetaOutput {
    Send {
        to: NodeId,
        method: &'static str,
        target: String,
        body: Vec<u8>,
        purpose: MetaPurpose,
    },
    Persist(MetaPersist),
    /// Something was refused: an entry or record from `from` (or stored on disk, `from: None`),
    /// or one of ours by `from`. The log went on past it; the shell logs this.
    Refused {
        from: Option<NodeId>,
        what: String,
        why: String,
    },
}

/// `meta status`: the lease, the log and the records as this node holds them.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MetaStatus {
    pub leader: Option<NodeId>,
    pub term: Term,
    pub is_leader: bool,
    pub last_seq: LogIndex,
    pub applied: LogIndex,
    /// Records submitted here and not yet acknowledged by the leader.
    pub pending: usize,
    pub records: usize,
    pub log_entries: usize,
    pub compacted_through: LogIndex,
    pub digest: String,
    pub snapshots_adopted: u64,
    /// Entries and records refused as out of bounds, and the last reason.
    pub refused: u64,
    pub last_refusal: Option<String>,
    /// Removes and moves this node refused, as leader, because the record they were decided
    /// from had changed (the deciding node's records lagged): each a conflict its client saw.
    pub based_refused: u64,
    /// This node's records may hold half of a decision ([`Meta::records_settling`]: a snapshot
    /// being adopted, or the log following another numbering than the lease holder's): until a
    /// snapshot settles it, the node renames and deletes no copies. Lasting, it says the node
    /// gets no snapshot from the leader.
    pub records_settling: bool,
    /// Leader: its records may lag another member's ([`Meta::leader_may_lag`]: it leads alone,
    /// or a member it reaches has not answered it within a lease period), so its own removes
    /// and moves wait for a check against the others' records before they go into its log.
    pub leader_may_lag: bool,
}

/// A leader's check of its own queued removes and moves ([`Meta::own_based_checked`]).
#[derive(Debug)]
struct BasedCheck {
    /// What was asked: each path with the version its changes were decided from.
    asked: BTreeSet<(String, Version)>,
    /// The members asked that have not answered yet.
    waiting: BTreeSet<NodeId>,
    /// The members whose ask failed (no answer came): asked again in a later round.
    failed: BTreeSet<NodeId>,
    /// The answers are waited for until then.
    due: Millis,
}

/// This leader's own removes and moves waiting for their check, by path and version, with what
/// each was decided from ([`Meta::unchecked_own`]).
pub(super) type UncheckedOwn<'a> = BTreeMap<(&'a str, &'a Version), &'a crate::meta::records::BasedOn>;

/// See [`Meta::write_mark`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteMark {
    /// Pending submits numbered below this were written before the mark.
    pending_before: u64,
    /// The log's end when the mark was taken, and whether this node led then.
    seq: LogIndex,
    led: bool,
    /// The term of the numbering `seq` counts in (the lease the log follows). Once the log
    /// follows another (a snapshot adopted from a new leader, the lease taken again), numbers
    /// of the old one say nothing about what peers hold.
    term: Option<Term>,
}

/// A JSON answer to a peer (the node's [`Reply`]).
pub type MetaReply = Reply;

/// Most bytes of records in one submit or append (well under the 64 MiB request limit).
pub const BATCH_MAX_BYTES: usize = 8 * 1024 * 1024;

/// Most paths one `meta/based` check names ([`Meta::own_based_checked`]).
pub const BASED_ASK_MAX: usize = 100_000;

/// How soon a submitter sends again a submit the leader answered `own_check_pending`
/// ([`Meta::answer_submit`]): the leader's check of its own removes and moves takes a round
/// trip to each member it reaches.
pub const OWN_CHECK_RETRY_MS: u64 = 500;

/// How many files kept over a tombstone a leader remembers ([`Meta::kept_recently`]).
const KEPT_RECENTLY_MAX: usize = 4096;

/// Where the changes between two write marks stand ([`Meta::mark_held`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MarkState {
    /// Another node holds them (or no other member exists).
    Held,
    /// Not yet.
    Waiting,
    /// Numbered under another term than the log's now: never counted held.
    Never,
}

/// How many of its own refused pending ids a submitter remembers (far more than the writes an
/// acknowledgement waits on at once).
const REFUSED_OWN_MAX: usize = 4096;

/// At most `count` items, and no more than [`BATCH_MAX_BYTES`] of records (always at least one).
pub(super) fn take_bounded<'a, T: 'a>(
    items: impl Iterator<Item = T>,
    count: usize,
    record: impl Fn(&T) -> &Record,
) -> Vec<T> {
    let mut out = Vec::new();
    let mut bytes = 0usize;
    for item in items.take(count) {
        let len = serde_json::to_vec(record(&item)).map(|b| b.len()).unwrap_or(0);
        if !out.is_empty() && bytes + len > BATCH_MAX_BYTES {
            break;
        }
        bytes += len;
        out.push(item);
    }
    out
}

/// Where a batch of the first `n` of `records` must end so that it does not split the records
/// of one decision (consecutive file records with the same `BasedOn`): before the group the
/// batch's last record belongs to, when the record after it continues that group. `n` when no
/// group is split, or when a group alone fills the batch.
fn decision_cut<'r>(based: impl Iterator<Item = Option<&'r crate::meta::records::BasedOn>>, n: usize) -> usize {
    let head: Vec<Option<&crate::meta::records::BasedOn>> = based.take(n + 1).collect();
    let (Some(Some(last)), Some(Some(next))) = (n.checked_sub(1).and_then(|i| head.get(i)), head.get(n)) else {
        return n;
    };
    if last != next {
        return n;
    }
    let start = head[..n].iter().rposition(|b| b.as_ref() != Some(last)).map_or(0, |i| i + 1);
    if start == 0 {
        n
    } else {
        start
    }
}

/// A JSON body `{HEAD"KEY":[item,item,...]}` holding as many of `items` as `count` and
/// [`BATCH_MAX_BYTES`] of their JSON allow (always at least one), each serialised once, straight
/// into the body (no size pass, no clone). `head` is the JSON of the fields before the list,
/// each followed by a comma (`"lease":{..},` say), or empty. Returns the body and how many
/// items it holds.
pub(super) fn json_batch<T: Serialize>(
    head: &str,
    key: &str,
    items: impl Iterator<Item = T>,
    count: usize,
) -> (Vec<u8>, usize) {
    let mut out = Vec::with_capacity(1024);
    out.push(b'{');
    out.extend_from_slice(head.as_bytes());
    out.push(b'"');
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\":[");
    let (mut n, mut bytes) = (0usize, 0usize);
    for item in items.take(count) {
        let start = out.len();
        if n > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut out, &item).expect("serialise");
        let len = out.len() - start;
        if n > 0 && bytes + len > BATCH_MAX_BYTES {
            out.truncate(start);
            break;
        }
        bytes += len;
        n += 1;
    }
    out.extend_from_slice(b"]}");
    (out, n)
}

/// A record whose every version is within reach of this node's clock (see [`Hlc::acceptable`]).
pub(super) fn believable(r: &Record, hlc: &Hlc) -> bool {
    r.shape_ok() && r.versions().into_iter().all(|v| hlc.acceptable(v))
}

/// An answer of `kind` (`None`: carried out) with its body.
pub(super) fn reply(refused: Option<ErrorKind>, body: Value) -> MetaReply {
    MetaReply { refused, body }
}

pub(super) fn bad(msg: impl Into<String>) -> MetaReply {
    reply(Some(ErrorKind::Invalid), json!({"error": {"code": "bad_body", "message": msg.into()}}))
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct LeaseBody {
    lease: Lease,
    #[serde(default)]
    last_seq: LogIndex,
    #[serde(default)]
    digest: String,
}

/// An append body shared by the peers sent one range, with this peer's `heldThrough` added
/// (the body is one JSON object: its closing brace is replaced).
pub(super) fn with_held_through(mut body: Vec<u8>, held: LogIndex) -> Vec<u8> {
    if body.last() == Some(&b'}') {
        body.pop();
        body.extend_from_slice(format!(",\"heldThrough\":{}}}", held.0).as_bytes());
    }
    body
}

/// An append as sent (`E` = [`Entry`]) and as read (`E` = raw JSON, each entry decoded on its
/// own by [`read_entries`]).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct AppendBody<E> {
    lease: Lease,
    entries: Vec<E>,
    last_seq: LogIndex,
    /// How far the leader holds this follower confirmed: the follower's answer names the
    /// positions after it that it passed over (`passedOver`). 0 from a leader of an earlier
    /// version (the follower then names all it still knows of).
    #[serde(default)]
    held_through: LogIndex,
}

/// A submit as sent (`R` = [`Record`]) and as read (raw JSON, each record decoded on its own).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SubmitBody<R> {
    records: Vec<R>,
    /// The submitter can rebuild the entries that take its records from their sequence
    /// numbers alone ([`Meta::answer_submit`]): `taken` instead of `append` in the answer.
    #[serde(default)]
    seqs: bool,
    /// Records sent back after a snapshot: what each was decided from (it travels without, so
    /// the leader does not check it again; stored with the record).
    #[serde(default)]
    sent_back: Vec<SentBack>,
}

/// One decision (a move, a remove) among a submit's records sent back after a snapshot: the
/// file, what it was decided from, and the newest version among its records in that submit.
pub(super) struct SentBackDecision {
    id: crate::ids::FileId,
    based: crate::meta::records::BasedOn,
    newest: crate::hlc::Version,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct SentBack {
    pub(super) index: usize,
    pub(super) based_on: crate::meta::records::BasedOn,
}

/// One page of `meta/log` as sent (`E` = [`Entry`]) and as read (raw JSON).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct LogPage<E> {
    entries: Vec<E>,
    last_seq: LogIndex,
    term: Term,
    #[serde(default)]
    holder: Option<NodeId>,
}

/// One page of a snapshot: `{files, volumes, policies, jobs, settings, lastSeq, term, holder,
/// next}`; `next` is the cursor of the following page, absent on the last.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Snapshot {
    #[serde(flatten)]
    records: RecordSet,
    /// Whatever else a page carries: records of kinds a newer version keeps, which this build
    /// cannot read (their positions are then not held here: [`LogMeta::unread_through`]).
    #[serde(flatten, skip_serializing)]
    unknown: BTreeMap<String, Value>,
    last_seq: LogIndex,
    term: Term,
    #[serde(default)]
    holder: Option<NodeId>,
    #[serde(default)]
    next: Option<String>,
}

/// An entry from a peer, decoded on its own.
pub(super) enum PeerEntry {
    Read(Box<Entry>),
    /// This build cannot read it (or its record is out of bounds); `seq` when that much is
    /// readable.
    Refused {
        seq: Option<LogIndex>,
        why: String,
    },
}

/// Decode each raw entry on its own, so one that cannot be read does not cost the others.
/// (serde_json skips over a raw value without recursion, so no depth stops the outer parse.)
pub(super) fn read_entries(raw: Vec<Box<RawValue>>) -> Vec<PeerEntry> {
    #[derive(Deserialize)]
    struct SeqOnly {
        seq: LogIndex,
    }
    raw.into_iter()
        .map(|r| match serde_json::from_str::<Entry>(r.get()) {
            Ok(e) => match e.record.shape_error() {
                None => PeerEntry::Read(Box::new(e)),
                Some(why) => PeerEntry::Refused { seq: Some(e.seq), why: why.to_string() },
            },
            Err(err) => PeerEntry::Refused {
                seq: serde_json::from_str::<SeqOnly>(r.get()).ok().map(|s| s.seq),
                why: format!("unreadable entry: {err}"),
            },
        })
        .collect()
}

/// The error message of a peer's JSON answer, for a report.
pub(super) fn answer_message(body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct Answer {
        error: Option<ErrorBody>,
    }
    #[derive(Deserialize)]
    struct ErrorBody {
        message: Option<String>,
    }
    match serde_json::from_slice::<Answer>(body) {
        Ok(Answer { error: Some(ErrorBody { message: Some(m) }) }) => m,
        _ => String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
    }
}

/// A snapshot being read page by page: the log position it stands for (from its first page).
#[derive(Clone, Debug)]
pub(super) struct SnapshotProgress {
    from: NodeId,
    last_seq: LogIndex,
    term: Term,
    holder: Option<NodeId>,
    /// A page carried records this build cannot read.
    unread: bool,
}

impl Snapshot {
    /// Whether the page carries records this build cannot read (a kind it does not know).
    fn has_unknown(&self) -> bool {
        self.unknown.values().any(|v| match v {
            Value::Array(a) => !a.is_empty(),
            Value::Object(o) => !o.is_empty(),
            _ => false,
        })
    }
}

pub(super) fn encode_cursor(k: &RecordKey) -> String {
    hex::encode(format!("{}\n{}", k.0.as_str(), k.1))
}

pub(super) fn decode_cursor(c: &str) -> Option<RecordKey> {
    let bytes = hex::decode(c).ok()?;
    let text = String::from_utf8(bytes).ok()?;
    let (kind, key) = text.split_once('\n')?;
    let kind: RecordKind = serde_json::from_value(Value::String(kind.to_string())).ok()?;
    Some((kind, key.to_string()))
}

/// A fingerprint of what decides whether this node's changes are held by another node
/// ([`Meta::held_progress`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldProgress {
    born: Millis,
    pending_taken: u64,
    self_appended: Option<u64>,
    term: Option<Term>,
    leads: bool,
    members: usize,
    held: u64,
    compacted_through: LogIndex,
}

#[derive(Clone, Debug, Default)]
pub(super) struct PeerAppend {
    /// When the append in flight was sent.
    in_flight: Option<Millis>,
    /// Entries up to here were sent (or are in flight).
    sent_through: LogIndex,
    /// The peer said it holds entries up to here.
    acked_through: LogIndex,
    /// The peer's answers to our appends under this lease reached here: set only from them,
    /// never assumed. What an acknowledgement may rely on is this less the positions below
    /// ([`PeerAppend::holds`]).
    held_through: LogIndex,
    /// Positions up to `held_through` the peer said it passed over (an entry its build could
    /// not read: a record kind from a newer version): it does not hold those, whatever its
    /// log's end says. The newest [`PASSED_OVER_MAX`].
    passed_over: BTreeSet<LogIndex>,
    /// The newest position dropped from `passed_over` to keep it bounded: whether the peer
    /// holds an entry at or below it is not known.
    passed_over_forgotten: LogIndex,
    /// When the last append to this peer was sent (the append gap counts from it).
    last_sent: Option<Millis>,
    /// An append held back by the gap is due then.
    gap_due: Option<Millis>,
}

/// Most passed-over positions a leader remembers per peer ([`PeerAppend`]).
const PASSED_OVER_MAX: usize = 4096;

impl PeerAppend {
    /// Whether the peer is confirmed to hold every entry numbered `first..=last` that `counts`
    /// (this leader's own, for an acknowledgement): its answers reach `last`, and it passed
    /// over none of them (another node's entry it could not read does not hold this leader's
    /// acknowledgements back).
    fn holds(&self, first: LogIndex, last: LogIndex, counts: impl Fn(LogIndex) -> bool) -> bool {
        self.held_through >= last
            && first > self.passed_over_forgotten
            && (first > last || !self.passed_over.range(first..=last).any(|s| counts(*s)))
    }

    /// The peer's answer says it may not hold positions at or below `unread` (a snapshot it
    /// took carried records it could not read, or it compacted a position it passed over).
    fn note_unread(&mut self, unread: LogIndex) {
        self.passed_over_forgotten = self.passed_over_forgotten.max(unread);
    }

    /// The peer's answer named `positions` (of the append that carried entries up to
    /// `through`) as passed over.
    fn note_passed_over(&mut self, positions: Vec<LogIndex>, through: LogIndex) {
        self.passed_over.extend(positions.into_iter().filter(|s| *s <= through));
        while self.passed_over.len() > PASSED_OVER_MAX {
            if let Some(s) = self.passed_over.pop_first() {
                self.passed_over_forgotten = self.passed_over_forgotten.max(s);
            }
        }
    }
}

/// What the shell read back from disk for the metadata store.
#[derive(Clone, Debug, Default)]
pub struct MetaRestored {
    pub records: Vec<Record>,
    pub entries: Vec<Entry>,
    pub pending: Vec<Pending>,
    pub log_meta: Option<LogMeta>,
    /// Purged keys with their tombstones' versions ([`MetaPersist::PutPurged`]).
    pub purged: Vec<(RecordKey, Version)>,
}

pub struct Meta {
    me: NodeId,
    config: MetaConfig,
    lease: LeaseState,
    state: MetaState,
    log: BTreeMap<LogIndex, Entry>,
    /// Which leader's numbering our log follows (term and holder).
    log_lease: Option<Lease>,
    last_seq: LogIndex,
    compacted_through: LogIndex,
    /// See [`LogMeta::unread_through`]: named in append answers (`unreadThrough`).
    unread_through: LogIndex,
    appends_since_compaction: u64,
    pending: BTreeMap<u64, Record>,
    next_pending_id: u64,
    /// How many pending records the leader took so far (answered submits, or this node's own
    /// taken when it became leader): part of [`HeldProgress`].
    pending_taken: u64,
    /// When this store was made (a node that leaves or joins starts a new one): part of
    /// [`HeldProgress`].
    born: Millis,
    /// Pending ids of ours that went into our own log when we became leader: first id of each
    /// such batch -> (last id, their first and last positions, the term) (see
    /// [`Meta::mark_held`]); the last 64.
    self_appended: BTreeMap<u64, (u64, LogIndex, LogIndex, Term)>,
    /// Pending ids of ours whose records the leader refused (named in a submit's answer): the
    /// changes stay on this node only, so no acknowledgement covering them may say they are
    /// held elsewhere ([`Meta::mark_refused`]); the last [`REFUSED_OWN_MAX`].
    refused_own: BTreeSet<u64>,
    /// Pending ids of ours the leader refused because the record they were decided from had
    /// changed ([`crate::meta::records::BasedOn`]): undone here, and their acknowledgement is
    /// a conflict ([`Meta::mark_changed`]); the last [`REFUSED_OWN_MAX`].
    changed_own: BTreeSet<u64>,
    /// Leader: the files it kept over a tombstone that never saw them
    /// ([`Meta::keep_over_tombstone`]), by path: the file's id, the version of the put kept,
    /// and the version it was written at; a later put of the same file is kept above it
    /// ([`Meta::after_kept`]). In memory only, the last [`KEPT_RECENTLY_MAX`] (a restart
    /// forgets them; kept across a change of lease, since a record written by this node's keep
    /// is still the one it kept while the path holds its exact version).
    kept_recently: BTreeMap<String, (crate::ids::FileId, Version, Version)>,
    /// The paths of [`Meta::kept_recently`], oldest first.
    kept_order: VecDeque<String>,
    /// Paths named by pending records of ours that carry a `BasedOn` (a remove's or a move's,
    /// the record's path and the one it was decided from), with how many: until the leader
    /// takes them, nothing on disk follows them ([`Meta::awaiting_leader`]).
    based_pending: BTreeMap<String, u32>,
    /// Pending records sent back after a snapshot, by id, with what they were decided from
    /// ([`crate::meta::log::Pending::sent_back_based`]).
    sent_back_based: BTreeMap<u64, crate::meta::records::BasedOn>,
    /// Leader: the members asked what they hold at the paths of this node's own queued removes
    /// and moves, before those go into the log ([`Meta::own_based_checked`]).
    based_check: Option<BasedCheck>,
    /// Leader: when each member last answered a lease push or an append with its records
    /// settled on this leader's numbering ([`Meta::leader_may_lag`]).
    in_touch: BTreeMap<NodeId, Millis>,
    /// Leader: a round of [`Meta::own_based_checked`] that some member did not answer is asked
    /// again at this time (a new remove or move does not bring it forward).
    based_retry_due: Option<Millis>,
    /// The submits in flight: first pending id of each -> (when it was sent, the ids it carries).
    submits: BTreeMap<u64, (Millis, Vec<u64>)>,
    /// Every pending id some submit in flight carries.
    submitting: BTreeSet<u64>,
    submit_due: Millis,
    /// Lingering records are queued ([`Meta::submit_lingering`]): they go out by this time at
    /// the latest, with the next change sent if that comes first.
    linger_due: Option<Millis>,
    /// When the catch-up or snapshot request in flight was sent.
    catch_up_in_flight: Option<Millis>,
    /// Follower: entries of the leader's numbering beyond a hole in this node's log (their
    /// records are applied already), kept until the hole fills (see [`Meta::take_entries`]).
    ahead: BTreeMap<LogIndex, Entry>,
    /// Follower: when to read the hole before `ahead` from the leader, if it is still there.
    catch_up_due: Option<(Millis, NodeId)>,
    peers: BTreeMap<NodeId, PeerAppend>,
    members: Vec<Candidate>,
    tick_due: Millis,
    last_anti_entropy: Millis,
    /// This node's last sequence number at the previous lease push, when it was ahead of the
    /// leader's (see [`Meta::follow`]).
    ahead_at_push: Option<LogIndex>,
    purge_due: Millis,
    snapshots_adopted: u64,
    snapshot_progress: Option<SnapshotProgress>,
    /// Entries and records refused (see the module doc), and the last reason.
    refused: u64,
    last_refusal: Option<String>,
    /// See [`MetaStatus::based_refused`].
    based_refused: u64,
    /// The lease seen at the last tick, and how often it changed since start (a metric).
    lease_seen: Option<Lease>,
    leader_changes: u64,
    /// The latest monotonic time this machine was handed.
    now: Millis,
    outputs: VecDeque<MetaOutput>,
}

impl Meta {
    /// New timings and limits (a config change), taken without a restart.
    pub fn set_config(&mut self, config: MetaConfig) {
        self.lease.set_config(config.lease.clone());
        self.config = config;
    }

    pub fn new(me: NodeId, config: MetaConfig, now: Millis) -> Meta {
        Meta {
            lease: LeaseState::new(me.clone(), config.lease.clone(), now),
            me,
            config,
            state: MetaState::new(),
            log: BTreeMap::new(),
            log_lease: None,
            last_seq: LogIndex(0),
            compacted_through: LogIndex(0),
            unread_through: LogIndex(0),
            appends_since_compaction: 0,
            pending: BTreeMap::new(),
            next_pending_id: 1,
            pending_taken: 0,
            born: now,
            submits: BTreeMap::new(),
            submitting: BTreeSet::new(),
            submit_due: Millis::ZERO,
            linger_due: None,
            catch_up_in_flight: None,
            ahead: BTreeMap::new(),
            catch_up_due: None,
            peers: BTreeMap::new(),
            members: Vec::new(),
            tick_due: now,
            last_anti_entropy: Millis::ZERO,
            ahead_at_push: None,
            purge_due: now,
            snapshots_adopted: 0,
            lease_seen: None,
            leader_changes: 0,
            self_appended: BTreeMap::new(),
            refused_own: BTreeSet::new(),
            changed_own: BTreeSet::new(),
            kept_recently: BTreeMap::new(),
            kept_order: VecDeque::new(),
            based_pending: BTreeMap::new(),
            sent_back_based: BTreeMap::new(),
            based_check: None,
            in_touch: BTreeMap::new(),
            based_retry_due: None,
            snapshot_progress: None,
            refused: 0,
            last_refusal: None,
            based_refused: 0,
            now,
            outputs: VecDeque::new(),
        }
    }

    pub fn restore(&mut self, r: MetaRestored, hlc: &mut Hlc) {
        // Before the records: an older copy of a purged record (e.g. one a crash left on disk
        // next to its marker) must be refused, as it would be from a peer.
        for (_, v) in &r.purged {
            hlc.observe(v);
        }
        for key in self.state.restore_purged(r.purged) {
            self.persist(MetaPersist::DeletePurged(key));
        }
        for rec in &r.records {
            if let Some(why) = rec.shape_error() {
                // Written by an older build: serving it could stop a peer's catch-up.
                self.refuse(None, format!("stored record {}/{}", rec.kind().as_str(), rec.key()), why);
                let key = (rec.kind(), rec.key());
                self.persist(MetaPersist::DeleteRecord(key));
                continue;
            }
            for v in rec.versions() {
                hlc.observe(v);
            }
            self.state.apply(rec);
        }
        if let Some(m) = r.log_meta {
            self.lease.note_term(m.term);
            self.last_seq = m.last_seq;
            self.compacted_through = m.compacted_through;
            self.unread_through = m.unread_through;
            self.log_lease = m.holder.map(|holder| Lease { holder, term: m.term });
        }
        for e in r.entries {
            if e.seq > self.compacted_through && e.seq <= self.last_seq {
                self.log.insert(e.seq, e);
            }
        }
        for p in r.pending {
            self.next_pending_id = self.next_pending_id.max(p.id.saturating_add(1));
            if let Some(why) = p.record.shape_error() {
                self.refuse(None, format!("stored pending submit {}", p.id), why);
                self.persist(MetaPersist::DeletePending(p.id));
                continue;
            }
            if let Some(b) = p.sent_back_based {
                self.sent_back_based.insert(p.id, b);
            }
            self.pending_insert(p.id, p.record);
        }
    }

    // ---- getters ----

    pub fn state(&self) -> &MetaState {
        &self.state
    }
    pub fn last_seq(&self) -> LogIndex {
        self.last_seq
    }
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }
    pub fn log_len(&self) -> usize {
        self.log.len()
    }
    /// How many snapshots this node has taken in (catch-up fallbacks and reconciliations).
    pub fn snapshots_adopted(&self) -> u64 {
        self.snapshots_adopted
    }

    pub fn known_lease(&self) -> Option<&Lease> {
        self.lease.known()
    }

    pub(super) fn eligible(&self, id: &NodeId) -> bool {
        self.members.iter().any(|c| &c.id == id && c.eligible)
    }

    /// The valid lease at monotonic time `now`.
    pub fn leader(&self, now: Millis) -> Option<&Lease> {
        self.lease.valid(now, |id| self.eligible(id))
    }

    /// Whether this node's latest change to the record at (`kind`, `key`) is held by another
    /// node too: on a follower, the leader took it (nothing of that record is pending here);
    /// on the leader, some peer acknowledged the entry holding it (or there is no peer, or the
    /// entry was compacted long ago). An answer that waits for this survives losing this node.
    pub fn held_elsewhere(&self, kind: RecordKind, key: &str) -> bool {
        if self.pending.values().any(|r| r.kind() == kind && r.key() == key) {
            return false;
        }
        if self.log_lease.as_ref().is_none_or(|l| l.holder != self.me) {
            return true; // not pending on a follower: the leader took it
        }
        let Some(entry) = self.log.values().rev().find(|e| e.record.kind() == kind && e.record.key() == key) else {
            return true; // compacted long ago
        };
        if entry.origin != self.me {
            return true; // a follower's, submitted: that follower and this leader hold it
        }
        let alone = self.members.iter().all(|c| c.id == self.me);
        alone || self.peers.values().any(|p| p.holds(entry.seq, entry.seq, |_| true))
    }

    pub fn is_leader(&self, now: Millis) -> bool {
        self.leader(now).is_some_and(|l| l.holder == self.me)
    }

    /// A position in this node's writes (issue 18 "Acknowledged means safe"): taken before
    /// and after a client's request, the two bound the changes it made ([`Meta::mark_held`]).
    pub fn write_mark(&self) -> WriteMark {
        let led = self.log_lease.as_ref().is_some_and(|l| l.holder == self.me);
        WriteMark { pending_before: self.next_pending_id, seq: self.last_seq, led, term: self.log_term() }
    }

    /// Whether every change this node made between `from` and `to` is held by another node
    /// too: none waits here for the leader (the leader took it); a change this node appended
    /// to its own log as leader (directly, or a pending one when it became leader) is
    /// confirmed by a peer's answer to an append under this lease; or there is no other
    /// candidate.
    pub fn mark_held(&self, from: &WriteMark, to: &WriteMark) -> bool {
        self.mark_state(from, to) == MarkState::Held
    }

    /// Whether no other node can ever be counted holding a change this node made between `from`
    /// and `to`: it was numbered under another term than its log's now (see [`Meta::mark_held`]),
    /// so waiting out `meta.ack_wait` would only delay the same `unconfirmed` answer.
    pub fn mark_never_held(&self, from: &WriteMark, to: &WriteMark) -> bool {
        self.mark_state(from, to) == MarkState::Never
    }

    fn mark_state(&self, from: &WriteMark, to: &WriteMark) -> MarkState {
        if self.pending.range(from.pending_before..to.pending_before).next().is_some() {
            return MarkState::Waiting;
        }
        let alone = self.members.iter().all(|c| c.id == self.me);
        let term = self.log_term();
        // Of the entries appended meanwhile, only this leader's own wait for a peer: one a
        // follower submitted is held by that follower and by this leader already (and the
        // append gap may hold it back from the others for a moment). Entries numbered under
        // another term than the log's now are not known to be held (the log was replaced by a
        // new leader's snapshot, which sent this node's records back as new pending ones, or
        // the numbering started again): the request is answered `unconfirmed` at its bound.
        // `need`: the newest such entry; `start`: the first position of the range it closes
        // (a peer must have passed over none of them).
        let mut need = None;
        let mut start = LogIndex(u64::MAX);
        let mut other_numbering = false;
        if to.led && to.seq > from.seq {
            if to.term != term {
                other_numbering = true;
            } else {
                need = self.newest_own_entry(from.seq, to.seq);
                start = LogIndex(from.seq.0.saturating_add(1));
            }
        }
        for (first, (last, begin, end, at_term)) in &self.self_appended {
            if *first < to.pending_before && *last >= from.pending_before {
                other_numbering |= Some(*at_term) != term;
                need = Some(need.map_or(*end, |n: LogIndex| n.max(*end)));
                start = start.min(*begin);
            }
        }
        if other_numbering {
            return if alone { MarkState::Held } else { MarkState::Never };
        }
        let Some(need) = need else { return MarkState::Held };
        let leads = self.log_lease.as_ref().is_some_and(|l| l.holder == self.me);
        // A passed-over position counts if it held an entry of ours (or is no longer in the log,
        // so it cannot tell).
        let ours = |s: LogIndex| self.log.get(&s).is_none_or(|e| e.origin == self.me);
        if alone || (leads && self.peers.values().any(|p| p.holds(start.min(need), need, ours))) {
            MarkState::Held
        } else {
            MarkState::Waiting
        }
    }

    /// Whether the leader refused a record of a change this node made between `from` and `to`
    /// (a version too far ahead of its clock, or a record out of bounds): that change is on this
    /// node only, and its acknowledgement must say so rather than wait or claim it held.
    pub fn mark_refused(&self, from: &WriteMark, to: &WriteMark) -> bool {
        self.refused_own.range(from.pending_before..to.pending_before).next().is_some()
    }

    /// Whether the leader refused a record of a change this node made between `from` and `to`
    /// because the record it was decided from had changed meanwhile (another node's change
    /// this node had not seen yet): the change is undone here, and its acknowledgement is a
    /// conflict.
    pub fn mark_changed(&self, from: &WriteMark, to: &WriteMark) -> bool {
        self.changed_own.range(from.pending_before..to.pending_before).next().is_some()
    }

    /// Whether a remove or a move this node decided at `path` (from it or to it) waits for the
    /// leader to take it: the leader may still refuse it ([`crate::meta::records::BasedOn`]),
    /// so no copy on disk is deleted or renamed for it yet.
    pub fn awaiting_leader(&self, path: &str) -> bool {
        !self.based_pending.is_empty() && self.based_pending.contains_key(path)
    }

    /// The paths where a live file record of this node's waits for the leader (a put not taken
    /// yet). A tombstone there that wins here meanwhile may be one the leader keeps that file
    /// over ([`Meta::answer_submit`], `writtenAgain`), so nothing on disk follows it until the
    /// leader answered: the put's bytes would be deleted as the tombstone's copy.
    pub fn puts_awaiting_leader(&self) -> BTreeSet<&str> {
        self.pending
            .values()
            .filter_map(|r| match r {
                Record::File(f) if !f.removed && !f.is_dir => Some(f.path.as_str()),
                _ => None,
            })
            .collect()
    }

    /// Whether a live file record of this node's at `path` waits for the leader
    /// ([`Meta::puts_awaiting_leader`], for one path).
    pub fn put_awaits_leader(&self, path: &str) -> bool {
        self.pending.values().any(|r| matches!(r, Record::File(f) if !f.removed && !f.is_dir && f.path == path))
    }

    /// Whether this node's records may hold one half of a decision: a snapshot is adopted
    /// page by page (in key order: a move's tombstone may be in while its new path's record is
    /// not yet), or this follower's log follows another numbering than the lease holder's (an
    /// append's records are taken at once, and a new leader starts a peer after what it
    /// assumes the peer holds: the suffix may carry a move's tombstone without the record at
    /// its new path, found by the simulator, seed 3356). Both last until a snapshot puts the
    /// node on the leader's numbering; nothing on disk follows the records meanwhile (a copy
    /// would be deleted instead of renamed).
    pub fn records_settling(&self) -> bool {
        self.snapshot_progress.is_some()
            || self.lease.known().is_some_and(|k| k.holder != self.me && self.log_lease.as_ref() != Some(k))
    }

    fn based_paths(r: &Record) -> Option<[&str; 2]> {
        match r {
            Record::File(f) => f.based_on.as_ref().map(|b| [f.path.as_str(), b.path.as_str()]),
            _ => None,
        }
    }

    /// Queue a pending record (kept with [`Meta::based_pending`]).
    pub(super) fn pending_insert(&mut self, id: u64, record: Record) {
        for path in Self::based_paths(&record).into_iter().flatten() {
            *self.based_pending.entry(path.to_string()).or_default() += 1;
        }
        if let Some(old) = self.pending.insert(id, record) {
            self.forget_based(&old);
        }
    }

    /// A pending record leaves the queue (taken or refused).
    pub(super) fn pending_remove(&mut self, id: u64) -> Option<Record> {
        let r = self.pending.remove(&id)?;
        self.sent_back_based.remove(&id);
        self.forget_based(&r);
        Some(r)
    }

    fn forget_based(&mut self, r: &Record) {
        for path in Self::based_paths(r).into_iter().flatten() {
            if let Some(n) = self.based_pending.get_mut(path) {
                *n -= 1;
                if *n == 0 {
                    self.based_pending.remove(path);
                }
            }
        }
    }

    /// The leader refused pending record `id` as decided from a record that changed since
    /// (see [`crate::meta::records::BasedOn`]); `current` is the leader's record at its key.
    /// Undo it here ([`Meta::undo_own`]), then merge the leader's record in, so this node holds
    /// what the leader holds (the change it refused over, which last-writer-wins had dropped
    /// here, comes back). A refused record left in place would win over that change on this
    /// node, and travel again in a snapshot's send-back.
    pub(super) fn undo_changed(&mut self, id: u64, current: Option<Record>, hlc: &mut Hlc) {
        self.undo_own(id);
        if let Some(r) = current.filter(|r| r.shape_error().is_none()) {
            self.apply_one(&r, hlc);
        }
        self.note_changed_own(id);
    }

    /// Undo pending record `id` (one with a `BasedOn`) on this node, if it is still what this
    /// node holds at its key (nothing newer merged since): a tombstone goes back to the live
    /// record it was made from (`BasedOn` names its version; the rest of the header is the
    /// tombstone's own, copied from that record), a moved file's record at its new path goes
    /// away. Changes this node decided later from the undone record (a move of the file's new
    /// path) go first, newest first, and leave the queue: the leader, which never held that
    /// record, would take them.
    fn undo_own(&mut self, id: u64) {
        let Some(Record::File(refused)) = self.pending.get(&id).cloned() else { return };
        let Some(based) = refused.based_on.as_deref().cloned() else { return };
        if refused.version.node != self.me {
            return; // only a decision of this node's own is undone here
        }
        let later: Vec<u64> = self
            .pending
            .range(id.saturating_add(1)..)
            .filter(|(_, r)| match r {
                Record::File(g) => {
                    g.based_on.as_deref().is_some_and(|b| b.path == refused.path && b.version == refused.version)
                }
                _ => false,
            })
            .map(|(k, _)| *k)
            .rev()
            .collect();
        for l in later {
            self.undo_own(l);
            if self.pending_remove(l).is_some() {
                self.persist(MetaPersist::DeletePending(l));
            }
            self.note_changed_own(l);
        }
        // Changes made since of the record it wrote (copy marks: same path, same header
        // version) go with it: taken later, they would bring it back.
        let marks: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, r)| match r {
                Record::File(g) => g.based_on.is_none() && g.path == refused.path && g.version == refused.version,
                _ => false,
            })
            .map(|(k, _)| *k)
            .collect();
        for m in marks {
            if self.pending_remove(m).is_some() {
                self.pending_taken += 1;
                self.persist(MetaPersist::DeletePending(m));
            }
        }
        let key = (RecordKind::File, refused.path.clone());
        let back = match self.state.file(&refused.path) {
            Some(here) if here.version == refused.version => Self::record_before(here, &based),
            _ => return,
        };
        self.state.replace(&key, back.clone());
        match back {
            Some(r) => self.persist(MetaPersist::PutRecord(r)),
            None => self.persist(MetaPersist::DeleteRecord(key)),
        }
    }

    /// What this node held at a remove's or a move's path before the change `here`, decided
    /// from `based`: the live record it was made from for a tombstone (`based` names its
    /// version; the rest of the header is the tombstone's own, copied from that record),
    /// nothing for a moved file's record at its new path.
    fn record_before(here: &crate::meta::records::FileRecord, based: &crate::meta::records::BasedOn) -> Option<Record> {
        (here.path == based.path).then(|| {
            Record::File(crate::meta::records::FileRecord {
                removed: false,
                version: based.version.clone(),
                based_on: None,
                ..here.clone()
            })
        })
    }

    /// A record as a snapshot serves it: while this leader's own removes and moves wait for
    /// their check ([`Meta::own_changes_unchecked`]), a record one of them made goes out as it
    /// was before it (a moved file's record at its new path not at all): a member adopting the
    /// snapshot would otherwise take the change before the check, and drop, by
    /// last-writer-wins, the newer record the check is to find on it (simulator seed 3630). The
    /// change reaches it through the log once checked.
    pub(super) fn as_served(&self, r: &Record, unchecked: &UncheckedOwn) -> Option<Record> {
        let mut cur = r.clone();
        loop {
            let Record::File(f) = &cur else { return Some(cur) };
            let Some(based) = unchecked.get(&(f.path.as_str(), &f.version)) else { return Some(cur) };
            cur = Self::record_before(f, based)?;
        }
    }

    /// The path and version of each of this node's own removes and moves waiting for their
    /// check (empty unless [`Meta::own_changes_unchecked`]).
    pub(super) fn unchecked_own(&self) -> UncheckedOwn<'_> {
        if !self.own_changes_unchecked() {
            return BTreeMap::new();
        }
        self.pending
            .values()
            .filter_map(|r| match r {
                Record::File(f) if f.version.node == self.me => {
                    Some(((f.path.as_str(), &f.version), f.based_on.as_deref()?))
                }
                _ => None,
            })
            .collect()
    }

    fn note_changed_own(&mut self, id: u64) {
        self.changed_own.insert(id);
        while self.changed_own.len() > REFUSED_OWN_MAX {
            self.changed_own.pop_first();
        }
    }

    /// The submitter's side of a refusal: remember the pending id (bounded).
    pub(super) fn note_refused_own(&mut self, id: u64) {
        self.refused_own.insert(id);
        while self.refused_own.len() > REFUSED_OWN_MAX {
            self.refused_own.pop_first();
        }
    }

    /// The term of the numbering this node's log follows.
    fn log_term(&self) -> Option<Term> {
        self.log_lease.as_ref().map(|l| l.term)
    }

    /// The newest entry in `(after, through]` this node made itself (origin: this node); the
    /// end of the range if part of it was compacted or lies past the log's end (it cannot
    /// tell then).
    fn newest_own_entry(&self, after: LogIndex, through: LogIndex) -> Option<LogIndex> {
        let first = LogIndex(after.0.saturating_add(1));
        if self.compacted_through >= first || through > self.last_seq {
            return Some(through);
        }
        self.log.range(first..=through).rev().find(|(_, e)| e.origin == self.me).map(|(seq, _)| *seq)
    }

    /// What [`Meta::mark_held`] and [`Meta::held_elsewhere`] read, in a form cheap to take and
    /// compare: while it stays the same, no change that was not held elsewhere before is now
    /// (the pending records the leader took, the lease this log follows, the members, what the
    /// peers confirmed). A caller that waits for one of them looks again only when it moves,
    /// not at every input the node takes (issue 18: with 16 writers waiting, each input woke
    /// all 16).
    pub fn held_progress(&self) -> HeldProgress {
        HeldProgress {
            born: self.born,
            pending_taken: self.pending_taken,
            self_appended: self.self_appended.last_key_value().map(|(first, _)| *first),
            term: self.log_lease.as_ref().map(|l| l.term),
            leads: self.log_lease.as_ref().is_some_and(|l| l.holder == self.me),
            members: self.members.len(),
            held: self.peers.values().map(|p| p.held_through.0).fold(0u64, u64::wrapping_add),
            compacted_through: self.compacted_through,
        }
    }

    pub fn status(&self, now: Millis) -> MetaStatus {
        let leader = self.leader(now);
        MetaStatus {
            leader: leader.map(|l| l.holder.clone()),
            term: self.lease.term(),
            is_leader: leader.is_some_and(|l| l.holder == self.me),
            last_seq: self.last_seq,
            applied: self.last_seq,
            pending: self.pending.len(),
            records: self.state.len(),
            log_entries: self.log.len(),
            compacted_through: self.compacted_through,
            digest: self.state.digest(),
            snapshots_adopted: self.snapshots_adopted,
            refused: self.refused,
            last_refusal: self.last_refusal.clone(),
            based_refused: self.based_refused,
            records_settling: self.records_settling(),
            leader_may_lag: leader.is_some_and(|l| l.holder == self.me) && self.leader_may_lag(now),
        }
    }

    /// The lease's length in force.
    pub fn lease_ms(&self) -> u64 {
        self.config.lease.lease_ms
    }

    /// How often the lease (term or holder) this node knows changed since it started, as seen
    /// at its lease ticks.
    pub fn leader_changes(&self) -> u64 {
        self.leader_changes
    }

    /// Leader: how many log entries each follower is behind (its acknowledged index against
    /// ours), in node id order. Empty on a follower.
    pub fn peer_lag(&self, now: Millis) -> Vec<(NodeId, u64)> {
        if !self.is_leader(now) {
            return Vec::new();
        }
        self.peers.iter().map(|(id, p)| (id.clone(), self.last_seq.0.saturating_sub(p.acked_through.0))).collect()
    }

    // ---- the state machine face ----

    #[must_use]
    pub fn poll_output(&mut self) -> Option<MetaOutput> {
        self.outputs.pop_front()
    }

    pub fn poll_timeout(&self) -> Option<Millis> {
        let mut t = self.tick_due;
        if let Some(due) = self.linger_due {
            t = t.min(due);
        } else if self.submit_room() {
            t = t.min(self.submit_due);
        }
        if let Some((due, _)) = &self.catch_up_due {
            t = t.min(*due);
        }
        if let Some(c) = self.based_check.as_ref().filter(|_| self.own_changes_unchecked()) {
            t = t.min(c.due);
        }
        if let Some(due) = self.peers.values().filter_map(|p| p.gap_due).min() {
            t = t.min(due);
        }
        Some(t)
    }

    /// Periodic work. `members` lists every live member with its eligibility (this node too).
    pub fn handle_timeout(&mut self, now: Millis, wall: Millis, members: Vec<Candidate>, hlc: &mut Hlc) {
        self.now = self.now.max(now);
        let newcomers: Vec<NodeId> = members
            .iter()
            .filter(|c| c.id != self.me && !self.members.iter().any(|m| m.id == c.id))
            .map(|c| c.id.clone())
            .collect();
        self.members = members;
        // A member that just joined hears of the lease at once, not at the next renewal.
        if !newcomers.is_empty() && self.is_leader(now) {
            if let Some(l) = self.lease.known().cloned() {
                let body =
                    serde_json::to_vec(&LeaseBody { lease: l, last_seq: self.last_seq, digest: self.state.digest() })
                        .expect("serialise");
                for p in newcomers {
                    self.send(&p, "POST", "/cluster/acn/meta/lease".into(), body.clone(), MetaPurpose::LeasePush);
                }
            }
        }
        // A request whose answer never came (dropped, or the node's bookkeeping lost it) must
        // not block its kind of work for ever.
        let timeout = 2 * self.config.request_timeout_ms;
        let stale = |sent: &Option<Millis>| sent.is_some_and(|t| now.since(t) > timeout);
        let stale_submits: Vec<u64> =
            self.submits.iter().filter(|(_, (sent, _))| stale(&Some(*sent))).map(|(first, _)| *first).collect();
        for first in stale_submits {
            self.submit_settled(first);
        }
        if stale(&self.catch_up_in_flight) {
            self.catch_up_in_flight = None;
        }
        let limit = 2 * self.config.request_timeout_ms;
        for p in self.peers.values_mut() {
            if p.in_flight.is_some_and(|t| now.since(t) > limit) {
                p.in_flight = None;
                p.sent_through = p.acked_through.min(p.sent_through);
            }
        }
        self.peers.retain(|id, _| self.members.iter().any(|c| &c.id == id));
        self.in_touch.retain(|id, _| self.members.iter().any(|c| &c.id == id));
        if let Some((_, leader)) = self.catch_up_due.take_if(|(due, _)| now >= *due) {
            if !self.ahead.is_empty() {
                self.request_catch_up(&leader);
            }
        }
        if self.linger_due.is_some_and(|due| now >= due) {
            self.linger_due = None;
            if self.is_leader(now) {
                self.pump_appends();
            }
            // A follower's lingering records go with the submit below.
        }
        if self.peers.values().any(|p| p.gap_due.is_some_and(|due| now >= due)) {
            for p in self.peers.values_mut() {
                p.gap_due = None;
            }
            if self.is_leader(now) {
                self.pump_appends();
            }
        }
        if now >= self.tick_due {
            self.tick_due = now.plus(self.config.lease.tick_ms);
            if let Some(LeaseAction::Push(l)) = self.lease.tick(now, &self.members) {
                self.on_lease_taken(&l);
                self.push_lease(l);
            }
            let seen = self.lease.known().cloned();
            if seen.is_some() && seen != self.lease_seen {
                self.leader_changes += 1;
                self.lease_seen = seen;
            }
            if self.is_leader(now) {
                self.pump_appends();
            }
        }
        if now >= self.purge_due {
            self.purge_due = now.plus(self.config.purge_every_ms);
            let purge = self.state.purge(wall);
            for (key, version) in purge.purged {
                self.persist(MetaPersist::DeleteRecord(key.clone()));
                self.persist(MetaPersist::PutPurged(key, version));
            }
            // After the puts: a key purged and forgotten in the same call ends up deleted.
            for key in purge.forgotten {
                self.persist(MetaPersist::DeletePurged(key));
            }
        }
        self.try_submit(now, Some(hlc));
    }

    pub(super) fn persist(&mut self, p: MetaPersist) {
        self.outputs.push_back(MetaOutput::Persist(p));
    }

    /// Count and report a refusal (see the module doc).
    pub(super) fn refuse(&mut self, from: Option<NodeId>, what: String, why: &str) {
        self.refused += 1;
        self.last_refusal = Some(format!("{what}: {why}"));
        self.outputs.push_back(MetaOutput::Refused { from, what, why: why.to_string() });
    }

    /// Report that a peer refused what we sent (it is sent again); not counted in `refused`,
    /// which counts what this node refused.
    pub(super) fn refused_by(&mut self, peer: &NodeId, what: &str, why: String) {
        self.outputs.push_back(MetaOutput::Refused { from: Some(peer.clone()), what: what.to_string(), why });
    }

    pub(super) fn send(
        &mut self,
        to: &NodeId,
        method: &'static str,
        target: String,
        body: Vec<u8>,
        purpose: MetaPurpose,
    ) {
        self.outputs.push_back(MetaOutput::Send { to: to.clone(), method, target, body, purpose });
    }

    pub(super) fn other_members(&self) -> Vec<NodeId> {
        self.members.iter().filter(|c| c.id != self.me).map(|c| c.id.clone()).collect()
    }

    pub(super) fn push_lease(&mut self, l: Lease) {
        let body = serde_json::to_vec(&LeaseBody { lease: l, last_seq: self.last_seq, digest: self.state.digest() })
            .expect("serialise");
        for p in self.other_members() {
            self.send(&p, "POST", "/cluster/acn/meta/lease".into(), body.clone(), MetaPurpose::LeasePush);
        }
    }

    /// We now hold lease `l` (a claim): our log follows our own numbering from here.
    pub(super) fn on_lease_taken(&mut self, l: &Lease) {
        self.drop_held_back();
        if self.log_lease.as_ref() != Some(l) {
            // Answers to an earlier lease say nothing of who follows this one.
            self.in_touch.clear();
            self.log_lease = Some(l.clone());
            self.persist_log_meta();
            let last = self.last_seq;
            for p in self.peers.values_mut() {
                p.sent_through = last;
                p.acked_through = last;
                p.held_through = LogIndex(0);
                p.passed_over.clear();
                p.passed_over_forgotten = LogIndex(0);
            }
        }
    }

    pub(super) fn persist_log_meta(&mut self) {
        let m = LogMeta {
            term: self.log_lease.as_ref().map(|l| l.term).unwrap_or_default(),
            holder: self.log_lease.as_ref().map(|l| l.holder.clone()),
            last_seq: self.last_seq,
            compacted_through: self.compacted_through,
            unread_through: self.unread_through,
        };
        self.persist(MetaPersist::PutLogMeta(m));
    }

    // ---- writes ----

    /// A local change: applied at once, then replicated. `now` is monotonic time.
    pub fn submit(&mut self, now: Millis, record: Record, hlc: &mut Hlc) {
        self.submit_all(now, vec![record], hlc);
    }

    /// Local changes that must travel together (a move's record at the new path and the old
    /// path's tombstone): all applied and queued before any is sent, so one append (as leader)
    /// or one submit (as follower) carries them, up to the batch bound. Sent one by one, the
    /// first could reach the others while this node died before the rest left it or were
    /// written behind: a move cut short left the file at both paths (the chaos test).
    pub fn submit_all(&mut self, now: Millis, records: Vec<Record>, hlc: &mut Hlc) {
        self.now = self.now.max(now);
        let leader = self.is_leader(now);
        let has_based = records.iter().any(|r| Self::based_of(r).is_some());
        if !self.queue(leader, records) {
            return;
        }
        // What lingered goes along: a submit or append carries every queued change.
        self.linger_due = None;
        if leader {
            self.pump_appends();
            let retry_waits = self.based_retry_due.is_some_and(|due| now < due);
            if has_based && self.own_changes_unchecked() && !retry_waits {
                // A remove or a move queued for the check ([`Meta::leader_may_lag`]).
                self.submit_due = self.submit_due.min(now);
            }
        }
        self.try_submit(now, Some(hlc));
    }

    /// A local change that need not travel at once (an audit entry): applied and queued as
    /// [`Meta::submit`] does, but sent with the next change this node sends, or after
    /// `linger_ms` if none comes first. Under load, and for a client writing in sequence, the
    /// entry then shares the request of another change. It is persisted (as pending, or in the
    /// leader's log) like any change, so a restart still sends it.
    pub fn submit_lingering(&mut self, now: Millis, record: Record) {
        self.now = self.now.max(now);
        let leader = self.is_leader(now);
        if self.queue(leader, vec![record]) && self.linger_due.is_none() {
            self.linger_due = Some(now.plus(self.config.linger_ms));
        }
    }

    /// Apply local changes and queue them to travel: into the log as leader, as pending on a
    /// follower. A leader that may lag the others ([`Meta::leader_may_lag`]) queues its removes
    /// and moves as pending too, for [`Meta::own_based_checked`]. Whether any was queued.
    fn queue(&mut self, leader: bool, records: Vec<Record>) -> bool {
        let mut queued = false;
        // Decided once for all the records of one decision (a move's two travel together).
        let check_based =
            leader && records.iter().any(|r| Self::based_of(r).is_some()) && self.leader_may_lag(self.now);
        for record in records {
            if let Some(why) = record.shape_error() {
                // The commands check their input first; this is the last guard that keeps every
                // stored and sent record decodable.
                self.refuse(None, format!("local write of {}/{}", record.kind().as_str(), record.key()), why);
                continue;
            }
            if let Some(stored) = self.state.apply(&record) {
                let stored = stored.clone();
                self.persist(MetaPersist::PutRecord(stored));
            }
            // A change of a record a queued remove or move of this leader's own made (a copy
            // mark at the moved file's new path) waits behind it: appended first, it gave the
            // others that record before the check, and an undone move left it there (simulator
            // `--races` seed 6091: the file at both paths).
            let behind_check = leader && self.waits_for_own_check(&record);
            if leader && !(check_based && Self::based_of(&record).is_some()) && !behind_check {
                let origin = self.me.clone();
                self.append_as_leader(record, origin);
            } else {
                let id = self.next_pending_id;
                self.next_pending_id += 1;
                self.pending_insert(id, record.clone());
                self.persist(MetaPersist::PutPending(Pending { id, record, sent_back_based: None }));
            }
            queued = true;
        }
        queued
    }

    pub(super) fn append_as_leader(&mut self, record: Record, origin: NodeId) {
        let lease = self.lease.known().cloned().expect("leader has a lease");
        self.last_seq = LogIndex(self.last_seq.0.saturating_add(1));
        let entry = Entry { seq: self.last_seq, term: lease.term, version: record.max_version(), record, origin };
        self.persist(MetaPersist::PutEntry(entry.clone()));
        self.log.insert(entry.seq, entry);
        self.persist_log_meta();
        self.after_append();
    }

    pub(super) fn after_append(&mut self) {
        self.appends_since_compaction += 1;
        if self.appends_since_compaction >= self.config.compact_every {
            self.appends_since_compaction = 0;
            let keep_from = self.last_seq.0.saturating_sub(self.config.keep_entries);
            if keep_from > self.compacted_through.0 {
                let kept = self.log.split_off(&LogIndex(keep_from.saturating_add(1)));
                let gone = std::mem::replace(&mut self.log, kept);
                if (gone.len() as u64) < keep_from - self.compacted_through.0 {
                    // A position passed over goes with them: it can no longer be named.
                    self.unread_through = self.unread_through.max(LogIndex(keep_from));
                }
                self.compacted_through = LogIndex(keep_from);
                self.persist(MetaPersist::DeleteEntriesThrough(self.compacted_through));
                self.persist_log_meta();
            }
        }
    }

    /// Leader: send each peer the entries it has not been sent, one request in flight per peer.
    pub(super) fn pump_appends(&mut self) {
        let Some(lease) = self.lease.known().cloned() else { return };
        let head = format!(
            "\"lease\":{},\"lastSeq\":{},",
            serde_json::to_string(&lease).expect("serialise"),
            serde_json::to_string(&self.last_seq).expect("serialise")
        );
        // Peers sent the same range share one body (built once, copied).
        let mut made: Option<(LogIndex, Vec<u8>, LogIndex)> = None;
        for p in self.other_members() {
            let last = self.last_seq;
            let entry = self.peers.entry(p.clone()).or_insert_with(|| PeerAppend {
                in_flight: None,
                sent_through: LogIndex(last.0.saturating_sub(1)),
                acked_through: LogIndex(last.0.saturating_sub(1)),
                held_through: LogIndex(0),
                passed_over: BTreeSet::new(),
                passed_over_forgotten: LogIndex(0),
                last_sent: None,
                gap_due: None,
            });
            if entry.in_flight.is_some() || entry.sent_through >= self.last_seq {
                continue;
            }
            let from = LogIndex(entry.sent_through.0.max(self.compacted_through.0).saturating_add(1));
            // The append gap: only when no entry in the range is this leader's own (those
            // wait for a follower's confirmation) and the range is short of a full batch (a
            // peer that lags gains nothing from waiting). Either way it looks at one batch's
            // entries at most, however far behind the peer is.
            let due = entry.last_sent.map(|t| t.plus(self.config.append_gap_ms));
            if let Some(due) = due.filter(|due| self.now < *due) {
                let batch = self.log.range(from..).take(self.config.batch_max.max(1));
                let (mut len, mut own) = (0, false);
                for (_, e) in batch {
                    len += 1;
                    own |= e.origin == self.me;
                }
                if !own && len < self.config.batch_max.max(1) {
                    entry.gap_due = Some(due);
                    continue;
                }
            }
            entry.gap_due = None;
            let (body, through) = match &made {
                Some((f, body, through)) if *f == from => (body.clone(), *through),
                _ => {
                    let entries = self.log.range(from..).map(|(_, e)| e);
                    let (body, n) = json_batch(&head, "entries", entries, self.config.batch_max);
                    let Some(through) = n.checked_sub(1).and_then(|i| self.log.range(from..).nth(i)).map(|(s, _)| *s)
                    else {
                        continue;
                    };
                    made = Some((from, body.clone(), through));
                    (body, through)
                }
            };
            let entry = self.peers.get_mut(&p).expect("inserted");
            entry.in_flight = Some(self.now);
            entry.last_sent = Some(self.now);
            entry.sent_through = through;
            let body = with_held_through(body, entry.held_through);
            self.send(&p, "POST", "/cluster/acn/meta/append".into(), body, MetaPurpose::Append { through });
        }
    }

    /// A pending record no submit in flight carries, and room for another submit.
    fn submit_room(&self) -> bool {
        self.submits.len() < self.config.submit_window.max(1)
            && self.pending.keys().any(|id| !self.submitting.contains(id))
    }

    /// The position among `records` of the first mark (no `BasedOn`, a record's path and
    /// header version) of a remove's or move's record in a submit still in flight, or of a
    /// change decided from such a record (a move of the moved file: its `BasedOn` names that
    /// record), which [`Meta::undo_own`] undoes with it should the leader refuse it.
    fn first_mark_of_in_flight<'r>(&self, mut records: impl Iterator<Item = &'r Record>) -> Option<usize> {
        if self.submitting.is_empty() {
            return None;
        }
        let in_flight: Vec<(&str, &Version)> = self
            .submitting
            .iter()
            .filter_map(|id| match self.pending.get(id) {
                Some(Record::File(f)) if f.based_on.is_some() => Some((f.path.as_str(), &f.version)),
                _ => None,
            })
            .collect();
        if in_flight.is_empty() {
            return None;
        }
        records.position(|r| {
            let Record::File(f) = r else { return false };
            match f.based_on.as_deref() {
                None => in_flight.iter().any(|(p, v)| *p == f.path && *v == &f.version),
                Some(b) => in_flight.iter().any(|(p, v)| *p == b.path && *v == &b.version),
            }
        })
    }

    /// The submit that carried pending ids from `first` on is answered (or given up on).
    pub(super) fn submit_settled(&mut self, first: u64) -> Vec<u64> {
        let ids = self.submits.remove(&first).map(|(_, ids)| ids).unwrap_or_default();
        for id in &ids {
            self.submitting.remove(id);
        }
        ids
    }

    /// Send this node's queued changes on: to the leader in submits, or, leading, into its own
    /// log (`hlc` to write what that takes; `None` only where this node follows another).
    pub(super) fn try_submit(&mut self, now: Millis, hlc: Option<&mut Hlc>) {
        if self.based_check.is_some() && !(self.is_leader(now) && self.own_changes_unchecked()) {
            // Nothing left to check (every queued change refuted), or no longer leading.
            self.based_check = None;
        }
        if self.pending.is_empty() || now < self.submit_due {
            return;
        }
        let Some(leader) = self.leader(now).map(|l| l.holder.clone()) else { return };
        if leader != self.me {
            self.based_check = None;
        }
        let adopting = self.snapshot_progress.is_some() && self.catch_up_in_flight.is_some();
        if leader != self.me && adopting && !self.sent_back_based.is_empty() {
            // A snapshot is being adopted and it sends back removes or moves: their records
            // come page by page, a move's two maybe on two pages; they go once all are queued
            // (the leader orders a sent-back move's two together: [`Meta::sent_back_plan`]).
            // (Only while a page is asked for: a page whose answer never came goes stale, and
            // the queue goes on.)
            return;
        }
        if leader == self.me {
            if !self.submits.is_empty() {
                // Submits to the old leader are answered (or time out) first.
                return;
            }
            let Some(hlc) = hlc else { return };
            if !self.own_based_checked(now) {
                return;
            }
            // We became leader: our own pending changes go straight into the log.
            let pending = std::mem::take(&mut self.pending);
            self.based_pending.clear();
            let ids = pending.keys().next().copied().zip(pending.keys().next_back().copied());
            let begin = LogIndex(self.last_seq.0.saturating_add(1));
            for (id, mut rec) in pending {
                self.pending_taken += 1;
                let me = self.me.clone();
                // A record sent back after a snapshot goes into the log with what it was
                // decided from, as the leader it was sent to would have stored it.
                let mut restored = None;
                if let (Some(b), Record::File(f)) = (self.sent_back_based.remove(&id), &mut rec) {
                    f.based_on.get_or_insert(Box::new(b));
                    restored = Some(rec.clone());
                }
                self.append_as_leader(rec, me);
                self.persist(MetaPersist::DeletePending(id));
                // A move of this node's own sent back after a snapshot that an overwrite it took
                // with that snapshot never saw: ordered as the put, then the move, as the leader
                // it was sent to orders it ([`Meta::answer_submit`]). Before, a mover that
                // became the leader with it still queued took the moved record beside the
                // overwrite: the file at both paths with one id.
                let carry = restored.and_then(|r| self.overwrite_a_sent_back_move_never_saw(&r, &[]));
                if let Some((over, tomb, moved)) = carry {
                    self.carry_overwrite(&over, tomb, moved, hlc);
                }
            }
            if let Some((first, last)) = ids {
                let term = self.log_term().unwrap_or_default();
                self.self_appended.insert(first, (last, begin, self.last_seq, term));
                while self.self_appended.len() > 64 {
                    self.self_appended.pop_first();
                }
            }
            self.pump_appends();
            return;
        }
        while self.submit_room() {
            let submitting = &self.submitting;
            let unsent = || self.pending.iter().filter(|(id, _)| !submitting.contains(id));
            let (mut body, mut n) =
                json_batch("\"seqs\":true,", "records", unsent().map(|(_, r)| r), self.config.batch_max);
            // The records of one decision (a move's two, from one `BasedOn`) go in one submit:
            // the leader checks them together, so it takes both or neither.
            // (A record sent back after a snapshot travels without its `BasedOn`: what it was
            // decided from is beside it, and the leader orders the pair by it.)
            let sent_back_based = &self.sent_back_based;
            let mut cut = decision_cut(unsent().map(|(id, r)| Self::based_of(r).or(sent_back_based.get(id))), n);
            if !sent_back_based.is_empty() {
                // A snapshot's send-backs are queued in key order, so a move's two records may
                // sit apart (another record's path between theirs): the batch ends before a
                // decision it would split, unless that decision comes first.
                let based: Vec<Option<&crate::meta::records::BasedOn>> =
                    unsent().map(|(id, r)| Self::based_of(r).or(sent_back_based.get(id))).collect();
                let beyond: Vec<&crate::meta::records::BasedOn> = based.iter().skip(cut).flatten().copied().collect();
                // (A decision that starts the batch takes its records further on along,
                // below.)
                if let Some(i) = (1..cut).find(|&i| based[i].is_some_and(|b| beyond.contains(&b))) {
                    cut = i;
                }
            }
            // A mark of a remove's or move's record in a submit still in flight (a wider
            // `submit_window`) waits for that submit's answer: should the leader refuse the
            // change, the mark leaves with it ([`Meta::undo_own`]); sent meanwhile, it would
            // give the leader the refused record back.
            if let Some(k) = self.first_mark_of_in_flight(unsent().map(|(_, r)| r).take(cut)) {
                if k == 0 {
                    // Looked at again when an answer comes, or when the oldest submit in
                    // flight goes stale (not spun on meanwhile).
                    let stale = 2 * self.config.request_timeout_ms + 1;
                    let due = self.submits.values().map(|(sent, _)| sent.plus(stale)).min();
                    self.submit_due = due.unwrap_or(now.plus(self.config.submit_retry_ms));
                    break;
                }
                cut = k;
            }
            // A decision sent back after a snapshot that starts the batch and has a record
            // beyond it takes that record along, ahead of the ones between (the send-backs are
            // queued in key order a page at a time, so a move's two paths may lie more than a
            // batch apart; no record of that path is queued before it, or it would not have
            // been sent back). Split, the leader took the tombstone alone, and a holder deleted
            // the copies the moved record, still on its way, was to rename.
            let pulled: Vec<u64> = match unsent().next().and_then(|(id, _)| sent_back_based.get(id)) {
                Some(first_based) => unsent()
                    .skip(cut)
                    .filter(|(id, _)| sent_back_based.get(id) == Some(first_based))
                    .map(|(id, _)| *id)
                    .collect(),
                None => Vec::new(),
            };
            if cut < n || !pulled.is_empty() {
                let along = pulled.iter().filter_map(|id| self.pending.get(id));
                (body, n) = json_batch(
                    "\"seqs\":true,",
                    "records",
                    unsent().map(|(_, r)| r).take(cut).chain(along),
                    cut + pulled.len(),
                );
                if !pulled.is_empty() && n < cut + pulled.len() && cut > 1 {
                    // Past the byte limit with the records between: the decision alone.
                    cut = 1;
                    let along = pulled.iter().filter_map(|id| self.pending.get(id));
                    let records = unsent().map(|(_, r)| r).take(1).chain(along);
                    (body, n) = json_batch("\"seqs\":true,", "records", records, 1 + pulled.len());
                }
            }
            let ids: Vec<u64> = unsent().take(cut).map(|(id, _)| *id).chain(pulled.iter().copied()).take(n).collect();
            let Some(first) = ids.first().copied() else { break };
            // What the records sent back after a snapshot were decided from, beside them.
            let sent_back: Vec<Value> = ids
                .iter()
                .enumerate()
                .filter_map(|(i, id)| Some(json!({"index": i, "basedOn": self.sent_back_based.get(id)?})))
                .collect();
            if !sent_back.is_empty() && body.last() == Some(&b'}') {
                body.pop();
                body.extend_from_slice(b",\"sentBack\":");
                body.extend_from_slice(&serde_json::to_vec(&sent_back).expect("serialise"));
                body.push(b'}');
            }
            self.submitting.extend(ids.iter().copied());
            self.submits.insert(first, (now, ids.clone()));
            self.send(&leader, "POST", "/cluster/acn/meta/submit".into(), body, MetaPurpose::Submit { ids });
        }
    }

    /// Whether this leader's records may lag what another member holds, so that a remove or
    /// a move it decides is queued and checked ([`Meta::own_based_checked`]) rather than
    /// appended at once: it has other members and one of those it can reach (alive and heard
    /// from lately, whatever its admin state) has not answered a lease push or an append, with
    /// its records settled on this leader's numbering, within one lease period (it may follow another leader by now, whose
    /// acknowledged writes this node has not seen: a leader's lease lapses on a member one
    /// lease period after the member last heard it), or it reaches none of them (it leads
    /// alone: the others may have gone on without it), or removes and moves of its own wait for
    /// a check already (the later ones may be decided from them, and must stay where the
    /// check's undo reaches them). Before, a node leading alone put its moves into its log at
    /// once; decided from records behind an overwrite the others acknowledged, the move's
    /// tombstone, newer by version, dropped that overwrite when they met (simulator seed 3408).
    pub fn leader_may_lag(&self, now: Millis) -> bool {
        let mut others = self.members.iter().filter(|c| c.id != self.me).peekable();
        if others.peek().is_none() {
            return false;
        }
        if self.own_changes_unchecked() {
            return true;
        }
        let lease_ms = self.config.lease.lease_ms;
        let reachable: Vec<&Candidate> = others.filter(|c| c.reachable).collect();
        reachable.is_empty()
            || reachable.iter().any(|c| self.in_touch.get(&c.id).is_none_or(|at| now.since(*at) > lease_ms))
    }

    /// A leader with removes or moves of its own queued (decided as a follower, from records
    /// that may have lagged the old leader's: an overwrite the old leader acknowledged, held by
    /// another member, that this node never saw; or decided as a leader that may lag,
    /// [`Meta::leader_may_lag`]) first asks every member it can reach what it holds at the
    /// paths they were decided from, as a leader checks a follower's ([`Meta::base_gone`]). An
    /// answer naming a newer record undoes the change it refutes (its acknowledgement is
    /// `Changed`) and the record is merged and appended; the rest go into the log once every
    /// member asked answered. A member whose ask failed (no answer by `request_timeout_ms`, or
    /// a refusal other than a build without the endpoint) is asked again `submit_retry_ms`
    /// later, with the others; one round names at most [`BASED_ASK_MAX`] paths, the rest go
    /// in the rounds after it; while it reaches no member, the
    /// queue waits (it is looked at every lease tick). Changes queued after a round's asks went
    /// out are asked about in a round of their own. Without it, such a change went into the
    /// leader's log unchecked, and its tombstone, newer by version, dropped the acknowledged
    /// overwrite everywhere (simulator seeds 3630 and 3408). Returns whether the queue may go
    /// into the log now.
    fn own_based_checked(&mut self, now: Millis) -> bool {
        // A move's two records name the same base: asked once.
        let based: BTreeSet<(String, Version)> = self
            .pending
            .values()
            .filter_map(|r| Self::based_of(r))
            .map(|b| (b.path.clone(), b.version.clone()))
            .collect();
        if based.is_empty() {
            self.based_check = None;
            return true;
        }
        let has_others = self.members.iter().any(|c| c.id != self.me);
        match &self.based_check {
            None => {
                // The members this node can reach (alive and heard from lately, whatever their
                // admin state): one that is down would only hold the check up.
                let others: Vec<NodeId> =
                    self.members.iter().filter(|c| c.id != self.me && c.reachable).map(|c| c.id.clone()).collect();
                if others.is_empty() {
                    if has_others {
                        // Alone: the queue waits for a member to come back (each lease tick).
                        self.submit_due = now.plus(self.config.lease.tick_ms);
                        return false;
                    }
                    return true;
                }
                // At most what one answer may name: the rest in the rounds after this one.
                let based: BTreeSet<(String, Version)> = based.into_iter().take(BASED_ASK_MAX).collect();
                self.based_retry_due = None;
                let asks: Vec<Value> =
                    based.iter().map(|(path, version)| json!({"path": path, "version": version})).collect();
                let body = serde_json::to_vec(&json!({ "based": asks })).expect("serialise");
                for p in &others {
                    self.send(p, "POST", "/cluster/acn/meta/based".into(), body.clone(), MetaPurpose::Based);
                }
                let due = now.plus(self.config.request_timeout_ms);
                self.based_check = Some(BasedCheck {
                    asked: based,
                    waiting: others.into_iter().collect(),
                    failed: BTreeSet::new(),
                    due,
                });
                false
            }
            Some(c) if !c.waiting.is_empty() && now < c.due => {
                // Answers call again as they come; the timer only for the deadline.
                self.submit_due = c.due;
                false
            }
            Some(c) => {
                let unanswered = !c.failed.is_empty() || !c.waiting.is_empty();
                let unasked = based.iter().any(|b| !c.asked.contains(b));
                self.based_check = None;
                if unanswered {
                    // A member this node counts as reachable did not answer: asked again, with
                    // the others, a retry period later.
                    let due = now.plus(self.config.submit_retry_ms);
                    self.submit_due = due;
                    self.based_retry_due = Some(due);
                    return false;
                }
                if unasked {
                    // Queued while the asks were out: a round of their own, at once.
                    return self.own_based_checked(now);
                }
                true
            }
        }
    }

    /// Whether `r` changes a record one of this leader's own removes or moves still waiting
    /// for their check made (a copy mark at a moved file's new path, or of a tombstone's copy:
    /// the same path and header version).
    fn waits_for_own_check(&self, r: &Record) -> bool {
        let Record::File(f) = r else { return false };
        f.based_on.is_none()
            && self.own_changes_unchecked()
            && self.pending.values().any(|p| {
                matches!(p, Record::File(g) if g.based_on.is_some() && g.version.node == self.me
                    && g.path == f.path && g.version == f.version)
            })
    }

    /// Whether this node leads with removes or moves of its own queued that have not passed
    /// [`Meta::own_based_checked`] yet. Its records then hold them applied, so its snapshots
    /// serve those records as they were before them ([`Meta::as_served`]).
    pub fn own_changes_unchecked(&self) -> bool {
        self.lease.known().is_some_and(|l| l.holder == self.me)
            && self.pending.values().any(|r| Self::based_of(r).is_some())
    }

    /// What a record of a remove or a move was decided from, if it is one.
    fn based_of(r: &Record) -> Option<&crate::meta::records::BasedOn> {
        match r {
            Record::File(f) => f.based_on.as_deref(),
            _ => None,
        }
    }

    /// A member's answer to [`Meta::own_based_checked`]: `records` are its records at the
    /// paths asked about that are newer than what the queued changes were decided from.
    pub(super) fn take_based_answer(&mut self, now: Millis, peer: &NodeId, answer: Option<Vec<Record>>, hlc: &mut Hlc) {
        let leading = self.is_leader(now);
        if !leading || !self.based_check.as_ref().is_some_and(|c| c.waiting.contains(peer)) {
            return; // late (the check ended, or this node no longer leads)
        }
        let Some(records) = answer else {
            // No answer came: the member is asked again in the next round.
            if let Some(c) = &mut self.based_check {
                c.waiting.remove(peer);
                c.failed.insert(peer.clone());
            }
            self.submit_due = now;
            self.try_submit(now, Some(hlc));
            return;
        };
        for r in records {
            let Record::File(newer) = &r else { continue };
            if r.shape_error().is_some() || !believable(&r, hlc) {
                continue;
            }
            let refuted: Vec<u64> = self
                .pending
                .iter()
                .filter_map(|(id, p)| {
                    let Record::File(f) = p else { return None };
                    let b = f.based_on.as_deref()?;
                    // Not the other record of the same decision (a move's, held there).
                    let sibling = newer.based_on.as_deref() == Some(b) && newer.version.node == f.version.node;
                    let mine = f.version.node == self.me && !self.submitting.contains(id);
                    (mine && b.path == newer.path && newer.version > b.version && !sibling).then_some(*id)
                })
                .collect();
            if refuted.is_empty() {
                continue;
            }
            for id in refuted {
                if !self.pending.contains_key(&id) {
                    continue; // undone already, with an earlier one
                }
                self.undo_changed(id, Some(r.clone()), hlc);
                if self.pending_remove(id).is_some() {
                    // Settled (refused): counted as the submit path counts it, so whoever waits
                    // on this change hears at once.
                    self.pending_taken += 1;
                    self.persist(MetaPersist::DeletePending(id));
                }
                self.based_refused += 1;
            }
            // Held by that member (the old leader acknowledged it): now in our log too.
            self.append_as_leader(r.clone(), peer.clone());
        }
        if let Some(c) = &mut self.based_check {
            c.waiting.remove(peer);
        }
        self.pump_appends();
        self.submit_due = now;
        self.try_submit(now, Some(hlc));
    }

    pub(super) fn request_catch_up(&mut self, leader: &NodeId) {
        if self.catch_up_in_flight.is_some() {
            return;
        }
        self.catch_up_in_flight = Some(self.now);
        let target = format!("/cluster/acn/meta/log?after={}", self.last_seq.0);
        self.send(leader, "GET", target, Vec::new(), MetaPurpose::CatchUp);
    }

    pub(super) fn request_snapshot(&mut self, leader: &NodeId) {
        if self.catch_up_in_flight.is_some() {
            return;
        }
        self.catch_up_in_flight = Some(self.now);
        self.snapshot_progress = None;
        self.send_snapshot_request(leader, None);
    }

    pub(super) fn send_snapshot_request(&mut self, from: &NodeId, after: Option<String>) {
        let target = match &after {
            Some(c) => format!("/cluster/acn/meta/snapshot?after={c}"),
            None => "/cluster/acn/meta/snapshot".to_string(),
        };
        self.send(from, "GET", target, Vec::new(), MetaPurpose::Snapshot { after });
    }

    /// Apply records that came from elsewhere; persist what changed.
    /// Records from the leader, outside its log's numbering (a snapshot page, an append of
    /// another numbering): each applied, an overwrite of ours a tombstone among them never saw
    /// sent back first ([`Meta::send_back_unseen_overwrite`]).
    pub(super) fn apply_remote(&mut self, records: impl IntoIterator<Item = Record>, hlc: &mut Hlc) {
        for r in records {
            if believable(&r, hlc) {
                self.send_back_unseen_overwrite(&r);
            }
            self.apply_one(&r, hlc);
        }
    }

    /// Apply one record from a peer (if believable) and persist it when it changed anything.
    /// Returns whether it did.
    pub(super) fn apply_one(&mut self, r: &Record, hlc: &mut Hlc) -> bool {
        if !believable(r, hlc) {
            return false;
        }
        for v in r.versions() {
            hlc.observe(v);
        }
        match self.state.apply(r) {
            Some(stored) => {
                let stored = stored.clone();
                self.persist(MetaPersist::PutRecord(stored));
                true
            }
            None => false,
        }
    }

    /// Entries from the leader whose numbering we follow: apply, and extend the log if they
    /// continue it. Entries beyond a hole are held back (bounded) until it fills, as the
    /// answers to several submits may arrive out of order. Returns false when a hole is left
    /// that nothing held back covers (an entry refused or not kept beyond it).
    pub(super) fn take_entries(&mut self, from: &NodeId, entries: Vec<PeerEntry>, hlc: &mut Hlc) -> bool {
        let mut contiguous = true;
        for e in entries {
            let e = match e {
                PeerEntry::Read(e) => *e,
                PeerEntry::Refused { seq, why } => {
                    let what = seq.map_or("an entry".to_string(), |s| format!("entry {}", s.0));
                    self.refuse(Some(from.clone()), what, &why);
                    // Its position is passed over (a hole in this node's log, which a peer
                    // reading this range later fills from a snapshot), so the log goes on.
                    if let Some(seq) = seq.filter(|s| Some(s.0) == self.last_seq.0.checked_add(1) && contiguous) {
                        self.last_seq = seq;
                        self.after_append();
                        self.take_held_back();
                    } else if seq.is_none_or(|s| s > self.last_seq) {
                        contiguous = false;
                    }
                    continue;
                }
            };
            for v in e.record.versions() {
                hlc.observe(v);
            }
            let stored = match believable(&e.record, hlc) {
                true => {
                    self.send_back_unseen_overwrite(&e.record);
                    self.state.apply(&e.record)
                }
                false => None,
            };
            if let Some(stored) = stored {
                let stored = stored.clone();
                self.persist(MetaPersist::PutRecord(stored));
            }
            if Some(e.seq.0) == self.last_seq.0.checked_add(1) {
                self.extend_log(e);
                self.take_held_back();
            } else if e.seq > self.last_seq {
                if self.ahead.len() < self.ahead_max() {
                    self.ahead.insert(e.seq, e);
                } else {
                    contiguous = false;
                }
            }
        }
        let last = self.last_seq;
        self.ahead.retain(|seq, _| *seq > last);
        if self.ahead.is_empty() {
            self.catch_up_due = None;
        }
        self.persist_log_meta();
        contiguous
    }

    /// Append `e` (the next number) to this node's log.
    fn extend_log(&mut self, e: Entry) {
        self.last_seq = e.seq;
        self.persist(MetaPersist::PutEntry(e.clone()));
        self.log.insert(e.seq, e);
        self.after_append();
    }

    /// The hole before entries held back may be filled now: take those that follow.
    fn take_held_back(&mut self) {
        while let Some(next) = self.last_seq.0.checked_add(1).and_then(|n| self.ahead.remove(&LogIndex(n))) {
            self.extend_log(next);
        }
    }

    /// Most entries held back beyond a hole: what the submits in flight can carry.
    fn ahead_max(&self) -> usize {
        self.config.batch_max.saturating_mul(self.config.submit_window.max(1))
    }

    /// Entries of `leader` arrived beyond a hole in this node's log: while a submit of ours is
    /// in flight, its answer (carrying the missing entries) may still come, so the hole is read
    /// from the leader only if it is still there `reorder_wait_ms` later; otherwise at once.
    pub(super) fn on_hole(&mut self, now: Millis, leader: &NodeId) {
        if self.submits.is_empty() {
            self.request_catch_up(leader);
        } else if self.catch_up_due.is_none() {
            self.catch_up_due = Some((now.plus(self.config.reorder_wait_ms), leader.clone()));
        }
    }

    /// Entries held back belong to a numbering this node no longer follows.
    pub(super) fn drop_held_back(&mut self) {
        self.ahead.clear();
        self.catch_up_due = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hlc::Version;
    use crate::meta::records::Setting;

    fn meta_with(n: usize, page: usize) -> Meta {
        let mut m =
            Meta::new(NodeId::new("a"), MetaConfig { snapshot_page_max: page, ..MetaConfig::default() }, Millis(0));
        for i in 0..n {
            let v = Version { wall_ms: 1 + i as u64, counter: 0, node: NodeId::new("a") };
            m.state.apply(&Record::Setting(Setting {
                key: format!("k{i:03}"),
                value: json!(i),
                removed: false,
                version: v,
            }));
        }
        m
    }

    #[test]
    fn a_snapshot_is_read_in_pages_that_cover_every_record_once() {
        let m = meta_with(23, 5);
        let mut seen = Vec::new();
        let mut after: Option<String> = None;
        for _ in 0..10 {
            let q = after.as_ref().map(|c| format!("after={c}")).unwrap_or_default();
            let r = m.answer_snapshot(&q);
            assert_eq!(r.refused, None);
            let page: Snapshot = serde_json::from_value(r.body).unwrap();
            assert!(page.records.settings.len() <= 5);
            seen.extend(page.records.settings.into_iter().map(|s| s.key));
            match page.next {
                Some(c) => after = Some(c),
                None => break,
            }
        }
        let want: Vec<String> = (0..23).map(|i| format!("k{i:03}")).collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn records_from_peers_that_break_the_bounds_or_come_from_the_far_future_are_dropped() {
        let mut m = meta_with(0, 5);
        let mut hlc = Hlc::new(NodeId::new("a"));
        hlc.set_physical(Millis(1_000_000));
        let ok = Version { wall_ms: 999_000, counter: 0, node: NodeId::new("b") };
        let bad_key =
            Record::Setting(Setting { key: "has space".into(), value: json!(1), removed: false, version: ok.clone() });
        let huge = Record::Setting(Setting {
            key: "big".into(),
            value: json!("x".repeat(70 * 1024)),
            removed: false,
            version: ok.clone(),
        });
        let future = Version { wall_ms: u64::MAX, counter: 0, node: NodeId::new("b") };
        let poison = Record::Setting(Setting { key: "p".into(), value: json!(1), removed: false, version: future });
        let fine = Record::Setting(Setting { key: "fine".into(), value: json!(1), removed: false, version: ok });
        m.apply_remote(vec![bad_key, huge, poison, fine], &mut hlc);
        assert_eq!(m.state().len(), 1);
        assert!(m.state().get(RecordKind::Setting, "fine").is_some());
    }

    #[test]
    fn batches_stop_at_8_mib_of_records_but_always_carry_one() {
        let big = |i: u64| {
            Record::Setting(Setting {
                key: format!("k{i}"),
                value: json!("x".repeat(60 * 1024)),
                removed: false,
                version: Version { wall_ms: i + 1, counter: 0, node: NodeId::new("a") },
            })
        };
        let records: Vec<Record> = (0..200).map(big).collect();
        let taken = take_bounded(records.iter(), 500, |r| *r);
        assert!(taken.len() < 200 && taken.len() > 100, "{}", taken.len());
        let bytes: usize = taken.iter().map(|r| serde_json::to_vec(*r).unwrap().len()).sum();
        assert!(bytes <= BATCH_MAX_BYTES);
        let huge = [Record::Setting(Setting {
            key: "h".into(),
            value: json!("y".repeat(9 << 20)),
            removed: false,
            version: Version::default(),
        })];
        assert_eq!(take_bounded(huge.iter(), 500, |r| *r).len(), 1);

        // The bodies built in one pass keep the same bounds, and read back as the struct.
        let (body, n) = json_batch("", "records", records.iter(), 500);
        assert!(n < 200 && n > 100, "{n}");
        assert!(body.len() <= BATCH_MAX_BYTES + 64, "{}", body.len());
        let read: SubmitBody<Record> = serde_json::from_slice(&body).unwrap();
        assert_eq!(read.records, records[..n].to_vec());
        let (_, n) = json_batch("", "records", huge.iter(), 500);
        assert_eq!(n, 1, "one item over the bound still goes");
        assert_eq!(json_batch("", "records", records.iter(), 3).1, 3, "count bounds too");
        let (empty, n) = json_batch("", "records", std::iter::empty::<Record>(), 500);
        assert_eq!((serde_json::from_slice::<Value>(&empty).unwrap(), n), (json!({"records": []}), 0));
    }

    #[test]
    fn an_append_body_built_in_one_pass_reads_back_as_the_append() {
        let lease = Lease { holder: NodeId::new("a"), term: Term(3) };
        let entries: Vec<Entry> = (1..=3u64)
            .map(|i| {
                let version = Version { wall_ms: i, counter: 0, node: NodeId::new("a") };
                let record = Record::Setting(Setting {
                    key: format!("k\"{i}"),
                    value: json!({"n": i}),
                    removed: false,
                    version: version.clone(),
                });
                Entry { seq: LogIndex(i), term: Term(3), record, version, origin: NodeId::new("b") }
            })
            .collect();
        let head = format!(
            "\"lease\":{},\"lastSeq\":{},",
            serde_json::to_string(&lease).unwrap(),
            serde_json::to_string(&LogIndex(9)).unwrap()
        );
        let (body, n) = json_batch(&head, "entries", entries.iter(), 500);
        assert_eq!(n, 3);
        let read: AppendBody<Entry> = serde_json::from_slice(&body).unwrap();
        let expected = AppendBody { lease, entries, last_seq: LogIndex(9), held_through: LogIndex(0) };
        assert_eq!(serde_json::to_value(&read).unwrap(), serde_json::to_value(&expected).unwrap());
        let per_peer: AppendBody<Entry> = serde_json::from_slice(&with_held_through(body, LogIndex(7))).unwrap();
        assert_eq!(per_peer.held_through, LogIndex(7));
        assert_eq!(per_peer.entries.len(), 3);
    }

    #[test]
    fn a_malformed_snapshot_cursor_is_a_400() {
        let m = meta_with(3, 5);
        assert_eq!(m.answer_snapshot("after=zz").refused, Some(ErrorKind::Invalid));
        assert_eq!(m.answer_snapshot(&format!("after={}", hex::encode("nokind"))).refused, Some(ErrorKind::Invalid));
        assert_eq!(m.answer_snapshot(&format!("after={}", hex::encode("bogus\nk"))).refused, Some(ErrorKind::Invalid));
    }

    /// A submit never ends between the records of one decision (a move's record and its
    /// tombstone): cut before the pair, unless the pair alone fills the batch.
    #[test]
    fn a_batch_does_not_split_the_records_of_one_decision() {
        use crate::hlc::Version;
        use crate::meta::records::{BasedOn, FileRecord};
        let file = |path: &str, based: Option<&str>| {
            let mut f: FileRecord = serde_json::from_value(json!({
                "id": "11111111-2222-4333-8444-555555555555", "path": path, "version": Version::default(),
            }))
            .unwrap();
            f.based_on = based.map(|b| Box::new(BasedOn { path: b.into(), version: Version::default() }));
            Record::File(f)
        };
        let records = [file("/a", None), file("/m", Some("/f")), file("/f", Some("/f")), file("/b", None)];
        for (n, cut) in [(1, 1), (2, 1), (3, 3), (4, 4)] {
            assert_eq!(decision_cut(records.iter().map(Meta::based_of), n), cut, "a batch of {n}");
        }
        let pair = [file("/m", Some("/f")), file("/f", Some("/f"))];
        assert_eq!(decision_cut(pair.iter().map(Meta::based_of), 1), 1, "a pair bigger than the batch goes as it can");
        let two_decisions = [file("/m", Some("/f")), file("/f", Some("/f")), file("/n", Some("/g"))];
        assert_eq!(decision_cut(two_decisions.iter().map(Meta::based_of), 2), 2);
    }
}
