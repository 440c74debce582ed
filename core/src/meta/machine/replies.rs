//! Peers' answers to this node's metadata requests (spec: "Metadata"): lease grants,
//! append acknowledgements, submit results, catch-up pages and snapshots.

use super::*;

impl Meta {
    pub fn on_response(
        &mut self,
        now: Millis,
        peer: &NodeId,
        purpose: MetaPurpose,
        result: Result<PeerAnswer, String>,
        hlc: &mut Hlc,
    ) {
        self.now = self.now.max(now);
        let no_answer = result.is_err();
        // A transport failure reads as a peer failure with no body.
        let PeerAnswer { refused, body } =
            result.unwrap_or_else(|_| PeerAnswer::refused(ErrorKind::PeerFailed, Vec::new()));
        let carried_out = refused.is_none();
        if refused == Some(ErrorKind::Conflict) {
            #[derive(Deserialize)]
            struct Refusal {
                lease: Option<Lease>,
            }
            if let Ok(Refusal { lease: Some(l) }) = serde_json::from_slice::<Refusal>(&body) {
                self.lease.on_refused(now, l);
            }
        } else if matches!(refused, Some(ErrorKind::Invalid | ErrorKind::TooLarge)) {
            // A peer refused what we sent as malformed (it is sent again): say so.
            let what = match &purpose {
                MetaPurpose::LeasePush => "our lease push",
                MetaPurpose::Append { .. } => "our append",
                MetaPurpose::Submit { .. } => "our submit",
                MetaPurpose::CatchUp => "our catch-up request",
                MetaPurpose::Snapshot { .. } => "our snapshot request",
                MetaPurpose::Based => "our check of queued removes and moves",
            };
            self.refused_by(peer, what, answer_message(&body));
        }
        // Small answers are read whole; a log page is read entry by entry below.
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Answer {
            last_seq: Option<LogIndex>,
            #[serde(default)]
            refused: Vec<Value>,
            /// A submit's answer may carry the entries that took the submitted records
            /// ([`Meta::answer_submit`]): read as an append from the leader.
            #[serde(default)]
            append: Option<Box<RawValue>>,
            /// Or only their numbers, one per submitted record (`null`: not taken); the entries
            /// are rebuilt from the records submitted.
            #[serde(default)]
            taken: Option<Vec<Option<LogIndex>>>,
            #[serde(default)]
            lease: Option<Lease>,
            /// A submit's answer: records the leader wrote again for those submitted (a file a
            /// tombstone never saw, [`Meta::answer_submit`]), taken before the submitted records
            /// leave the queue.
            #[serde(default)]
            written_again: Vec<Box<RawValue>>,
            /// An append's answer: positions the follower passed over, and at or below which
            /// it may not hold entries.
            #[serde(default)]
            passed_over: Vec<LogIndex>,
            #[serde(default)]
            unread_through: Option<LogIndex>,
            /// A lease push's or an append's answer: the peer's records are not settled on
            /// our numbering yet ([`Meta::records_settling`]).
            #[serde(default)]
            settling: bool,
        }
        let answer = |body: &[u8]| serde_json::from_slice::<Answer>(body).ok();
        let mut follower_answer =
            matches!(purpose, MetaPurpose::LeasePush | MetaPurpose::Append { .. }).then(|| answer(&body)).flatten();
        if carried_out && follower_answer.as_ref().is_some_and(|a| !a.settling) {
            // The peer follows this node's numbering and heard it now ([`Meta::leader_may_lag`]).
            self.in_touch.insert(peer.clone(), now);
        }
        match purpose {
            MetaPurpose::LeasePush => {}
            MetaPurpose::Append { through } => {
                let (reported, passed_over, unread) =
                    follower_answer.take().map(|a| (a.last_seq, a.passed_over, a.unread_through)).unwrap_or_default();
                if let Some(p) = self.peers.get_mut(peer) {
                    p.in_flight = None;
                    if carried_out {
                        p.acked_through = reported.unwrap_or(through);
                        // Confirmed: no further than what this append carried, and none of the
                        // positions it passed over.
                        p.note_passed_over(passed_over, through);
                        if let Some(u) = unread {
                            p.note_unread(u);
                        }
                        // Only an answer that says how far the peer's log reaches confirms
                        // anything (one that cannot be read, or says nothing, may have
                        // named positions it passed over).
                        if let Some(reported) = reported {
                            p.held_through = p.held_through.max(reported.min(through));
                        }
                        // A peer behind what we sent catches up by itself (log?after=N).
                    } else {
                        // Not delivered: resend from what the peer last acknowledged.
                        p.sent_through = p.acked_through.min(p.sent_through);
                    }
                }
                if carried_out && self.is_leader(now) {
                    self.pump_appends();
                }
            }
            MetaPurpose::Submit { ids } => {
                if let Some(first) = ids.first() {
                    self.submit_settled(*first);
                }
                if carried_out {
                    let a = answer(&body);
                    let (refused_records, append, taken, lease, last_seq, again) = a
                        .map(|a| (a.refused, a.append, a.taken, a.lease, a.last_seq, a.written_again))
                        .unwrap_or_default();
                    // While the submitted records still wait here, nothing on disk follows the
                    // tombstone that beat one of them: the record written above it comes first.
                    for raw in again {
                        match serde_json::from_str::<Record>(raw.get()) {
                            Ok(r) if believable(&r, hlc) => {
                                self.apply_one(&r, hlc);
                            }
                            _ => self.refused_by(peer, "a record written again", raw.get().to_string()),
                        }
                    }
                    for r in refused_records {
                        let index = r.get("index").and_then(Value::as_u64).and_then(|i| usize::try_from(i).ok());
                        let id = index.and_then(|i| ids.get(i)).copied();
                        if r.get("changed").and_then(Value::as_bool) == Some(true) {
                            // Decided from a record the leader no longer holds: a conflict, not
                            // a fault; undone here.
                            if let Some(id) = id {
                                let current = r.get("current").and_then(|c| Record::deserialize(c).ok());
                                self.undo_changed(id, current, hlc);
                            }
                            continue;
                        }
                        if let Some(id) = id {
                            self.note_refused_own(id);
                        }
                        self.refused_by(peer, "our submitted record", r.to_string());
                    }
                    let mut submitted = Vec::with_capacity(ids.len());
                    for id in ids {
                        // (A record sent back is rebuilt as the leader stored it: with what it
                        // was decided from.)
                        let based = self.sent_back_based.get(&id).cloned();
                        let mut p = self.pending_remove(id);
                        if let (Some(b), Some(Record::File(f))) = (based, p.as_mut()) {
                            f.based_on.get_or_insert(Box::new(b));
                        }
                        if p.is_some() {
                            self.pending_taken += 1;
                            self.persist(MetaPersist::DeletePending(id));
                        }
                        submitted.push(p);
                    }
                    if let Some(append) = append {
                        // Checked as any append is (the lease holder's, the right numbering,
                        // no gap); its own answer has no one to go to.
                        self.take_echoed_append(now, peer, append.get().as_bytes(), hlc);
                    } else if let (Some(taken), Some(lease), Some(last_seq)) = (taken, lease, last_seq) {
                        match self.rebuild_entries(&lease, taken, submitted) {
                            Some(entries) => {
                                let _ = self.take_append(now, peer, lease, entries, last_seq, None, hlc);
                            }
                            // Not rebuilt (an answer that does not match what was sent): the
                            // range is read from the leader.
                            None => self.request_catch_up(&lease.holder),
                        }
                    }
                    self.submit_due = now;
                } else {
                    // A leader whose own removes or moves wait for their check asks for the
                    // submit again shortly ([`Meta::answer_submit`], `own_check_pending`).
                    #[derive(Deserialize)]
                    #[serde(rename_all = "camelCase")]
                    struct Retry {
                        retry_ms: Option<u64>,
                    }
                    let hinted = (refused == Some(ErrorKind::Unavailable))
                        .then(|| serde_json::from_slice::<Retry>(&body).ok().and_then(|r| r.retry_ms))
                        .flatten();
                    let wait = hinted.map_or(self.config.submit_retry_ms, |ms| ms.min(self.config.submit_retry_ms));
                    self.submit_due = now.plus(wait);
                }
                // No answer left in flight can fill a hole before entries held back: read it.
                if self.submits.is_empty() && !self.ahead.is_empty() {
                    if let Some((_, leader)) = self.catch_up_due.take() {
                        self.request_catch_up(&leader);
                    }
                }
                self.try_submit(now, Some(hlc));
            }
            MetaPurpose::Based => {
                #[derive(Deserialize)]
                struct BasedAnswer {
                    #[serde(default)]
                    records: Vec<Box<RawValue>>,
                }
                // No answer (the peer is unreachable after all), or a refusal (busy, a key it
                // does not know yet, a body it will not read): it is asked again. Only a build
                // without the endpoint (404) counts as one that holds nothing newer.
                let answered = !no_answer && (carried_out || refused == Some(ErrorKind::NotFound));
                let raw = if carried_out {
                    serde_json::from_slice::<BasedAnswer>(&body).map(|a| a.records).unwrap_or_default()
                } else {
                    Vec::new()
                };
                let records = raw.iter().filter_map(|r| serde_json::from_str::<Record>(r.get()).ok()).collect();
                self.take_based_answer(now, peer, answered.then_some(records), hlc);
            }
            MetaPurpose::CatchUp => {
                self.catch_up_in_flight = None;
                if self.is_leader(now) {
                    // Asked while following; this node leads now, and its log is the one the
                    // others follow: a page of the old leader's must not rewrite it.
                    return;
                }
                match refused {
                    None => {
                        let Ok(page) = serde_json::from_slice::<LogPage<Box<RawValue>>>(&body) else { return };
                        let same_numbering = self.log_lease.as_ref().is_some_and(|l| {
                            l.term == page.term && page.holder.as_ref().is_none_or(|h| h == &l.holder)
                        });
                        if !same_numbering {
                            self.request_snapshot(peer);
                            return;
                        }
                        let got = !page.entries.is_empty();
                        let contiguous = self.take_entries(peer, read_entries(page.entries), hlc);
                        if !contiguous {
                            self.request_snapshot(peer);
                        } else if got && (self.last_seq < page.last_seq || !self.ahead.is_empty()) {
                            self.request_catch_up(peer);
                        }
                    }
                    Some(ErrorKind::Gone) => self.request_snapshot(peer),
                    _ => {}
                }
            }
            MetaPurpose::Snapshot { after } => {
                let page = carried_out.then(|| serde_json::from_slice::<Snapshot>(&body).ok()).flatten();
                // As for a catch-up page: a leader never adopts another node's snapshot (it would
                // clear its log and follow the old numbering while it holds the lease).
                let page = page.filter(|_| !self.is_leader(now));
                let Some(page) = page else {
                    self.catch_up_in_flight = None;
                    self.snapshot_progress = None;
                    return;
                };
                let first = after.is_none();
                if first {
                    self.snapshot_progress = Some(SnapshotProgress {
                        from: peer.clone(),
                        last_seq: page.last_seq,
                        term: page.term,
                        holder: page.holder.clone(),
                        unread: false,
                    });
                }
                let unread = page.has_unknown();
                if let Some(p) = self.snapshot_progress.as_mut().filter(|p| &p.from == peer) {
                    p.unread |= unread;
                }
                let Some(progress) = self.snapshot_progress.clone().filter(|p| &p.from == peer) else {
                    self.catch_up_in_flight = None;
                    return;
                };
                let lower = after.as_deref().and_then(decode_cursor);
                let next = page.next.clone();
                let upper = next.as_deref().and_then(decode_cursor);
                self.take_snapshot_page(page.records, lower.as_ref(), upper.as_ref(), hlc);
                match next {
                    Some(c) if upper.is_some() => {
                        self.catch_up_in_flight = Some(now);
                        self.send_snapshot_request(peer, Some(c));
                    }
                    _ => {
                        self.catch_up_in_flight = None;
                        self.snapshot_progress = None;
                        self.finish_snapshot(now, progress, hlc);
                    }
                }
            }
        }
    }

    /// The entries that took this node's submitted records, from the numbers the leader gave
    /// them (`taken`, one per record of `submitted` in the order sent): each is the record, its
    /// number, the lease's term, the record's newest version and this node as origin, as the
    /// leader made it ([`Meta::append_as_leader`]). `None` when the answer does not match the
    /// submit (another count, a number for a record no longer held here).
    fn rebuild_entries(
        &self,
        lease: &Lease,
        taken: Vec<Option<LogIndex>>,
        submitted: Vec<Option<Record>>,
    ) -> Option<Vec<PeerEntry>> {
        if taken.len() != submitted.len() {
            return None;
        }
        let mut entries = Vec::with_capacity(taken.len());
        for (seq, record) in taken.into_iter().zip(submitted) {
            let Some(seq) = seq else { continue };
            let record = record?;
            let version = record.max_version();
            entries.push(PeerEntry::Read(Box::new(Entry {
                seq,
                term: lease.term,
                record,
                version,
                origin: self.me.clone(),
            })));
        }
        // (A leader may take a submit's records out of the order sent: [`Meta::sent_back_plan`].)
        entries.sort_by_key(|e| match e {
            PeerEntry::Read(e) => e.seq,
            _ => LogIndex(0),
        });
        Some(entries)
    }

    /// Merge one snapshot page covering the keys in `(lower, upper]` (`None`: open end), and queue
    /// back to the leader whatever we hold in that range that the page does not (or holds older).
    pub(super) fn take_snapshot_page(
        &mut self,
        records: RecordSet,
        lower: Option<&RecordKey>,
        upper: Option<&RecordKey>,
        hlc: &mut Hlc,
    ) {
        let theirs: BTreeMap<RecordKey, Record> = records.into_records().map(|r| ((r.kind(), r.key()), r)).collect();
        self.apply_remote(theirs.values().cloned(), hlc);
        let queued: BTreeSet<RecordKey> = self.pending.values().map(|r| (r.kind(), r.key())).collect();
        let mut send_back = Vec::new();
        for (key, r) in self.state.records_after(lower) {
            if upper.is_some_and(|u| key > u) {
                break;
            }
            if theirs.get(key) != Some(r) && !queued.contains(key) {
                send_back.push(r.clone());
            }
        }
        for r in send_back {
            self.queue_sent_back(r);
        }
    }

    /// Queue a record this node holds to be sent back to the leader. Sent as held, not as a
    /// decision: the leader must not check (or refuse) it again against records it may lack.
    /// What it was decided from goes beside it.
    pub(super) fn queue_sent_back(&mut self, mut r: Record) {
        let mut sent_back_based = None;
        if let Record::File(f) = &mut r {
            sent_back_based = f.based_on.take().map(|b| *b);
        }
        let id = self.next_pending_id;
        self.next_pending_id += 1;
        if let Some(b) = &sent_back_based {
            self.sent_back_based.insert(id, b.clone());
        }
        self.pending_insert(id, r.clone());
        self.persist(MetaPersist::PutPending(Pending { id, record: r, sent_back_based }));
    }

    /// A record from the leader outside a submit's answer (an append, a snapshot page): if it is
    /// a remove's or a move's tombstone that never saw an overwrite this node holds
    /// ([`Meta::overwrite_a_tombstone_never_saw`]), that overwrite is queued to be sent back
    /// before the tombstone drops it here. While it waits to be sent, nothing at its path is
    /// deleted here ([`Meta::put_awaits_leader`]).
    pub(super) fn send_back_unseen_overwrite(&mut self, r: &Record) {
        if let Some(over) = self.overwrite_a_tombstone_never_saw(r) {
            let key = (over.kind(), over.key());
            if !self.pending.values().any(|p| (p.kind(), p.key()) == key) {
                self.queue_sent_back(over);
            }
        }
    }

    /// The overwrite this node holds that a remove's or a move's tombstone `r` never saw: the
    /// same file, put (no `BasedOn`) after the version the tombstone was decided from, and
    /// older than the tombstone, so last-writer-wins drops it here, and the leader, whose side
    /// never saw it (a put acknowledged on the other side of a partition), would never hear of
    /// it. Sent back, the leader carries an overwrite that raced a move to the moved file
    /// ([`Meta::moved_away_under`]); one a remove took it drops again (the remove, decided
    /// without it, is taken: README "Limits"). After a carry of an overwrite newer than the
    /// move, each follower that held the overwrite sends it back once (the carry's tombstone is
    /// decided from the move's source): the leader finds it carried already. Before, the move
    /// kept the old content while the copies at the old path held the overwrite's bytes (no
    /// rename matched them): the moved file had no right copy and the acknowledged overwrite
    /// was gone (simulator `--races` seed 7730).
    fn overwrite_a_tombstone_never_saw(&self, r: &Record) -> Option<Record> {
        let Record::File(t) = r else { return None };
        let b = t.based_on.as_deref().filter(|_| t.removed && !t.is_dir)?;
        let here = self.state.file(&t.path)?;
        let unseen = !here.removed
            && !here.is_dir
            && here.id == t.id
            && here.based_on.is_none()
            && here.version > b.version
            && here.version < t.version
            // (A record the tombstone's own writer made before it was seen by it: a leader's
            // keep of a new file, then the remove or move of that file it took above it.)
            && here.version.node != t.version.node;
        unseen.then(|| Record::File(here.clone()))
    }

    /// The last page is in: follow the leader's numbering from the snapshot's position.
    pub(super) fn finish_snapshot(&mut self, now: Millis, p: SnapshotProgress, hlc: &mut Hlc) {
        self.snapshots_adopted += 1;
        self.drop_held_back();
        self.log.clear();
        self.persist(MetaPersist::DeleteEntriesThrough(LogIndex(u64::MAX)));
        self.last_seq = p.last_seq;
        self.compacted_through = p.last_seq;
        // A new numbering: what this node could not read is known only of this snapshot.
        self.unread_through = if p.unread { p.last_seq } else { LogIndex(0) };
        self.log_lease = Some(Lease { holder: p.holder.unwrap_or(p.from), term: p.term });
        self.persist_log_meta();
        self.submit_due = now;
        self.try_submit(now, Some(hlc));
    }

    /// The node left its cluster: forget every record, the log and the lease.
    pub fn clear(&mut self, now: Millis) {
        let config = self.config.clone();
        *self = Meta::new(self.me.clone(), config, now);
        self.lease.clear(now);
        self.persist(MetaPersist::Clear);
    }

    /// A freshly created cluster: nobody to wait for before claiming the lease.
    pub fn allow_claim_now(&mut self, now: Millis) {
        self.lease.allow_claim_now(now);
        self.tick_due = now;
    }
}
