//! Answering peers (spec: "ACN", "Joining"): verifying a node-to-node request's signature
//! and answering heartbeats, syncs, leaves, evictions and joins.

use super::*;

/// Every node-to-node endpoint the core answers (under `/cluster/acn/`) and its method; all
/// but `hello` and `join` need a member's signature. The shell answers `store/*` (but
/// `store/place`) and `repl/*` itself, after the same signature check.
pub const ACN_ENDPOINTS: &[(&str, &str)] = &[
    ("hello", "GET"),
    ("members", "GET"),
    ("latency", "GET"),
    ("ping", "POST"),
    ("join", "POST"),
    ("heartbeat", "POST"),
    ("members/sync", "POST"),
    ("leave", "POST"),
    ("evict", "POST"),
    ("meta/log", "GET"),
    ("meta/snapshot", "GET"),
    ("meta/file", "GET"),
    ("meta/lease", "POST"),
    ("meta/append", "POST"),
    ("meta/submit", "POST"),
    ("meta/based", "POST"),
    ("store/place", "POST"),
    ("events/publish", "POST"),
    ("jobs/run", "POST"),
    ("jobs/renew", "POST"),
    ("jobs/done", "POST"),
    ("wake", "POST"),
    ("auth/directory", "GET"),
    ("auth/admin", "POST"),
];

impl Node {
    /// Answer one node-to-node request. `target` is the path plus `?query` exactly as received.
    pub fn handle_acn(
        &mut self,
        wall: Millis,
        method: &str,
        target: &str,
        headers: Option<&SignedHeaders>,
        body: &[u8],
    ) -> Reply {
        let now = self.advance_clocks(wall);
        let path = target.split('?').next().unwrap_or("");
        let Some(endpoint) = path.strip_prefix(ACN_PREFIX) else {
            return Reply::error(ErrorKind::NotFound, "not_found", "no such ACN endpoint");
        };
        let Some(&(_, want)) = ACN_ENDPOINTS.iter().find(|(e, _)| *e == endpoint) else {
            return Reply::error(ErrorKind::NotFound, "not_found", format!("no such ACN endpoint: {endpoint}"));
        };
        if !method.eq_ignore_ascii_case(want) {
            return Reply::error(ErrorKind::WrongMethod, "method_not_allowed", format!("{endpoint} takes {want}"));
        }
        // Every ACN body is JSON (or empty). serde skips the bytes of a field it ignores without
        // checking them, so a body with invalid UTF-8 in an unknown field would otherwise be taken.
        if std::str::from_utf8(body).is_err() {
            return Reply::error(ErrorKind::Invalid, "bad_body", "the body is not UTF-8 JSON");
        }
        match endpoint {
            "hello" => return Reply::ok(self.hello(wall)),
            "join" => return self.answer_join(wall, now, body),
            _ => {}
        }
        let sender = match self.verify_signed(wall, now, method, target, headers, body, None) {
            Ok(s) => s,
            Err(r) => return r,
        };
        match endpoint {
            "ping" => Reply::ok(json!({"pong": true, "node": sender, "time": wall.as_secs()})),
            "heartbeat" => self.answer_heartbeat(wall, now, &sender, body),
            "members" => Reply::ok(self.members_json(wall, now)),
            "members/sync" => self.answer_sync(wall, now, &sender, body),
            "leave" => self.answer_leave(wall, now, &sender, body),
            "evict" => self.answer_evict(wall, now, &sender, body),
            "wake" => self.answer_wake(body),
            "auth/directory" => self.answer_directory(wall),
            "auth/admin" => self.answer_admin_act(wall, &sender, body),
            "latency" => Reply::ok(json!({"node": self.id, "latency": self.members.latency_vector()})),
            "store/place" => self.answer_place(wall, &sender, body),
            "events/publish" => self.answer_events(&sender, body),
            "jobs/run" | "jobs/renew" | "jobs/done" => self.answer_jobs(wall, now, endpoint, &sender, body),
            "meta/file" => self.answer_file_exists(target),
            "meta/lease" | "meta/append" | "meta/submit" | "meta/log" | "meta/snapshot" | "meta/based" => {
                let query = target.split_once('?').map(|(_, q)| q).unwrap_or("");
                self.answer_meta(wall, now, endpoint, &sender, query, body)
            }
            _ => Reply::error(ErrorKind::NotFound, "not_found", "no such ACN endpoint"),
        }
    }

    /// Check a signed request from a member (the ACN rules, with the sender's clock offset) and
    /// note that we heard from it. The error is the reply to send.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn verify_signed(
        &mut self,
        wall: Millis,
        now: Millis,
        method: &str,
        target: &str,
        headers: Option<&SignedHeaders>,
        body: &[u8],
        body_hash: Option<&str>,
    ) -> Result<NodeId, Reply> {
        let incoming = Incoming { headers, method, target, body };
        let members = &self.members;
        let cluster = self.cluster.as_ref().map(|c| &c.id);
        let verified = self.verifier.verify_hashed(
            wall,
            &incoming,
            body_hash,
            cluster,
            |id| members.clock_offset_ms(id),
            |id| members.member_key(id),
        );
        if verified.is_err() {
            self.acn_refused += 1;
        }
        let sender = match verified {
            Ok(s) => s,
            Err(AcnError::UnknownNode) => {
                let proof = signed_proof(method, target, headers, body);
                return Err(self.unknown_sender_reply(proof));
            }
            Err(AcnError::ClockSkew) => {
                // Our time rides along so the sender can learn our clock's offset. A removed
                // node whose clock we cannot place would otherwise never hear of its removal
                // (we no longer talk to it, so we never learn its offset): if its own key
                // signed this, show it.
                let proof = signed_proof(method, target, headers, body);
                let mut r = self.removal_proof(err_reply(AcnError::ClockSkew), proof);
                r.body["timeMs"] = json!(wall.0);
                return Err(r);
            }
            Err(e) => return Err(err_reply(e)),
        };
        self.members.saw_at(&sender, now, now);
        Ok(sender)
    }

    /// The checks of a signed request that need no body (present, this cluster, a member),
    /// so the shell can refuse a stranger before reading up to 64 MiB. The full verification
    /// still runs on the whole request.
    pub fn precheck_acn(&self, _wall: Millis, headers: Option<&SignedHeaders>) -> Result<(), Reply> {
        let h = headers.ok_or_else(|| err_reply(AcnError::NotSigned))?;
        match &self.cluster {
            Some(c) if c.id.as_str() == h.cluster => {}
            _ => return Err(err_reply(AcnError::WrongCluster)),
        }
        if self.members.get(&NodeId::new(h.node.clone())).is_none() {
            return Err(err_reply(AcnError::UnknownNode));
        }
        Ok(())
    }

    /// Verify a signed request the shell answers itself (the byte-moving `store/*`
    /// endpoints): the same checks as every ACN request. Returns the sender.
    pub fn verify_acn(
        &mut self,
        wall: Millis,
        method: &str,
        target: &str,
        headers: Option<&SignedHeaders>,
        body: &[u8],
    ) -> Result<NodeId, Reply> {
        let now = self.advance_clocks(wall);
        self.verify_signed(wall, now, method, target, headers, body, None)
    }

    /// [`Node::verify_acn`] with the body's SHA-256 (hex) computed by the caller from `body`.
    pub fn verify_acn_hashed(
        &mut self,
        wall: Millis,
        method: &str,
        target: &str,
        headers: Option<&SignedHeaders>,
        body: &[u8],
        body_hash: &str,
    ) -> Result<NodeId, Reply> {
        let now = self.advance_clocks(wall);
        self.verify_signed(wall, now, method, target, headers, body, Some(body_hash))
    }

    /// 401 for a sender we do not count as a member. When we hold its removal, it rides along
    /// (signed by whoever removed it), so a node that missed its eviction learns of it and leaves.
    pub(super) fn unknown_sender_reply(&self, proof: Option<(&SignedHeaders, String)>) -> Reply {
        self.removal_proof(err_reply(AcnError::UnknownNode), proof)
    }

    /// Add the sender's own removal to a refusal, when its key signed the request.
    pub(super) fn removal_proof(&self, reply: Reply, proof: Option<(&SignedHeaders, String)>) -> Reply {
        let mut r = reply;
        if let Some((h, canon)) = proof {
            if let Some(rec) = self.members.get(&NodeId::new(h.node.clone())).filter(|r| r.removed) {
                // Only the removed node itself (its key signed this request) is shown its removal.
                if rec.key().is_some_and(|k| acn::verify_b64(&k, canon.as_bytes(), &h.signature)) {
                    r.body["removed"] = serde_json::to_value(rec).expect("record serialises");
                }
            }
        }
        r
    }

    pub fn hello(&self, now: Millis) -> Value {
        json!({
            "acn": true,
            "version": self.me.software_version,
            "inCluster": self.cluster.is_some(),
            "time": now.as_secs(),
        })
    }

    pub(super) fn members_json(&self, wall: Millis, now: Millis) -> Value {
        json!({"nodes": self.members.wire_records_at(now, wall), "cluster": self.cluster, "time": wall.as_secs(), "timeMs": wall.0})
    }

    pub(super) fn answer_heartbeat(&mut self, wall: Millis, now: Millis, sender: &NodeId, body: &[u8]) -> Reply {
        let hb: HeartbeatBody = match serde_json::from_slice(body) {
            Ok(b) => b,
            Err(e) => return Reply::error(ErrorKind::Invalid, "bad_body", format!("heartbeat body: {e}")),
        };
        if &hb.node.id != sender {
            return Reply::error(ErrorKind::Invalid, "bad_body", "heartbeat record is not the sender's own");
        }
        let out = self.members.merge(now, std::slice::from_ref(&hb.node), None, Trust::Gossip, &mut self.hlc);
        self.apply_merge(wall, out);
        Reply::ok(self.members_json(wall, now))
    }

    pub(super) fn answer_sync(&mut self, wall: Millis, now: Millis, sender: &NodeId, body: &[u8]) -> Reply {
        let b = match members_body(body, "members") {
            Ok(b) => b,
            Err(r) => return r,
        };
        let sender_now = (b.time_ms > 0).then_some(Millis(b.time_ms));
        if b.time_ms > 0 {
            self.members.record_clock_offset(sender, b.time_ms as i64 - wall.0 as i64);
        }
        let out = self.members.merge(now, &b.nodes, sender_now, Trust::Gossip, &mut self.hlc);
        self.apply_merge(wall, out);
        Reply::ok(json!({"ok": true, "timeMs": wall.0}))
    }

    /// From a member-list body, the records of `target` carrying a removal signed by `author`;
    /// a 400 saying `missing` when there are none.
    pub(super) fn removals_in(
        body: &[u8],
        what: &str,
        target: &NodeId,
        author: &NodeId,
        missing: &str,
    ) -> Result<Vec<NodeRecord>, Reply> {
        let b = members_body(body, what)?;
        let found: Vec<NodeRecord> = b
            .nodes
            .into_iter()
            .filter(|r| &r.id == target && r.removal.as_ref().is_some_and(|m| &m.by == author))
            .collect();
        if found.is_empty() {
            return Err(Reply::error(ErrorKind::Invalid, "bad_body", missing));
        }
        Ok(found)
    }

    pub(super) fn answer_leave(&mut self, wall: Millis, now: Millis, sender: &NodeId, body: &[u8]) -> Reply {
        let own = match Self::removals_in(body, "leave", sender, sender, "leave must carry the sender's own removal") {
            Ok(r) => r,
            Err(r) => return r,
        };
        let out = self.members.merge(now, &own, None, Trust::Gossip, &mut self.hlc);
        self.apply_merge(wall, out);
        Reply::ok(json!({"ok": true}))
    }

    pub(super) fn answer_evict(&mut self, wall: Millis, now: Millis, sender: &NodeId, body: &[u8]) -> Reply {
        let me = self.id.clone();
        let missing = "evict must carry this node's removal signed by the sender";
        let mine = match Self::removals_in(body, "evict", &me, sender, missing) {
            Ok(r) => r,
            Err(r) => return r,
        };
        let out = self.members.merge(now, &mine, None, Trust::Gossip, &mut self.hlc);
        if !out.removed.contains(&self.id) {
            return Reply::error(ErrorKind::Invalid, "bad_body", "the removal does not verify");
        }
        self.apply_merge(wall, out);
        Reply::ok(json!({"ok": true}))
    }

    pub(super) fn answer_join(&mut self, wall: Millis, now: Millis, body: &[u8]) -> Reply {
        let Some(cluster) = self.cluster.clone() else {
            return Reply::error(ErrorKind::NotFound, "not_in_cluster", "this node is not in a cluster");
        };
        let b: JoinBody = match serde_json::from_slice(body) {
            Ok(b) => b,
            Err(e) => return Reply::error(ErrorKind::Invalid, "bad_body", format!("join body: {e}")),
        };
        if b.cluster_id != cluster.id {
            return Reply::error(ErrorKind::NotFound, "unknown_cluster", "this node is in another cluster");
        }
        if let Err(e) = self.tokens.check(wall, &b.token_id, &b.secret) {
            return Reply::error(ErrorKind::Forbidden, "bad_token", e.to_string());
        }
        let r = &b.node;
        let Some(key) = r.key() else {
            return Reply::error(ErrorKind::Invalid, "bad_record", "node record has no valid public key");
        };
        if !is_uuid(r.id.as_str()) || r.owner_version.node != r.id || !r.owner_sig_valid(&key) {
            return Reply::error(ErrorKind::Invalid, "bad_record", "node record is not signed by its own key");
        }
        if !r.shape_ok() {
            return Reply::error(
                ErrorKind::Invalid,
                "bad_record",
                "node record fields are too long or malformed (name <= 128 bytes, http(s) URL, <= 256 features)",
            );
        }
        if r.id == self.id {
            return Reply::error(ErrorKind::Conflict, "node_exists", "that is this node's own id");
        }
        if self.members.purged().any(|p| p == &r.id) || self.members.get(&r.id).is_some_and(|x| x.removed) {
            return Reply::error(ErrorKind::Conflict, "node_removed", "this node id was removed from the cluster; give the node a fresh identity (new data dir) to join again");
        }
        if let Some(existing) = self.members.get(&r.id) {
            if existing.public_key != r.public_key {
                return Reply::error(
                    ErrorKind::Conflict,
                    "node_exists",
                    "a member with this node id already exists under another key",
                );
            }
        } else {
            let mut rec = r.clone();
            rec.admin_state = AdminState::Active;
            rec.admin = None;
            rec.removed = false;
            rec.removal = None;
            rec.health = None;
            rec.health_sig.clear();
            let v = self.hlc.next(wall);
            rec.admit(&self.id, v, &self.key);
            self.hlc.observe(&rec.owner_version);
            self.members.insert(rec.clone());
            self.persist(PersistOp::PutRecord(Box::new(rec)));
            self.event(Event::MemberAdded(r.id.clone()));
        }
        self.members.saw_at(&r.id, now, now);
        if let Some(t) = self.tokens.count_use(&b.token_id) {
            self.persist(PersistOp::PutToken(t));
        }
        self.push_members(wall, now);
        let mut nodes = self.members.wire_records_at(now, wall);
        nodes.sort_by_key(|n| (n.id != self.id, n.id.clone()));
        Reply::ok(json!({"cluster": cluster, "nodes": nodes, "via": "", "time": wall.as_secs(), "timeMs": wall.0}))
    }
}
