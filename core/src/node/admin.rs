//! The admin commands of membership (spec: "Admin API"): status, creating a cluster, join
//! tokens, admin states, removing a node, leaving, and joining with a token.

use super::*;

/// `GET /v1/status`: this node and its cluster as it sees them.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    pub in_cluster: bool,
    pub id: Option<ClusterId>,
    pub name: Option<String>,
    pub created: Option<u64>,
    pub node: NodeId,
    pub node_name: String,
    pub advertise_url: String,
    pub version: String,
    /// Members not removed.
    pub members: usize,
    /// How many members are in each state.
    pub states: BTreeMap<&'static str, usize>,
    /// The SHA-256 of the certificate this node serves HTTPS with (empty on plain HTTP).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub tls_pin: String,
    /// What an operator should know about how safe the cluster is (issue 15: plain HTTP
    /// between nodes).
    pub warnings: Vec<String>,
}

/// The warning `cluster status` gives while members talk plain HTTP (issue 15): a signed node
/// request names no receiver and its nonce is kept per receiver, so one captured on the wire
/// can be replayed to another member within the clock window; and sessions, API keys and the
/// identity directory cross in clear.
pub fn plain_http_warning(plain: &[&str]) -> Option<String> {
    (!plain.is_empty()).then(|| {
        format!(
            "{} member(s) serve plain HTTP ({}): a signed node request captured on the wire can be replayed to another member within the clock window, and sessions and API keys cross in clear. Serve HTTPS between nodes (`shoal serve --tls self-signed`) or keep them on a trusted network.",
            plain.len(),
            plain.join(", ")
        )
    })
}

/// A join token just made: the only time its secret is shown.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NewToken {
    pub token: String,
    pub id: TokenId,
    pub expires: u64,
    pub max_uses: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TokenList {
    pub tokens: Vec<TokenRecord>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TokenRevoked {
    pub revoked: TokenId,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdminStateSet {
    pub node: NodeId,
    pub admin_state: &'static str,
    pub state: NodeState,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodeRemoved {
    pub removed: NodeId,
}

/// This node left `left` and told `told` members.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LeftCluster {
    pub left: ClusterId,
    pub told: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeConfigured {
    pub node: NodeId,
    pub name: String,
    pub advertise_url: String,
}

/// `GET /readyz`: whether this node can serve the cluster now, and if not, why.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Readiness {
    pub ready: bool,
    pub in_cluster: bool,
    /// The metadata leader this node follows (itself when it leads).
    pub leader: Option<NodeId>,
    /// Every log entry this node knows of is applied, and nothing it wrote waits for the leader.
    pub caught_up: bool,
    pub why: Vec<String>,
}

impl Node {
    /// Ready: in a cluster, a leader known, the metadata caught up (issue 17 "Operators").
    pub fn readiness(&self, wall: Millis) -> Readiness {
        let now = self.clock.peek(wall);
        let in_cluster = self.cluster.is_some();
        let meta = self.meta.status(now);
        let leader = if in_cluster { meta.leader.clone() } else { None };
        let caught_up = in_cluster && meta.applied >= meta.last_seq && meta.pending == 0;
        let mut why = Vec::new();
        if !in_cluster {
            why.push("not in a cluster".to_string());
        } else {
            if leader.is_none() {
                why.push("no metadata leader known".to_string());
            }
            if meta.applied < meta.last_seq {
                why.push(format!("metadata behind: applied {} of {}", meta.applied.0, meta.last_seq.0));
            }
            if meta.pending > 0 {
                why.push(format!("{} writes wait for the leader", meta.pending));
            }
        }
        if let Some(e) = self.write_refusal() {
            why.push(e.message);
        }
        Readiness { ready: why.is_empty(), in_cluster, leader, caught_up, why }
    }

    /// [`plain_http_warning`] for the members (this one included) whose URL is `http://`.
    fn safety_warnings(&self) -> Vec<String> {
        let plain: Vec<&str> = self
            .members
            .records()
            .filter(|r| !r.removed && r.advertise_url.starts_with("http://"))
            .map(|r| r.name.as_str())
            .collect();
        plain_http_warning(&plain).into_iter().collect()
    }

    pub fn status(&self, wall: Millis) -> NodeStatus {
        let now = self.clock.peek(wall);
        let mut states: BTreeMap<&'static str, usize> = BTreeMap::new();
        for r in self.members.records().filter(|r| !r.removed) {
            *states.entry(self.members.state(&r.id, now).as_str()).or_default() += 1;
        }
        NodeStatus {
            in_cluster: self.cluster.is_some(),
            id: self.cluster.as_ref().map(|c| c.id.clone()),
            name: self.cluster.as_ref().map(|c| c.name.clone()),
            created: self.cluster.as_ref().map(|c| c.created),
            node: self.id.clone(),
            node_name: self.me.name.clone(),
            advertise_url: self.me.advertise_url.clone(),
            version: self.me.software_version.clone(),
            members: self.members.records().filter(|r| !r.removed).count(),
            states,
            tls_pin: self.me.tls_pin.clone(),
            warnings: self.safety_warnings(),
        }
    }

    pub fn create_cluster(&mut self, wall: Millis, name: &str) -> Result<NodeStatus, ApiError> {
        let now = self.advance_clocks(wall);
        if let Some(c) = &self.cluster {
            return Err(ApiError::conflict(
                "in_cluster",
                format!("this node is already in cluster {} ({})", c.name, c.id),
            ));
        }
        let name = name.trim();
        if name.len() > 128 {
            return Err(ApiError::invalid("bad_name", "cluster name is longer than 128 bytes"));
        }
        let info = ClusterInfo {
            id: ClusterId::new(self.rng.uuid_v4()),
            name: if name.is_empty() { "shoal".into() } else { name.to_string() },
            created: wall.as_secs(),
        };
        let mut rec = self.fresh_own_record(wall);
        let v = self.hlc.next(wall);
        rec.admit(&self.id, v, &self.key);
        self.members.clear();
        self.members.insert(rec.clone());
        self.cluster = Some(info.clone());
        self.persist(PersistOp::PutCluster(info));
        self.own_volumes.clear();
        self.persist_own_volumes();
        self.persist(PersistOp::PutRecord(Box::new(rec)));
        self.start_timers(now);
        self.meta = Meta::new(self.id.clone(), self.config.meta.clone(), now);
        self.meta.allow_claim_now(now);
        self.push_output(Output::Meta(MetaPersist::Clear));
        Ok(self.status(wall))
    }

    pub fn new_token(
        &mut self,
        now: Millis,
        ttl_hours: Option<u64>,
        max_uses: Option<u64>,
    ) -> Result<NewToken, ApiError> {
        let c = self.cluster.clone().ok_or_else(ApiError::not_in_cluster)?;
        let url = (!self.me.advertise_url.is_empty()).then_some(self.me.advertise_url.as_str());
        let (mut token, rec) = self.tokens.create(now, ttl_hours, max_uses, &c.id, &c.name, url, &mut self.rng)?;
        token.issuer_pin = self.me.tls_pin.clone();
        self.persist(PersistOp::PutToken(rec.clone()));
        Ok(NewToken { token: token.encode(), id: rec.id, expires: rec.expires, max_uses: rec.max_uses })
    }

    pub fn list_tokens(&self) -> TokenList {
        TokenList { tokens: self.tokens.list().cloned().collect() }
    }

    pub fn revoke_token(&mut self, id: &str) -> Result<TokenRevoked, ApiError> {
        let rec = self.tokens.revoke(&TokenId::new(id))?;
        self.persist(PersistOp::PutToken(rec.clone()));
        Ok(TokenRevoked { revoked: rec.id })
    }

    pub(super) fn known_peer(&self, id: &str) -> Result<NodeId, ApiError> {
        if self.cluster.is_none() {
            return Err(ApiError::not_in_cluster());
        }
        let id = NodeId::new(id);
        match self.members.get(&id) {
            Some(r) if !r.removed => Ok(id),
            Some(_) => Err(ApiError::not_found("node_removed", format!("node {id} was removed"))),
            None => Err(ApiError::not_found("unknown_node", format!("no member with id {id}"))),
        }
    }

    pub fn set_admin_state(&mut self, wall: Millis, id: &str, state: AdminState) -> Result<AdminStateSet, ApiError> {
        let now = self.advance_clocks(wall);
        let id = self.known_peer(id)?;
        let v = self.hlc.next(wall);
        let key = self.key.clone();
        let rec = self.members.get_mut(&id).expect("known");
        rec.set_admin(state, v, &key);
        let rec = rec.clone();
        self.persist(PersistOp::PutRecord(Box::new(rec)));
        self.push_members(wall, now);
        let state_now = self.members.state(&id, now);
        Ok(AdminStateSet { node: id, admin_state: state.as_str(), state: state_now })
    }

    pub fn remove_node(&mut self, wall: Millis, id: &str) -> Result<NodeRemoved, ApiError> {
        let now = self.advance_clocks(wall);
        let id = self.known_peer(id)?;
        if id == self.id {
            return Err(ApiError::invalid("is_self", "a node cannot remove itself; use `shoal cluster leave`"));
        }
        let evict_target = self.route(&id);
        let v = self.hlc.next(wall);
        let key = self.key.clone();
        let rec = self.members.get_mut(&id).expect("known");
        rec.set_removed(v, &key);
        let rec = rec.clone();
        self.persist(PersistOp::PutRecord(Box::new(rec.clone())));
        self.last_states.remove(&id);
        self.event(Event::MemberRemoved(id.clone()));
        self.push_members(wall, now);
        if let Some(url) = evict_target {
            // Tell the removed node; it is no longer a live member, so address it directly.
            let body =
                serde_json::to_vec(&MembersBody { nodes: vec![rec], cluster: self.cluster.clone(), time_ms: wall.0 })
                    .expect("serialise");
            if let Some(signature) = self.pending_signature(wall) {
                let token = self.next_token;
                self.next_token += 1;
                self.push_output(Output::Send(OutRequest {
                    token,
                    to: id.clone(),
                    url,
                    method: "POST",
                    target: "/cluster/acn/evict".into(),
                    body,
                    signature,
                    timeout_ms: self.config.membership.heartbeat_timeout_ms,
                }));
            }
        }
        Ok(NodeRemoved { removed: id })
    }

    pub fn leave(&mut self, wall: Millis) -> Result<LeftCluster, ApiError> {
        let now = self.advance_clocks(wall);
        let cluster = self.cluster.clone().ok_or_else(ApiError::not_in_cluster)?;
        let v = self.hlc.next(wall);
        let key = self.key.clone();
        let rec = self.members.get_mut(&self.id).expect("own record exists in a cluster");
        rec.set_removed(v, &key);
        let rec = rec.clone();
        let body =
            serde_json::to_vec(&MembersBody { nodes: vec![rec], cluster: Some(cluster.clone()), time_ms: wall.0 })
                .expect("serialise");
        let peers: Vec<NodeId> = self.members.peers().map(|r| r.id.clone()).collect();
        for p in &peers {
            self.new_request(wall, now, p, "POST", "/cluster/acn/leave", body.clone(), Purpose::Push);
        }
        self.wipe_cluster();
        Ok(LeftCluster { left: cluster.id, told: peers.len() })
    }

    /// Change this node's name or advertised URL; re-signs its record and tells the cluster.
    pub fn configure(
        &mut self,
        wall: Millis,
        name: Option<&str>,
        advertise_url: Option<&str>,
    ) -> Result<NodeConfigured, ApiError> {
        let now = self.advance_clocks(wall);
        if let Some(n) = name {
            let n = n.trim();
            if n.is_empty() || n.len() > 128 {
                return Err(ApiError::invalid("bad_name", "node name must be 1 to 128 bytes"));
            }
            self.me.name = n.to_string();
        }
        if let Some(u) = advertise_url {
            let u = u.trim().trim_end_matches('/');
            if !u.is_empty() && !crate::token::valid_base_url(u) {
                return Err(ApiError::invalid("bad_url", "advertised URL must look like http://host:port"));
            }
            if let Some(why) = crate::token::url_pin_error(u, &self.me.tls_pin) {
                return Err(ApiError::invalid("bad_url", why));
            }
            self.me.advertise_url = u.to_string();
        }
        self.refresh_own_record(wall, now);
        Ok(NodeConfigured {
            node: self.id.clone(),
            name: self.me.name.clone(),
            advertise_url: self.me.advertise_url.clone(),
        })
    }

    /// First half of joining: check the token and make the request to send to its issuer.
    pub fn prepare_join(&mut self, now: Millis, token: &str) -> Result<JoinPlan, ApiError> {
        if let Some(c) = &self.cluster {
            return Err(ApiError::conflict(
                "in_cluster",
                format!("this node is already in cluster {}; leave it first", c.id),
            ));
        }
        let t = JoinToken::parse(token)?;
        let node = self.fresh_own_record(now);
        let body =
            JoinBody { cluster_id: t.cluster.clone(), token_id: t.token_id.clone(), secret: t.secret.clone(), node };
        let url = format!("{}{}join", t.issuer_url, ACN_PREFIX);
        let pin = t.issuer_pin.clone();
        self.pending_join = Some(t);
        Ok(JoinPlan { url, pin, body: serde_json::to_vec(&body).expect("serialise") })
    }

    /// Second half of joining: adopt the issuer's answer.
    pub fn finish_join(&mut self, wall: Millis, answer: &PeerAnswer) -> Result<NodeStatus, ApiError> {
        let now = self.advance_clocks(wall);
        let t = self.pending_join.take().ok_or_else(|| ApiError::conflict("no_join", "no join in progress"))?;
        if self.cluster.is_some() {
            return Err(ApiError::conflict("in_cluster", "this node joined a cluster meanwhile"));
        }
        let v: Value = serde_json::from_slice(&answer.body)
            .map_err(|_| ApiError::peer_failed("bad_issuer_reply", "the issuer's answer is not JSON"))?;
        if let Some(refused) = answer.refused {
            let msg = v.pointer("/error/message").and_then(|m| m.as_str()).unwrap_or("join refused");
            let kind = match refused {
                ErrorKind::Invalid | ErrorKind::Forbidden | ErrorKind::NotFound | ErrorKind::Conflict => refused,
                _ => ErrorKind::PeerFailed,
            };
            return Err(ApiError::new(kind, "join_refused", format!("the issuer refused the join: {msg}")));
        }
        #[derive(Deserialize)]
        struct JoinReply {
            cluster: ClusterInfo,
            nodes: Vec<NodeRecord>,
            #[serde(default, rename = "timeMs")]
            time_ms: u64,
        }
        let reply: JoinReply = serde_json::from_value(v)
            .map_err(|e| ApiError::peer_failed("bad_issuer_reply", format!("the issuer's answer is malformed: {e}")))?;
        if reply.cluster.id != t.cluster {
            return Err(ApiError::peer_failed("bad_issuer_reply", "the issuer answered for another cluster"));
        }
        let Some(own) = reply.nodes.iter().find(|r| r.id == self.id).cloned() else {
            return Err(ApiError::peer_failed(
                "bad_issuer_reply",
                "the issuer's member list does not include this node",
            ));
        };
        if own.public_key != acn::public_key_b64(&self.key.verifying_key()) || own.admitted.is_none() {
            return Err(ApiError::peer_failed(
                "bad_issuer_reply",
                "the issuer returned a different record for this node",
            ));
        }
        self.members.clear();
        self.hlc.observe(&own.owner_version);
        let mut own = own;
        own.last_seen = 0;
        own.last_seen_ms = 0;
        own.last_seen_age_ms = None;
        own.removed = false;
        own.removal = None;
        own.admin = None;
        own.admin_state = AdminState::Active;
        self.members.insert(own.clone());
        let sender_now = (reply.time_ms > 0).then_some(Millis(reply.time_ms));
        if let Some(issuer) = reply.nodes.first().filter(|r| r.id != self.id) {
            let issuer = issuer.id.clone();
            if reply.time_ms > 0 {
                self.members.record_clock_offset(&issuer, reply.time_ms as i64 - wall.0 as i64);
            }
        }
        let out = self.members.merge(now, &reply.nodes, sender_now, Trust::JoinReply, &mut self.hlc);
        // We just heard from the issuer: it is up (and the earliest member, not us, leads).
        if let Some(issuer) = reply.nodes.first().filter(|r| r.id != self.id) {
            let issuer = issuer.id.clone();
            self.members.saw_at(&issuer, now, now);
        }
        self.cluster = Some(reply.cluster.clone());
        self.persist(PersistOp::PutCluster(reply.cluster.clone()));
        self.own_volumes.clear();
        self.persist_own_volumes();
        self.persist(PersistOp::PutRecord(Box::new(own)));
        self.apply_merge(wall, out);
        self.start_timers(now);
        self.meta = Meta::new(self.id.clone(), self.config.meta.clone(), now);
        self.push_output(Output::Meta(MetaPersist::Clear));
        Ok(self.status(wall))
    }

    /// Forget a join whose request never got an answer.
    pub fn abort_join(&mut self) {
        self.pending_join = None;
    }
}
