//! Answering peers' metadata requests (spec: "Metadata"): lease votes, appends, submits,
//! log pages and snapshots, each entry read on its own so one bad entry is refused alone.

use super::*;
use crate::meta::records::{BasedOn, FileRecord, Location};

/// What the answer to a submit carries back of the entries that took its records.
enum Echo {
    /// Their sequence numbers, one per submitted record (`null` for one not taken).
    Taken,
    /// The entries themselves, as an append.
    Append(Value),
}

impl Meta {
    /// `POST meta/lease`.
    pub fn answer_lease(&mut self, now: Millis, from: &NodeId, body: &[u8]) -> MetaReply {
        self.now = self.now.max(now);
        let b: LeaseBody = match serde_json::from_slice(body) {
            Ok(b) => b,
            Err(e) => return bad(format!("lease body: {e}")),
        };
        if &b.lease.holder != from {
            return bad("a lease can only be pushed by its holder");
        }
        match self.lease.on_push(now, b.lease.clone()) {
            PushVerdict::Refused(k) => reply(Some(ErrorKind::Conflict), json!({"lease": k})),
            PushVerdict::Accepted { .. } => {
                self.follow(&b.lease, b.last_seq, &b.digest, now);
                reply(None, json!({"ok": true, "lastSeq": self.last_seq, "settling": self.records_settling()}))
            }
        }
    }

    /// After accepting `lease` with the leader at `leader_last`: catch up, or reconcile.
    pub(super) fn follow(&mut self, lease: &Lease, leader_last: LogIndex, digest: &str, now: Millis) {
        if self.log_lease.as_ref() != Some(lease) {
            self.ahead_at_push = None;
            self.request_snapshot(&lease.holder);
            return;
        }
        let reconcile_due = now.since(self.last_anti_entropy) >= self.config.anti_entropy_every_ms;
        // Ahead of the leader's number at a push is, under one lease, nearly always a push
        // overtaken by appends sent after it (a leader that restarts claims a new term, caught
        // above). Only a leader still short, at this push, of what this node held at the
        // previous one lacks entries this node holds: the numbering diverged. (Before, being
        // ahead at one push was enough: under a steady stream of writes every renewal could
        // start a full snapshot.)
        let leader_lacks_ours = self.ahead_at_push.is_some_and(|ours| leader_last < ours);
        self.ahead_at_push = (self.last_seq > leader_last).then_some(self.last_seq);
        if self.last_seq < leader_last {
            self.request_catch_up(&lease.holder);
        } else if leader_lacks_ours && reconcile_due {
            // Reconcile by snapshot, which also sends our extras back.
            self.last_anti_entropy = now;
            self.ahead_at_push = None;
            self.request_snapshot(&lease.holder);
        } else if self.last_seq == leader_last
            && self.pending.is_empty()
            && !digest.is_empty()
            && digest != self.state.digest()
            && now.since(self.last_anti_entropy) >= self.config.anti_entropy_every_ms
        {
            self.last_anti_entropy = now;
            self.request_snapshot(&lease.holder);
        }
        if !self.pending.is_empty() {
            self.submit_due = Millis::ZERO;
            // (Following another node: nothing of this node's own goes into a log here.)
            self.try_submit(now, None);
        }
    }

    /// `POST meta/append`.
    pub fn answer_append(&mut self, now: Millis, from: &NodeId, body: &[u8], hlc: &mut Hlc) -> MetaReply {
        self.now = self.now.max(now);
        let b: AppendBody<Box<RawValue>> = match serde_json::from_slice(body) {
            Ok(b) => b,
            Err(e) => return bad(format!("append body: {e}")),
        };
        self.take_append(now, from, b.lease, read_entries(b.entries), b.last_seq, Some(b.held_through), hlc)
    }

    /// The entries a submit's answer carried, taken as an append from `from` is (its answer has
    /// no one to go to, so it names nothing passed over).
    pub(super) fn take_echoed_append(&mut self, now: Millis, from: &NodeId, body: &[u8], hlc: &mut Hlc) {
        self.now = self.now.max(now);
        let b: AppendBody<Box<RawValue>> = match serde_json::from_slice(body) {
            Ok(b) => b,
            Err(e) => return self.refused_by(from, "the append in a submit's answer", e.to_string()),
        };
        let _ = self.take_append(now, from, b.lease, read_entries(b.entries), b.last_seq, None, hlc);
    }

    /// Take `entries` sent by `from` as the holder of `lease`, whose log ends at `last_seq`:
    /// an append, or the entries a submit's answer gave back ([`Meta::on_response`]). For an
    /// append (`report_after`: how far the leader holds this node confirmed), the answer names
    /// the positions after that which this node passed over (`passedOver`): its log's end
    /// reaches past them, but it does not hold them, and an acknowledgement must not count
    /// this node for a change it could not read.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn take_append(
        &mut self,
        now: Millis,
        from: &NodeId,
        lease: Lease,
        entries: Vec<PeerEntry>,
        last_seq: LogIndex,
        report_after: Option<LogIndex>,
        hlc: &mut Hlc,
    ) -> MetaReply {
        if &lease.holder != from {
            return bad("appends come only from the lease holder");
        }
        if let PushVerdict::Refused(k) = self.lease.on_push(now, lease.clone()) {
            return reply(Some(ErrorKind::Conflict), json!({"lease": k}));
        }
        if self.log_lease.as_ref() != Some(&lease) {
            // Another leader's numbering: the records are still good, the positions are not.
            let records: Vec<Record> = entries
                .into_iter()
                .filter_map(|e| match e {
                    PeerEntry::Read(e) => Some(e.record),
                    PeerEntry::Refused { .. } => None,
                })
                .collect();
            self.apply_remote(records, hlc);
            self.request_snapshot(&lease.holder);
            // Our log's end counts in another numbering: it says nothing of which of the
            // leader's entries we hold (a number past the leader's own made it count entries
            // we never received as confirmed, and never send them again). None, until the
            // snapshot puts us on its numbering.
            return reply(None, json!({"ok": true, "lastSeq": LogIndex(0), "settling": true}));
        } else if !self.take_entries(from, entries, hlc) {
            self.request_catch_up(&lease.holder);
        } else if !self.ahead.is_empty() {
            self.on_hole(now, &lease.holder);
        } else if self.last_seq < last_seq {
            self.request_catch_up(&lease.holder);
        }
        let mut answer = json!({"ok": true, "lastSeq": self.last_seq, "settling": self.records_settling()});
        if let Some(after) = report_after {
            let passed_over = self.passed_over_after(after);
            if !passed_over.is_empty() {
                answer["passedOver"] = json!(passed_over);
            }
            if self.unread_through > after {
                answer["unreadThrough"] = json!(self.unread_through);
            }
        }
        reply(None, answer)
    }

    /// The positions after `after`, up to this log's end, that this node passed over (holes in
    /// its log: entries it could not read). Only positions its log still covers are known;
    /// that is at most the kept entries plus one compaction's worth.
    pub(super) fn passed_over_after(&self, after: LogIndex) -> Vec<LogIndex> {
        let mut next = after.max(self.compacted_through).0.saturating_add(1);
        let mut holes = Vec::new();
        if next > self.last_seq.0 {
            return holes; // (a range whose start is past its end panics)
        }
        for (seq, _) in self.log.range(LogIndex(next)..=self.last_seq) {
            holes.extend((next..seq.0).map(LogIndex));
            next = seq.0.saturating_add(1);
        }
        if next <= self.last_seq.0 {
            holes.extend((next..=self.last_seq.0).map(LogIndex));
        }
        holes
    }

    /// What a submitted record was decided from, when that changed since: the record carries
    /// a [`crate::meta::records::BasedOn`], its header is new here (a copy of a record taken
    /// already is not checked again), and this leader's record at the based-on path is newer
    /// than what it was decided from (another node's change the deciding node had not seen;
    /// not the other record of the same decision), or that path's record was refused earlier in this very submit (`refused_paths`: a move
    /// of a file whose own move was just refused). A leader that holds an older record there,
    /// or none, has not seen what the deciding node saw (a new leader still catching up):
    /// the change is taken.
    fn base_gone<'r>(
        &self,
        r: &'r Record,
        from: &NodeId,
        refused_paths: &BTreeSet<String>,
    ) -> Option<&'r crate::meta::records::BasedOn> {
        let Record::File(f) = r else { return None };
        let based = f.based_on.as_deref()?;
        if &f.version.node != from {
            return None; // another node's record, passed on: not the submitter's decision
        }
        if self.state.file(&f.path).is_some_and(|here| here.version >= f.version) {
            return None;
        }
        // The other record of the same decision (a move's tombstone, taken first when records
        // come back in key order after a snapshot) is no change since.
        let sibling = |here: &crate::meta::records::FileRecord| {
            here.based_on.as_deref() == Some(based) && here.version.node == f.version.node
        };
        let newer = self.state.file(&based.path).is_some_and(|here| here.version > based.version && !sibling(here))
            && !self.decided_from_kept(f, based);
        (newer || refused_paths.contains(&based.path)).then_some(based)
    }

    /// An overwrite that raced a move of its file (issue 18, "Acknowledged means safe"): the
    /// submitted record `r` is a put over the file at its path (same id), decided before its
    /// node heard of a move this leader took meanwhile (the move's tombstone there was decided
    /// from an older record: it never saw this content), and the moved file still holds content
    /// older than `r`'s (its record was made from that path, at a version before `r`'s), or
    /// `r`'s own, carried already (then `r` is a copy of it marked on its node meanwhile, or
    /// the put again). Returns the move's tombstone and the moved file's record.
    ///
    /// Left to last-writer-wins, the overwrite lost to the newer tombstone and the move kept the
    /// old content: the put was answered `replicated` and its content was gone, and the node
    /// that took it deleted its bytes (they sat at the old path under a tombstone) and dropped
    /// the old ones it had kept aside, which the moved file's record named (a 1-copy file lost
    /// both contents). Or, newer than the tombstone, the overwrite brought the old path back
    /// with the moved file's id, and no copy was ever renamed to the new path. The leader orders
    /// them instead as the put, then the move ([`Meta::carry_overwrite`]). Not for a move still
    /// waiting for this leader's own check ([`Meta::leader_may_lag`]): a submit holding such an
    /// overwrite waits until the check has passed or refuted the move
    /// ([`Meta::meets_own_unchecked`]).
    ///
    /// `submit` is the submit `r` came in: a put of the moved content there beside a tombstone
    /// of the moved file at its new path is a move back, not an overwrite.
    fn moved_away_under(&self, r: &Record, submit: &[Box<RawValue>]) -> Option<(FileRecord, FileRecord)> {
        let Record::File(put) = r else { return None };
        if put.removed || put.is_dir || put.based_on.is_some() {
            return None;
        }
        let based_here = |b: &Option<Box<BasedOn>>, carried: bool| {
            b.as_deref().is_some_and(|b| {
                b.path == put.path && (b.version < put.version || (carried && b.version == put.version))
            })
        };
        let here = self.state.file(&put.path).filter(|h| !h.is_dir)?;
        // (Nor a record of this leader's own come back over a tombstone it wrote itself: a
        // follower that held a file this leader kept over a tombstone may send it back on
        // taking the remove or move of it the leader took above it, reading it as never seen;
        // carried, it would put older content on the moved file. A put of this node's own from
        // before it led, over another node's tombstone, is carried as any.)
        if put.version.node == self.me && here.version.node == self.me {
            return None;
        }
        let tomb_here =
            here.removed && here.id == put.id && here.version != put.version && based_here(&here.based_on, false);
        // A new file of another id kept over the move's tombstone ([`Meta::keep_over_tombstone`])
        // hides that tombstone: the moved record names the path and version it came from.
        let other_here = !here.removed && here.id != put.id;
        if !tomb_here && !other_here {
            return None;
        }
        let moved = self
            .state
            .files_with_id(&put.id)
            .filter(|g| !g.removed && !g.is_dir && g.path != put.path && based_here(&g.based_on, true))
            .max_by(|a, b| a.version.cmp(&b.version))?;
        let tomb =
            if tomb_here { here } else { &FileRecord { path: put.path.clone(), removed: true, ..moved.clone() } };
        let carried_already = moved.based_on.as_deref().is_some_and(|b| b.version == put.version);
        if carried_already && moved.checksum != put.checksum {
            return None;
        }
        // Content the move took already, or the moved file holds: nothing to carry, unless the
        // put, newer than the move's tombstone, would bring the old path back beside the moved
        // file (the same bytes put again: the file at both paths with one id). (A move back to
        // the old path sent back by a build that strips what it was decided from looks like
        // such a put: carried, it is undone, the file kept at the new path.)
        let same_content = put.checksum == tomb.checksum || put.checksum == moved.checksum;
        if !carried_already && same_content {
            let brings_old_path_back = tomb_here && put.version > here.version;
            // A move back sent by a build that strips what it was decided from: its tombstone
            // at the new path travels in the same submit (carried, the move back was undone,
            // or, the tombstone newer than the carry, the file was left at neither path).
            let moved_back = || {
                submit.iter().any(|raw| {
                    matches!(serde_json::from_str::<Record>(raw.get()),
                        Ok(Record::File(t)) if t.removed && t.id == moved.id && t.path == moved.path)
                })
            };
            if !brings_old_path_back || moved_back() {
                return None;
            }
        }
        let unchecked = self.unchecked_own();
        if unchecked.contains_key(&(tomb.path.as_str(), &tomb.version))
            || unchecked.contains_key(&(moved.path.as_str(), &moved.version))
        {
            return None;
        }
        Some((tomb.clone(), moved.clone()))
    }

    /// A file record and a tombstone of another file at the same path, the tombstone newer,
    /// where the remove or move that wrote the tombstone never saw that file (a new file put
    /// through a node that did not know the file the tombstone took from the path; or the
    /// two made on the two sides of a partition): `r` is one of them, arriving, and this
    /// leader holds the other. The tombstone was decided from the file of its own id, at the
    /// version its `based_on` names (when it still carries it: a record sent back after a
    /// snapshot does not), so a record of another file at that path newer than that is one it
    /// never took. Returns that live record and the tombstone.
    fn file_a_tombstone_never_saw(&self, r: &Record) -> Option<(FileRecord, FileRecord)> {
        let Record::File(incoming) = r else { return None };
        if incoming.is_dir {
            return None;
        }
        let here = self.state.file(&incoming.path).filter(|h| !h.is_dir && h.id != incoming.id)?;
        let (live, tomb) = match (incoming.removed, here.removed) {
            (false, true) => (incoming, here),
            (true, false) => (here, incoming),
            _ => return None,
        };
        if tomb.version <= live.version || tomb.based_on.as_deref().is_some_and(|b| b.version >= live.version) {
            return None;
        }
        // Not over a remove or move of this leader's own still waiting for its check: the
        // check may refute it, and the record it brings back (an overwrite newer than the file
        // kept here) must then win by last-writer-wins, not lose to a record written above
        // the refuted tombstone. (A submit holding such a file waits for the check before
        // it gets here, [`Meta::meets_own_unchecked`]; the guard stays for any other way in.)
        if self.unchecked_own().contains_key(&(tomb.path.as_str(), &tomb.version)) {
            return None;
        }
        Some((live.clone(), tomb.clone()))
    }

    /// A move sent back after a snapshot (`r`, one of its two records, with the `based_on`
    /// restored: [`Meta::answer_submit`]) that an overwrite of the file this leader holds at
    /// the old path never saw (the same id, newer than what the move was decided from): the
    /// move was made on one side of a partition, the overwrite on the other, and the move's
    /// tombstone, older, lost to it. Returns the overwrite, the move's tombstone (as the moved
    /// record names it) and the moved record, for [`Meta::carry_overwrite`]: ordered as the
    /// put, then the move, as when the overwrite arrives second. Before, the moved record was
    /// taken beside the overwrite, and the file lived at both paths with one id (simulator
    /// `--races` seed 6827).
    ///
    /// `decisions` holds, for the records of each decision sent back in the same submit, the
    /// newest version among them ([`Meta::sent_back_plan`]): the tombstone written again at the
    /// old path goes above the move's own tombstone, which may follow in that submit (it must
    /// lose to it there, whichever of the two comes first).
    pub(super) fn overwrite_a_sent_back_move_never_saw(
        &self,
        r: &Record,
        decisions: &[SentBackDecision],
    ) -> Option<(FileRecord, FileRecord, FileRecord)> {
        let Record::File(f) = r else { return None };
        let b = f.based_on.as_deref()?;
        let over = self.overwrite_a_move_never_saw(f)?;
        let moved = self
            .state
            .files_with_id(&f.id)
            .filter(|g| !g.removed && !g.is_dir && g.path != b.path && g.based_on.as_deref() == Some(b))
            .max_by(|x, y| x.version.cmp(&y.version))?;
        // (The same bytes put again are carried too: the old path is back beside the moved
        // file, and the carry removes it.)
        let decided = decisions.iter().find(|d| d.id == f.id && &d.based == b).map(|d| d.newest.clone());
        let version = decided.map_or(moved.version.clone(), |d| d.max(moved.version.clone()));
        let tomb = FileRecord { path: b.path.clone(), removed: true, version, ..moved.clone() };
        Some((over.clone(), tomb, moved.clone()))
    }

    /// The overwrite this leader holds at the old path of a move `f` is a record of (same id,
    /// live, newer than what the move was decided from, and no move's record itself).
    fn overwrite_a_move_never_saw(&self, f: &FileRecord) -> Option<&FileRecord> {
        let b = f.based_on.as_deref()?;
        self.state
            .file(&b.path)
            .filter(|o| !o.removed && !o.is_dir && o.id == f.id && o.version > b.version && o.based_on.is_none())
    }

    /// The order a submit's records are taken in, and the decisions among its records sent back
    /// after a snapshot. In the order sent, but for a move's tombstone sent back before the
    /// move's record at the new path (key order) where this leader holds an overwrite at the
    /// old path that the move never saw: it is taken right after that record, so the move is
    /// carried past the overwrite ([`Meta::overwrite_a_sent_back_move_never_saw`]) whichever
    /// path sorts first. Before, the tombstone first dropped the overwrite by last-writer-wins,
    /// while the record first carried it (a review of the seed 6827 fix).
    fn sent_back_plan(
        &self,
        records: &[Box<RawValue>],
        sent_back: &BTreeMap<usize, BasedOn>,
    ) -> (Vec<usize>, Vec<SentBackDecision>) {
        let mut order: Vec<usize> = (0..records.len()).collect();
        if sent_back.is_empty() {
            return (order, Vec::new());
        }
        let restored: Vec<(usize, FileRecord)> = sent_back
            .iter()
            .filter_map(|(i, based)| {
                let Ok(Record::File(f)) = serde_json::from_str::<Record>(records.get(*i)?.get()) else { return None };
                f.based_on.is_none().then(|| (*i, FileRecord { based_on: Some(Box::new(based.clone())), ..f }))
            })
            .collect();
        let mut decisions: Vec<SentBackDecision> = Vec::new();
        for (_, f) in &restored {
            let Some(based) = f.based_on.as_deref() else { continue };
            match decisions.iter_mut().find(|d| d.id == f.id && &d.based == based) {
                Some(d) => d.newest = d.newest.clone().max(f.version.clone()),
                None => decisions.push(SentBackDecision {
                    id: f.id.clone(),
                    based: based.clone(),
                    newest: f.version.clone(),
                }),
            }
        }
        for (i, tomb) in restored.iter().filter(|(_, f)| f.removed) {
            let based = tomb.based_on.as_deref();
            let sibling = restored.iter().find(|(j, g)| {
                j > i
                    && !g.removed
                    && !g.is_dir
                    && g.id == tomb.id
                    && g.path != tomb.path
                    && g.based_on.as_deref() == based
            });
            let Some((j, _)) = sibling else { continue };
            if self.overwrite_a_move_never_saw(tomb).is_none() {
                continue;
            }
            let (Some(from), Some(to)) = (order.iter().position(|k| k == i), order.iter().position(|k| k == j)) else {
                continue;
            };
            let tomb_index = order.remove(from);
            // (`to`, past `from`, moved down by one with the removal: the tombstone lands
            // right after the record.)
            order.insert(to, tomb_index);
        }
        (order, decisions)
    }

    /// The record this leader wrote again for a submitted live file record (`path`, `id`,
    /// `version`) by [`Meta::keep_over_tombstone`], if that is what it holds there: live, the
    /// same file, newer (written again by this leader, or by one before it: the leader's record
    /// either way, and in its log already).
    fn written_again_at(&self, path: &str, id: &crate::ids::FileId, version: &Version) -> Option<Record> {
        let here = self.state.file(path)?;
        (!here.removed && !here.is_dir && &here.id == id && &here.version > version).then(|| Record::File(here.clone()))
    }

    /// Keep the file `live` that the tombstone `tomb` of another file never saw
    /// ([`Meta::file_a_tombstone_never_saw`]): its record is written again, unchanged but for
    /// its version, just above the tombstone's, so last-writer-wins keeps it everywhere.
    /// Before, a new file put through a node that never knew the file a move took from that
    /// path, answered `replicated`, was dropped by the move's tombstone, newer by version, and
    /// its node deleted its bytes as the tombstone's copy (simulator `--races` seed 5935). The
    /// version is just above the tombstone's (not this leader's clock): a write decided after
    /// them and still on its way stays newer. Returns the record written, if it was.
    pub(super) fn keep_over_tombstone(&mut self, live: FileRecord, tomb: &FileRecord, hlc: &mut Hlc) -> Option<Record> {
        let above = tomb.version.clone().max(live.version.clone());
        self.write_again_above(live, above, hlc)
    }

    /// A later put of a file this leader kept over a tombstone ([`Meta::keep_over_tombstone`],
    /// [`Meta::kept_recently`]): the same file (`id`) at the same path, newer than the put that
    /// was kept, while this leader still holds the record it wrote for that put. It too is
    /// older than the tombstone the first was kept over (else it wins by itself), and would
    /// lose to the kept record, written just above that tombstone: the newer content lost to
    /// the older (found by a review; two quick writes of one new file, the second sent while
    /// the first's submit was in flight, meet it so). Returns the version to write it above.
    ///
    /// So too a remove or a move of that file its node decided from the put kept, before it
    /// heard of the keep (its tombstone at that path, decided from the version kept): taken
    /// above the kept record. Before, a remove lost to it and the removed file came back, and a
    /// move was refused `changed` ([`Meta::base_gone`]) and undone. Nothing is taken so over a
    /// tombstone (an overwrite racing the kept file's move is carried, [`Meta::moved_away_under`];
    /// a remove sent again finds its tombstone taken).
    fn after_kept(&self, r: &Record) -> Option<Version> {
        let Record::File(f) = r else { return None };
        if f.is_dir || self.kept_recently.is_empty() {
            return None;
        }
        let (id, kept_from, kept_at) = self.kept_recently.get(&f.path)?;
        let still = self.state.file(&f.path).is_some_and(|h| &h.version == kept_at && !h.removed);
        let decided_from_kept = match (f.removed, f.based_on.as_deref()) {
            (false, _) => true,
            (true, Some(b)) => b.path == f.path && &b.version == kept_from,
            (true, None) => false,
        };
        // (Not a record this leader wrote for the keep, come back: a node that held the file
        // kept sends it back on taking the tombstone of its remove, which it reads as one that
        // never saw it.)
        let theirs = f.version.node != self.me;
        (id == &f.id && decided_from_kept && theirs && &f.version > kept_from && &f.version < kept_at && still)
            .then(|| kept_at.clone())
    }

    /// Whether `f`, decided from `based`, was decided from a put this leader kept over a
    /// tombstone ([`Meta::after_kept`]) and holds the record written for it (or for a change
    /// after it) there: no change since, though the version there is the leader's.
    fn decided_from_kept(&self, f: &FileRecord, based: &BasedOn) -> bool {
        self.kept_recently.get(&based.path).is_some_and(|(id, from, at)| {
            id == &f.id && from == &based.version && self.state.file(&based.path).is_some_and(|h| &h.version == at)
        })
    }

    /// Remember that the put of `id` at `path` at version `from` was written again at `at`
    /// ([`Meta::after_kept`]); the last [`KEPT_RECENTLY_MAX`] paths kept, the oldest forgotten
    /// first.
    fn note_kept(&mut self, path: String, id: crate::ids::FileId, from: Version, at: Version) {
        if !self.kept_recently.contains_key(&path) {
            self.kept_order.push_back(path.clone());
            while self.kept_order.len() > KEPT_RECENTLY_MAX {
                if let Some(oldest) = self.kept_order.pop_front() {
                    self.kept_recently.remove(&oldest);
                }
            }
        }
        self.kept_recently.insert(path, (id, from, at));
    }

    /// Write `live` again, unchanged but for its version, just above `above`.
    fn write_again_above(&mut self, live: FileRecord, above: Version, hlc: &mut Hlc) -> Option<Record> {
        let version = self.just_above(above);
        // (What it was decided from stays with it: a moved file kept so still names where it
        // came from.)
        let again = Record::File(FileRecord { version, ..live });
        if !self.apply_one(&again, hlc) {
            return None;
        }
        self.append_as_leader(again.clone(), self.me.clone());
        Some(again)
    }

    /// The overwrite `put` took effect before the move (`tomb` at its path, `moved` the file at
    /// its new one; [`Meta::moved_away_under`]): the moved file's record takes the overwrite's
    /// content and copies (newer than every copy mark there), and records that it carries the
    /// content `put` made at its path (`based_on`: a later, newer overwrite that raced the same
    /// move is carried too). A record of content carried already brings its copies alone (a
    /// copy its node marked before it heard of the move). Should the put have brought the old
    /// path back (its version newer than the tombstone's), the tombstone is written again,
    /// newer.
    ///
    /// Each holder's copy at the old path, the overwrite's bytes, is then renamed to the new
    /// path ([`crate::node::files::DiskAction::Rename`]: the tombstone and the moved record list it
    /// with the same content), and the bytes it replaced there go.
    ///
    /// The versions written are just above those of the records they order (not the leader's
    /// clock now): a write decided after them and still on its way (a new file at the old path,
    /// an overwrite at the new one) stays newer and wins, as it would have without the carry.
    ///
    /// Returns the records written (the submitter of the put takes them with its answer: the
    /// leader's own entries otherwise reach it in a later append, and in between it held the
    /// tombstone over the put's bytes with the moved record naming other content, and deleted
    /// them).
    pub(super) fn carry_overwrite(
        &mut self,
        put: &FileRecord,
        tomb: FileRecord,
        moved: FileRecord,
        hlc: &mut Hlc,
    ) -> Vec<Record> {
        let mut written = Vec::new();
        // (Not over a file of another id kept there: the move's tombstone never took it.)
        if let Some(here) = self.state.file(&put.path).filter(|f| !f.removed && f.id == put.id) {
            let again = FileRecord {
                removed: true,
                version: self.just_above(put.version.clone().max(tomb.version.clone())),
                repl: None,
                locations: here.locations.clone(),
                ..tomb
            };
            let again = Record::File(again);
            if self.apply_one(&again, hlc) {
                written.push(again.clone());
                self.append_as_leader(again, self.me.clone());
            }
        }
        let copies_only = moved.based_on.as_deref().is_some_and(|b| b.version == put.version);
        let carried = if copies_only {
            // A mark of a carried copy made after the put (before its node heard of the move)
            // lands just above the carry's own (a mark made since at the new path, which saw
            // the carry, stays newer); the put's own copies, sent again, add nothing.
            // It keeps the content version of the carried copy there, so it is ordered among
            // that copy's marks by when it was made.
            let mut carried = moved;
            for l in put.locations.iter().filter(|l| l.updated > put.version) {
                let updated = self.just_above(l.updated.clone().max(carried.version.clone()));
                let base = carried
                    .locations
                    .iter()
                    .find(|c| c.volume_id == l.volume_id && c.checksum.eq_ignore_ascii_case(&l.checksum))
                    .map(|c| c.content_version().clone());
                let mark = match base {
                    Some(content) if content < updated => Location { updated, content: Some(content), ..l.clone() },
                    _ => l.restamped(updated),
                };
                carried.upsert_location(mark);
            }
            carried
        } else {
            // The put's copies replace the moved record's there (those named the old content):
            // newer than any mark of them.
            let vols = |l: &&Location| put.locations.iter().any(|p| p.volume_id == l.volume_id);
            let newest = moved.locations.iter().filter(vols).map(|l| l.updated.clone()).max();
            let headers = put.version.clone().max(moved.version.clone());
            let version = self.just_above(newest.map_or(headers.clone(), |n| n.max(headers)));
            let mut carried = FileRecord {
                size: put.size,
                mod_time: put.mod_time,
                checksum: put.checksum.clone(),
                primary: put.primary.clone(),
                based_on: Some(Box::new(BasedOn { path: put.path.clone(), version: put.version.clone() })),
                version: version.clone(),
                ..moved
            };
            for l in &put.locations {
                carried.upsert_location(l.restamped(version.clone()));
            }
            carried
        };
        let carried = Record::File(carried);
        if self.apply_one(&carried, hlc) {
            written.push(carried.clone());
            self.append_as_leader(carried, self.me.clone());
        }
        written
    }

    /// The smallest version of this node's after `v`.
    fn just_above(&self, v: Version) -> Version {
        match v.counter.checked_add(1) {
            Some(counter) => Version { wall_ms: v.wall_ms, counter, node: self.me.clone() },
            None => Version { wall_ms: v.wall_ms.saturating_add(1), counter: 0, node: self.me.clone() },
        }
    }

    /// The path of a live file record in `records` at the path a remove or move of this
    /// leader's own still waiting for its check ([`Meta::own_based_checked`]) was decided from,
    /// if one is there. Such a record is a write the change may never have seen (a new file put
    /// through a node that did not know the old one, or an overwrite of it decided before its
    /// node heard of the change): once the check has passed, the leader keeps it over the
    /// tombstone ([`Meta::keep_over_tombstone`]) or carries it to the moved file
    /// ([`Meta::carry_overwrite`]); refuted, last-writer-wins decides, as without the change.
    /// Taken before the check ends, it lost to the tombstone (or to a new file of the leader's
    /// own put at the old path since): acknowledged, and gone. So the leader takes none of the
    /// submit meanwhile (nothing of it, so that no later record of the same file or decision
    /// in it passes the one that waits) and the submitter sends it again
    /// [`OWN_CHECK_RETRY_MS`] later. Only while this leader has such changes queued: no lookup
    /// on a put's way in otherwise, and then each record's kind and path alone are read.
    fn meets_own_unchecked(&self, records: &[Box<RawValue>]) -> Option<String> {
        let unchecked = self.unchecked_own();
        if unchecked.is_empty() {
            return None;
        }
        let decided_from: BTreeSet<&str> = unchecked.values().map(|b| b.path.as_str()).collect();
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct FileHead {
            path: String,
            #[serde(default)]
            removed: bool,
            #[serde(default)]
            is_dir: bool,
        }
        #[derive(Deserialize)]
        struct Head {
            kind: String,
            payload: FileHead,
        }
        records.iter().find_map(|raw| {
            let Ok(Head { kind, payload: f }) = serde_json::from_str::<Head>(raw.get()) else { return None };
            (kind == "file" && !f.removed && !f.is_dir && decided_from.contains(f.path.as_str())).then_some(f.path)
        })
    }

    /// `POST meta/submit` (leader only).
    pub fn answer_submit(&mut self, now: Millis, from: &NodeId, body: &[u8], hlc: &mut Hlc) -> MetaReply {
        self.now = self.now.max(now);
        if !self.is_leader(now) {
            return reply(
                Some(ErrorKind::Conflict),
                json!({"error": {"code": "not_leader", "message": "this node is not the leader"}, "lease": self.lease.known()}),
            );
        }
        let b: SubmitBody<Box<RawValue>> = match serde_json::from_slice(body) {
            Ok(b) => b,
            Err(e) => return bad(format!("submit body: {e}")),
        };
        if b.records.len() > self.config.batch_max * 4 {
            return bad("too many records in one submit");
        }
        // Each record on its own: one that cannot be taken is refused (and named in the
        // answer, so the submitter drops it and logs why) without holding up the others.
        let mut refused = Vec::new();
        let first_new = LogIndex(self.last_seq.0.saturating_add(1));
        let mut taken: Vec<Option<LogIndex>> = vec![None; b.records.len()];
        let mut refused_paths = BTreeSet::new();
        // Files a tombstone of another file would have dropped, written again above it
        // ([`Meta::keep_over_tombstone`]): the submitter takes them with this answer.
        let mut written_again: Vec<Record> = Vec::new();
        // The records this submit's refusals made (path, header version, what they were
        // decided from): a later record of this submit at the same path and version, with no
        // `BasedOn` of its own, is a change of one of them (a copy mark) and goes with it.
        let mut refused_made: Vec<(String, Version, BasedOn)> = Vec::new();
        let mark_of_refused = |r: &Record, made: &[(String, Version, BasedOn)]| -> Option<BasedOn> {
            let Record::File(f) = r else { return None };
            if f.based_on.is_some() {
                return None;
            }
            made.iter().find(|(p, v, _)| *p == f.path && *v == f.version).map(|(_, _, b)| b.clone())
        };
        if let Some(path) = self.meets_own_unchecked(&b.records) {
            let message = format!(
                "cluster:{path} has a remove or move of this leader's own waiting for its check: send the records again shortly"
            );
            return reply(
                Some(ErrorKind::Unavailable),
                json!({"error": {"code": "own_check_pending", "message": message}, "retryMs": OWN_CHECK_RETRY_MS}),
            );
        }
        let sent_back: BTreeMap<usize, BasedOn> = b.sent_back.into_iter().map(|s| (s.index, s.based_on)).collect();
        let records = b.records;
        let (order, decisions) = self.sent_back_plan(&records, &sent_back);
        for i in order {
            let raw = &records[i];
            let mut restored = false;
            let r = match serde_json::from_str::<Record>(raw.get()) {
                // A record sent back after a snapshot, held on its side already: stored with
                // what it was decided from, and not checked again.
                Ok(Record::File(mut f)) if f.based_on.is_none() && sent_back.contains_key(&i) => {
                    f.based_on = sent_back.get(&i).cloned().map(Box::new);
                    restored = true;
                    Ok(Record::File(f))
                }
                other => other,
            };
            let r = match r {
                Ok(r) => match r.shape_error() {
                    None => r,
                    Some(why) => {
                        refused.push(json!({"index": i, "why": why}));
                        self.refuse(
                            Some(from.clone()),
                            format!("submitted record {}/{}", r.kind().as_str(), r.key()),
                            why,
                        );
                        continue;
                    }
                },
                Err(e) => {
                    let why = format!("unreadable record: {e}");
                    refused.push(json!({"index": i, "why": why}));
                    self.refuse(Some(from.clone()), format!("submitted record {i}"), &why);
                    continue;
                }
            };
            if !believable(&r, hlc) {
                // A version this far ahead of the leader's clock would win over every later
                // write: refused, and named so the submitter's acknowledgement says so.
                let why = format!(
                    "its version is more than {} minutes ahead of the leader's clock (the submitting node's clock runs ahead)",
                    crate::hlc::AHEAD_MAX_MS / 60_000
                );
                self.refuse(Some(from.clone()), format!("submitted record {}/{}", r.kind().as_str(), r.key()), &why);
                refused.push(json!({"index": i, "why": why}));
                continue;
            }
            let gone = match restored {
                true => None,
                false => {
                    self.base_gone(&r, from, &refused_paths).cloned().or_else(|| mark_of_refused(&r, &refused_made))
                }
            };
            if let Some(based) = gone {
                // Decided from a record this leader no longer holds: refused by name, with
                // this leader's record at its key, so the submitter undoes it. (As a snapshot
                // serves it: a change of this leader's own still waiting for its check does not
                // leave it here, or the submitter would take it and drop the newer record the
                // check is to find on it.)
                let why = format!("cluster:{} changed after the submitting node decided from it", based.path);
                let unchecked = self.unchecked_own();
                let current = self.state.get(r.kind(), &r.key()).and_then(|c| self.as_served(c, &unchecked));
                refused.push(json!({"index": i, "why": why, "changed": true, "current": current}));
                self.based_refused += 1;
                refused_paths.insert(r.key());
                if let Record::File(f) = &r {
                    refused_made.push((f.path.clone(), f.version.clone(), based.clone()));
                }
                continue;
            }
            // (Cloned only when carried: this is every put's record on its way in.)
            let carried = self.moved_away_under(&r, &records).and_then(|c| match &r {
                Record::File(put) => Some((put.clone(), c)),
                _ => None,
            });
            let unseen = self.file_a_tombstone_never_saw(&r);
            let after_kept = self.after_kept(&r);
            // (Looked up before `r` is taken: no clone on a put's way in.)
            let again_before = match (&r, &unseen) {
                (Record::File(f), None) if !f.removed && !f.is_dir => self.written_again_at(&f.path, &f.id, &f.version),
                _ => None,
            };
            let keep = unseen.is_some() || after_kept.is_some();
            // (A sent-back record is cloned only when it carries what it was decided from.)
            let taken_move = restored.then(|| r.clone());
            if let Some((live, tomb)) = unseen {
                // Written before the record that meets it, so no member ever holds the
                // tombstone winning over the file (whose copies it would delete) in between,
                // even when an append ends between the two entries.
                let (path, id, from) = (live.path.clone(), live.id.clone(), live.version.clone());
                let again = self.keep_over_tombstone(live, &tomb, hlc);
                if let Some(Record::File(k)) = &again {
                    self.note_kept(path, id, from, k.version.clone());
                }
                written_again.extend(again);
            } else if let (Some(at), Record::File(live)) = (after_kept, &r) {
                // (A tombstone keeps the version it was decided from: the move's other record
                // names it.)
                let from = match (live.removed, live.based_on.as_deref()) {
                    (true, Some(b)) => b.version.clone(),
                    _ => live.version.clone(),
                };
                let (path, id) = (live.path.clone(), live.id.clone());
                let again = self.write_again_above(live.clone(), at, hlc);
                if let Some(Record::File(k)) = &again {
                    self.note_kept(path, id, from, k.version.clone());
                }
                written_again.extend(again);
            }
            if self.apply_one(&r, hlc) {
                self.append_as_leader(r, from.clone());
                taken[i] = Some(self.last_seq);
            }
            if let Some((put, (tomb, moved))) = carried {
                let paths = [tomb.path.clone(), moved.path.clone()];
                let written = self.carry_overwrite(&put, tomb, moved, hlc);
                if written.is_empty() {
                    // Carried already (the put sent again, its answer lost): what the carry
                    // left at both paths goes back again, or the submitter lifts its hold with
                    // the move's tombstone over the put's bytes until the next append.
                    let unchecked = self.unchecked_own();
                    let here = paths.iter().filter_map(|p| self.state.file(p)).map(|f| Record::File(f.clone()));
                    let here: Vec<Record> = here.filter_map(|r| self.as_served(&r, &unchecked)).collect();
                    written_again.extend(here);
                }
                written_again.extend(written);
            }
            // A move sent back after a snapshot, which an overwrite this leader holds never saw.
            let carry = taken_move.and_then(|r| self.overwrite_a_sent_back_move_never_saw(&r, &decisions));
            if let Some((over, tomb, moved)) = carry {
                written_again.extend(self.carry_overwrite(&over, tomb, moved, hlc));
            }
            if let (false, Some(again)) = (keep, again_before) {
                // Written again by an earlier submit whose answer never arrived: handed back
                // again, or the submitter lifts its hold with the tombstone still winning there.
                written_again.push(again);
            }
        }
        let took = (first_new, taken.iter().flatten().count());
        let echo = self.echo_for_submitter(from, b.seqs.then_some(took));
        self.pump_appends();
        let mut answer = json!({"ok": true, "lastSeq": self.last_seq, "lease": self.lease.known(), "refused": refused});
        if !written_again.is_empty() {
            answer["writtenAgain"] = json!(written_again);
        }
        match echo {
            Some(Echo::Taken) => answer["taken"] = json!(taken),
            Some(Echo::Append(append)) => answer["append"] = append,
            None => {}
        }
        reply(None, answer)
    }

    /// The submitter's own new entries, carried back in the answer to its submit (issue 18):
    /// when every entry it has not been sent is one it submitted and no append to it is in
    /// flight, the answer is its append, and one signed request per write is saved. Counted as
    /// sent (the next append starts after them), not as held: a submitter that never reads the
    /// answer finds the gap at its next append and catches up; no write of another node waits
    /// for the submitter to hold these.
    ///
    /// A submitter that rebuilds entries from their numbers (`seqs` in its submit; `took`: the
    /// first number this submit could take and how many entries it made) is answered with those
    /// numbers alone when every entry it has not been sent took a record of this very submit:
    /// it holds those records, and an entry is its record, the number, the lease's term, the
    /// record's newest version and the submitter as origin. Nothing is cloned or serialised.
    fn echo_for_submitter(&mut self, peer: &NodeId, took: Option<(LogIndex, usize)>) -> Option<Echo> {
        let lease = self.lease.known().cloned()?;
        let p = self.peers.get(peer)?;
        if p.in_flight.is_some() || p.sent_through >= self.last_seq {
            return None;
        }
        let from = LogIndex(p.sent_through.0.max(self.compacted_through.0).saturating_add(1));
        let made_by_this_submit = took.is_some_and(|(first, n)| {
            first == from && self.last_seq.0.checked_sub(from.0) == (n as u64).checked_sub(1)
        });
        if made_by_this_submit {
            self.peers.get_mut(peer).expect("looked up").sent_through = self.last_seq;
            return Some(Echo::Taken);
        }
        // Decided on the log as it is (nothing cloned or serialised for an answer without it).
        // (Counted up to one past a batch: a submitter further behind is sent appends.)
        let unsent = self.log.range(from..).take(self.config.batch_max.saturating_add(1)).count();
        if unsent > self.config.batch_max || self.log.range(from..).any(|(_, e)| &e.origin != peer) {
            return None;
        }
        let entries: Vec<Entry> =
            take_bounded(self.log.range(from..).map(|(_, e)| e), self.config.batch_max, |e| &e.record)
                .into_iter()
                .cloned()
                .collect();
        if entries.len() != unsent {
            return None; // over the byte bound: the ordinary append carries them in parts
        }
        self.peers.get_mut(peer).expect("looked up").sent_through = self.last_seq;
        serde_json::to_value(AppendBody { lease, entries, last_seq: self.last_seq, held_through: LogIndex(0) })
            .ok()
            .map(Echo::Append)
    }

    /// `POST meta/based`: a leader asks, before it appends its own queued removes and
    /// moves, what this node holds at the paths they were decided from
    /// ([`Meta::own_based_checked`]). The answer names this node's record at each path that is
    /// newer than the version given. Only a read: nothing here changes.
    pub fn answer_based(&self, body: &[u8]) -> MetaReply {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct BasedBody {
            based: Vec<crate::meta::records::BasedOn>,
        }
        let b: BasedBody = match serde_json::from_slice(body) {
            Ok(b) => b,
            Err(e) => return bad(format!("based body: {e}")),
        };
        // A lookup each: bounded well above any queue a node builds while cut off.
        if b.based.len() > BASED_ASK_MAX {
            return bad("too many paths in one check");
        }
        let records: Vec<Record> = b
            .based
            .iter()
            .filter_map(|based| self.state.file(&based.path).filter(|here| here.version > based.version))
            .map(|f| Record::File(f.clone()))
            .collect();
        reply(None, json!({ "records": records }))
    }

    /// `GET meta/log?after=N`: at most one page, read from the range asked for only.
    pub fn answer_log(&self, query: &str) -> MetaReply {
        let after =
            query.split('&').find_map(|kv| kv.strip_prefix("after=")).map(|v| v.parse::<u64>()).unwrap_or(Ok(0));
        let Ok(after) = after else { return bad("after must be a number") };
        if after < self.compacted_through.0 {
            return reply(
                Some(ErrorKind::Gone),
                json!({"error": {"code": "compacted", "message": "that range was compacted; fetch a snapshot"}, "compactedThrough": self.compacted_through}),
            );
        }
        // `after` comes from the peer: `after + 1` would overflow on u64::MAX.
        let range = (std::ops::Bound::Excluded(LogIndex(after)), std::ops::Bound::Unbounded);
        let entries: Vec<Entry> = self.log.range(range).take(self.config.page_max).map(|(_, e)| e.clone()).collect();
        let page = LogPage::<Entry> {
            entries,
            last_seq: self.last_seq,
            term: self.log_lease.as_ref().map(|l| l.term).unwrap_or_default(),
            holder: self.log_lease.as_ref().map(|l| l.holder.clone()),
        };
        reply(None, serde_json::to_value(page).expect("serialise"))
    }

    /// `GET meta/snapshot`: every record, tombstones included.
    /// `GET meta/snapshot[?after=CURSOR]`: one page of every record, tombstones included, in
    /// key order. Read page by page, it stands for the log position of its first page: changes
    /// made while the pages are read arrive again through the log after that position, and
    /// records merge, so a page that is newer than the first one does no harm.
    pub fn answer_snapshot(&self, query: &str) -> MetaReply {
        let after = match query.split('&').find_map(|kv| kv.strip_prefix("after=")) {
            Some(c) => match decode_cursor(c) {
                Some(k) => Some(k),
                None => return bad("after must be a snapshot cursor"),
            },
            None => None,
        };
        let mut records = RecordSet::default();
        let mut last_key = None;
        let mut more = false;
        let unchecked = self.unchecked_own();
        for (taken, (k, r)) in self.state.records_after(after.as_ref()).enumerate() {
            if taken == self.config.snapshot_page_max.max(1) {
                more = true;
                break;
            }
            if let Some(r) = self.as_served(r, &unchecked) {
                records.push(r);
            }
            last_key = Some(k.clone());
        }
        let snap = Snapshot {
            records,
            unknown: BTreeMap::new(),
            last_seq: self.last_seq,
            term: self.log_lease.as_ref().map(|l| l.term).unwrap_or_default(),
            holder: self.log_lease.as_ref().map(|l| l.holder.clone()),
            next: if more { last_key.as_ref().map(encode_cursor) } else { None },
        };
        reply(None, serde_json::to_value(snap).expect("serialise"))
    }
}
