//! Membership gossip (spec: "Membership"): heartbeat rounds, the state tick, pushing the
//! member list, requests this node sends and their answers, and merging what peers say.

use super::*;

impl Node {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new_request(
        &mut self,
        wall: Millis,
        now: Millis,
        to: &NodeId,
        method: &'static str,
        target: &str,
        body: Vec<u8>,
        purpose: Purpose,
    ) {
        let Some(url) = self.route(to) else { return };
        let Some(signature) = self.pending_signature(wall) else {
            return;
        };
        let token = self.next_token;
        self.next_token += 1;
        self.in_flight.insert(token, InFlight { peer: to.clone(), sent: now, sent_wall: wall, purpose });
        let timeout_ms = self.config.membership.heartbeat_timeout_ms;
        self.push_output(Output::Send(OutRequest {
            token,
            to: to.clone(),
            url,
            method,
            target: target.to_string(),
            body,
            signature,
            timeout_ms,
        }));
    }

    pub(super) fn members_body(&self, wall: Millis, now: Millis) -> Vec<u8> {
        let body = MembersBody {
            nodes: self.members.wire_records_at(now, wall),
            cluster: self.cluster.clone(),
            time_ms: wall.0,
        };
        serde_json::to_vec(&body).expect("members serialise")
    }

    /// Push the whole member list to every live peer (after a local change).
    pub(super) fn push_members(&mut self, wall: Millis, now: Millis) {
        if self.cluster.is_none() {
            return;
        }
        let body = self.members_body(wall, now);
        let peers: Vec<NodeId> = self.members.peers().map(|r| r.id.clone()).collect();
        for p in peers {
            self.new_request(wall, now, &p, "POST", "/cluster/acn/members/sync", body.clone(), Purpose::Push);
        }
    }

    pub(super) fn heartbeat_round(&mut self, wall: Millis, now: Millis) {
        let Some(own) = self.members.get(&self.id).cloned() else {
            return;
        };
        let stale_after = self.config.membership.heartbeat_timeout_ms * 2;
        self.in_flight.retain(|_, f| now.since(f.sent) <= stale_after);
        let busy: Vec<NodeId> =
            self.in_flight.values().filter(|f| f.purpose == Purpose::Heartbeat).map(|f| f.peer.clone()).collect();
        let body = serde_json::to_vec(&HeartbeatBody { node: own, cluster: self.cluster.clone() }).expect("serialise");
        let peers: Vec<NodeId> = self.members.peers().map(|r| r.id.clone()).filter(|p| !busy.contains(p)).collect();
        for p in peers {
            self.new_request(wall, now, &p, "POST", "/cluster/acn/heartbeat", body.clone(), Purpose::Heartbeat);
        }
    }

    pub(super) fn tick(&mut self, wall: Millis, now: Millis) {
        for id in self.members.purge_tombstones(wall) {
            self.last_states.remove(&id);
            self.persist(PersistOp::DeleteRecord(id.clone()));
            self.persist(PersistOp::PutPurged(id));
        }
        for id in self.tokens.purge_expired(wall) {
            self.persist(PersistOp::DeleteToken(id));
        }
        let states: Vec<(NodeId, NodeState)> = self
            .members
            .records()
            .filter(|r| !r.removed)
            .map(|r| (r.id.clone(), self.members.state(&r.id, now)))
            .collect();
        for (id, to) in states {
            let from = self.last_states.insert(id.clone(), to);
            if let Some(from) = from {
                if from != to {
                    self.event(Event::StateChanged { node: id, from, to });
                }
            }
        }
    }

    pub(super) fn on_response(&mut self, wall: Millis, now: Millis, token: u64, result: Result<PeerAnswer, String>) {
        let Some(f) = self.in_flight.remove(&token) else {
            return;
        };
        if self.cluster.is_none() {
            return;
        }
        if let Purpose::Meta(p) = f.purpose {
            self.meta.on_response(now, &f.peer, p, result, &mut self.hlc);
            self.drain_meta(wall, now);
            return;
        }
        if matches!(f.purpose, Purpose::JobHandOver { .. } | Purpose::JobRenew { .. } | Purpose::JobDone { .. }) {
            if result.is_ok() {
                self.members.saw_at(&f.peer, now, now);
            }
            self.jobs_on_response(wall, now, &f.peer, f.sent, &f.purpose, result);
            return;
        }
        if matches!(f.purpose, Purpose::Directory | Purpose::WriteBack { .. }) {
            self.identity_answered(wall, &f.peer, f.purpose, result);
            return;
        }
        if f.purpose == Purpose::Events {
            let delivered = matches!(&result, Ok(a) if a.is_ok());
            self.events_answered(now, &f.peer, delivered);
        }
        let PeerAnswer { refused, body } = match result {
            Ok(r) => r,
            Err(_) => return,
        };
        let time_ms =
            serde_json::from_slice::<Value>(&body).ok().and_then(|v| v.get("timeMs").and_then(|t| t.as_u64()));
        if let Some(t) = time_ms.filter(|t| *t > 0) {
            // Their clock at about the midpoint of the round trip.
            let midpoint = f.sent_wall.0 as i64 + (now.since(f.sent) / 2) as i64;
            self.members.record_clock_offset(&f.peer, t as i64 - midpoint);
        }
        if refused == Some(ErrorKind::Unauthorized) {
            self.on_refused(wall, now, &body);
            return;
        }
        if refused.is_some() {
            return;
        }
        if f.purpose == Purpose::Latency {
            self.take_latency_row(wall, &f.peer, &body);
        }
        if f.purpose != Purpose::Heartbeat {
            // Any answered request is a round trip and a sign of life.
            self.members.record_rtt(&f.peer, now.since(f.sent) as f64);
            self.members.saw_at(&f.peer, now, now);
            return;
        }
        let Ok(reply) = serde_json::from_slice::<MembersBody>(&body) else { return };
        if reply.cluster.as_ref().map(|c| &c.id) != self.cluster.as_ref().map(|c| &c.id) {
            return;
        }
        self.members.record_rtt(&f.peer, now.since(f.sent) as f64);
        self.members.saw_at(&f.peer, now, now);
        let sender_now = (reply.time_ms > 0).then_some(Millis(reply.time_ms));
        let out = self.members.merge(now, &reply.nodes, sender_now, Trust::Gossip, &mut self.hlc);
        self.apply_merge(wall, out);
    }

    /// A peer refused us as unknown; if it showed us our own removal, check it and leave.
    pub(super) fn on_refused(&mut self, wall: Millis, now: Millis, body: &[u8]) {
        let Ok(v) = serde_json::from_slice::<Value>(body) else {
            return;
        };
        let Some(rec) = v.get("removed").and_then(|r| serde_json::from_value::<NodeRecord>(r.clone()).ok()) else {
            return;
        };
        if rec.id != self.id {
            return;
        }
        let out = self.members.merge(now, &[rec], None, Trust::Gossip, &mut self.hlc);
        self.apply_merge(wall, out);
    }

    /// Persist and announce what a merge changed. `wall` is the wall clock (for re-signing).
    pub(super) fn apply_merge(&mut self, wall: Millis, out: MergeOutcome) {
        let now = wall;
        for id in &out.changed {
            if let Some(r) = self.members.get(id) {
                let r = r.clone();
                self.persist(PersistOp::PutRecord(Box::new(r)));
            }
        }
        for id in out.added {
            self.event(Event::MemberAdded(id));
        }
        let mut self_removed = false;
        for id in out.removed {
            if id == self.id {
                self_removed = true;
            }
            self.last_states.remove(&id);
            self.event(Event::MemberRemoved(id));
        }
        if self_removed {
            self.event(Event::RemovedSelf);
            self.wipe_cluster();
            return;
        }
        if let Some(v) = out.own_owner_newer {
            // Someone holds a newer copy of our own record (a restored backup): sign past it.
            self.hlc.observe(&v);
            let joined = self.members.get(&self.id).map(|r| r.joined).unwrap_or(now.as_secs());
            let fields = self.owner_fields(joined);
            let v = self.hlc.next(now);
            let key = self.key.clone();
            if let Some(rec) = self.members.get_mut(&self.id) {
                rec.resign_owner(fields, v, &key);
                let rec = rec.clone();
                self.persist(PersistOp::PutRecord(Box::new(rec)));
            }
        }
    }

    pub(super) fn wipe_cluster(&mut self) {
        self.cluster = None;
        self.members.clear();
        self.tokens.clear();
        self.in_flight.clear();
        self.heartbeat_due = None;
        self.tick_due = None;
        self.last_states.clear();
        self.own_volumes.clear();
        self.repl_tasks.clear();
        self.repl_backlog.clear();
        self.chores.stop();
        self.working.clear();
        self.scrub_pending.clear();
        // Runs here stop (their jobs belong to the cluster left); the leader's book goes.
        self.jobs_forget_all();
        // One more config pass takes the values back to this build's own (then no timer runs).
        self.config_applied = None;
        self.config_due = Millis::ZERO;
        self.persist(PersistOp::ClearCluster);
        let now = self.clock.peek(self.clock.last_wall.unwrap_or_default());
        self.meta.clear(now);
        while let Some(o) = self.meta.poll_output() {
            if let MetaOutput::Persist(p) = o {
                self.push_output(Output::Meta(p));
            }
        }
    }
}
