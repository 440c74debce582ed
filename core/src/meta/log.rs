//! The replicated log's entries and what the metadata store asks the shell to persist
//! (reference-facts.md "Log entry").

use crate::hlc::Version;
use crate::ids::{LogIndex, NodeId, Term};
use crate::meta::records::{Record, RecordKey};
use serde::{Deserialize, Serialize};

/// One change in the replicated log: `{seq, term, kind, payload, version, origin}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    pub seq: LogIndex,
    pub term: Term,
    #[serde(flatten)]
    pub record: Record,
    /// The newest version in the record.
    pub version: Version,
    /// The node the change was submitted on.
    pub origin: NodeId,
}

/// The small, fixed part of the log's state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogMeta {
    /// The term whose numbering this node's log follows.
    pub term: Term,
    /// The holder of that term's lease.
    #[serde(default)]
    pub holder: Option<NodeId>,
    /// Highest sequence number this node holds (contiguously applied up to it).
    pub last_seq: LogIndex,
    /// Entries at or below this were compacted away.
    pub compacted_through: LogIndex,
    /// Positions at or below this that this node may not hold although its log passed them: a
    /// snapshot it adopted carried records it could not read, or its log compacted away a
    /// position it had passed over (so it can no longer name it).
    #[serde(default)]
    pub unread_through: LogIndex,
}

/// A submit waiting to reach the leader, persisted so it survives a restart.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pending {
    pub id: u64,
    pub record: Record,
    /// A record sent back after a snapshot ([`crate::meta::machine::Meta`]) travels without
    /// what it was decided from, so the leader does not check it again (it was acknowledged on
    /// its side); that is kept here and told to the leader beside it, which stores it with the
    /// record (the left-behind renames, the carry and the keep of a new file read it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_back_based: Option<crate::meta::records::BasedOn>,
}

/// What the metadata store asks the shell to write. The shell coalesces these per key and
/// writes them behind (one transaction every 50 ms): a later op on the same key replaces an
/// earlier one, so a put followed by a delete is a delete.
#[derive(Clone, Debug, PartialEq)]
// Each value is made once and moved once to the store's buffer; boxing the record would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum MetaPersist {
    PutRecord(Record),
    DeleteRecord(RecordKey),
    /// A tombstone was purged: remember its key with the tombstone's version, so an older copy
    /// arriving later (even after a restart) is refused.
    PutPurged(RecordKey, Version),
    /// A purged key beyond the bound of remembered ones is forgotten.
    DeletePurged(RecordKey),
    PutEntry(Entry),
    /// Compaction: drop every entry with `seq <= ` this.
    DeleteEntriesThrough(LogIndex),
    PutPending(Pending),
    DeletePending(u64),
    PutLogMeta(LogMeta),
    /// The node left its cluster: wipe the metadata tables, purged keys included (and nothing
    /// else).
    Clear,
}
