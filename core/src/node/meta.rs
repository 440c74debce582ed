//! The node's side of the metadata store: routing `meta/*` requests and answers to [`Meta`],
//! feeding it the lease candidates from membership, and the admin commands on records
//! (status, settings, policies, listing). Spec: "Metadata store (ACMS)", "Admin API".

use super::{ApiError, Node, Output, Purpose, Reply};
use crate::membership::NodeState;
use crate::meta::lease::Candidate;
use crate::meta::machine::{Meta, MetaOutput};
use crate::meta::records::{Policy, Record, RecordKind, Setting};
use crate::records::AdminState;
use crate::time::Millis;
use crate::NodeId;
use serde::Serialize;
use serde_json::Value;

/// Longest setting key.
pub const SETTING_KEY_MAX: usize = 256;
/// Largest setting value, as JSON.
pub const SETTING_VALUE_MAX_BYTES: usize = 64 * 1024;
/// Most copies a folder policy may ask for.
pub const POLICY_REPLICAS_MAX: u32 = 64;

/// `meta status` of this node.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodeMetaStatus {
    pub node: NodeId,
    #[serde(flatten)]
    pub meta: crate::meta::machine::MetaStatus,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SettingList {
    pub settings: Vec<Setting>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PolicyList {
    pub policies: Vec<Policy>,
}

/// `meta ls`: a folder's immediate children.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Listing {
    pub path: String,
    pub entries: Vec<crate::meta::namespace::ListEntry>,
}

/// One copy of a file, written `node:volume/path`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CopyView {
    pub copy: String,
    pub node_id: NodeId,
    pub volume_id: crate::ids::VolumeId,
    pub state: crate::meta::records::LocationState,
    pub checksum: String,
}

/// `meta stat`: a file with its copies and policy, or a folder with its child count.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged, rename_all_fields = "camelCase")]
pub enum Stat {
    File {
        path: String,
        record: Box<crate::meta::records::FileRecord>,
        copies: Vec<CopyView>,
        wanted_copies: u32,
        policy: u32,
    },
    Folder {
        path: String,
        is_dir: bool,
        children: usize,
        policy: u32,
    },
}

impl Node {
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// Every live member with whether it may hold the lease: ONLINE or DEGRADED. When no member
    /// is (an admin put every node in maintenance or draining), members that are up regardless
    /// of their admin state may hold it, so submits never wait for a leader that cannot exist.
    pub(super) fn lease_candidates(&self, now: Millis) -> Vec<Candidate> {
        let heard_within = self.meta.lease_ms().max(self.config.membership.heartbeat_interval_ms.saturating_mul(3) / 2);
        let pick = |relaxed: bool| -> Vec<Candidate> {
            self.members
                .records()
                .filter(|r| !r.removed)
                .map(|r| {
                    let reachable = r.id == self.id
                        || (matches!(self.members.liveness(&r.id, now), NodeState::Online | NodeState::Degraded)
                            && now.since(self.members.last_seen(&r.id)) <= heard_within);
                    let eligible = if r.id == self.id {
                        relaxed || r.admin_state == AdminState::Active
                    } else {
                        let st =
                            if relaxed { self.members.liveness(&r.id, now) } else { self.members.state(&r.id, now) };
                        // Not heard from for a lease (or two heartbeats, whichever is longer): no claim waits for it, though it still counts as ONLINE
                        // for a while. A leader that died is passed over as soon as its lease
                        // ran out, not once it stops being ONLINE (issue 18 "Failover").
                        let heard = relaxed || now.since(self.members.last_seen(&r.id)) <= heard_within;
                        matches!(st, NodeState::Online | NodeState::Degraded) && heard
                    };
                    Candidate { id: r.id.clone(), joined: r.joined, eligible, reachable }
                })
                .collect()
        };
        let strict = pick(false);
        if strict.iter().any(|c| c.eligible) {
            strict
        } else {
            pick(true)
        }
    }

    /// Turn what the metadata store asked for into node outputs (signed requests, writes).
    pub(super) fn drain_meta(&mut self, wall: Millis, now: Millis) {
        while let Some(o) = self.meta.poll_output() {
            match o {
                MetaOutput::Persist(p) => self.push_output(Output::Meta(p)),
                MetaOutput::Send { to, method, target, body, purpose } => {
                    self.new_request(wall, now, &to, method, &target, body, Purpose::Meta(purpose));
                }
                MetaOutput::Refused { from, what, why } => {
                    self.push_output(Output::Event(super::Event::MetaRefused { from, what, why }))
                }
            }
        }
    }

    pub(super) fn answer_meta(
        &mut self,
        wall: Millis,
        now: Millis,
        endpoint: &str,
        sender: &NodeId,
        query: &str,
        body: &[u8],
    ) -> Reply {
        let r = match endpoint {
            "meta/lease" => self.meta.answer_lease(now, sender, body),
            "meta/append" => self.meta.answer_append(now, sender, body, &mut self.hlc),
            "meta/submit" => self.meta.answer_submit(now, sender, body, &mut self.hlc),
            "meta/log" => self.meta.answer_log(query),
            "meta/based" => self.meta.answer_based(body),
            _ => self.meta.answer_snapshot(query),
        };
        self.drain_meta(wall, now);
        if matches!(endpoint, "meta/append" | "meta/submit") && body.windows(5).any(|w| w == b"\"job\"") {
            // A job record arrived: a cancel reaches a run here at once, a submit a pass.
            self.jobs_records_arrived(wall, now);
        }
        r
    }

    pub(super) fn in_cluster(&self) -> Result<(), ApiError> {
        if self.cluster.is_none() {
            return Err(ApiError::not_in_cluster());
        }
        Ok(())
    }

    /// Submit a locally made record.
    pub(super) fn submit_record(&mut self, wall: Millis, record: Record) {
        let now = self.advance_clocks(wall);
        self.meta.submit(now, record, &mut self.hlc);
        self.drain_meta(wall, now);
    }

    /// Records that must reach the other nodes together (`Meta::submit_all`).
    pub(super) fn submit_records(&mut self, wall: Millis, records: Vec<Record>) {
        let now = self.advance_clocks(wall);
        self.meta.submit_all(now, records, &mut self.hlc);
        self.drain_meta(wall, now);
    }

    pub fn meta_status(&self, wall: Millis) -> NodeMetaStatus {
        let now = self.clock.peek(wall);
        NodeMetaStatus { node: self.id.clone(), meta: self.meta.status(now) }
    }

    pub fn setting_get(&self, key: &str) -> Result<Setting, ApiError> {
        if key.starts_with(crate::config::RESERVED_PREFIX) {
            return Err(ApiError::not_found("unknown_setting", format!("no setting {key:?}")));
        }
        match self.meta.state().get(RecordKind::Setting, key) {
            Some(Record::Setting(s)) if !s.removed => Ok(s.clone()),
            _ => Err(ApiError::not_found("unknown_setting", format!("no setting {key:?}"))),
        }
    }

    pub fn settings_list(&self) -> SettingList {
        // The config plane's own records (values, history, proposals) are not settings.
        let settings = self
            .meta
            .state()
            .of_kind(RecordKind::Setting)
            .filter(|r| !r.is_removed() && !r.key().starts_with(crate::config::RESERVED_PREFIX))
            .filter_map(|r| match r {
                Record::Setting(s) => Some(s.clone()),
                _ => None,
            })
            .collect();
        SettingList { settings }
    }

    /// Set (or with `None`, remove) a cluster-wide setting.
    pub fn setting_set(&mut self, wall: Millis, key: &str, value: Option<Value>) -> Result<Setting, ApiError> {
        self.in_cluster()?;
        if key.starts_with(crate::config::RESERVED_PREFIX) {
            return Err(ApiError::invalid(
                "reserved_key",
                "keys under config/ belong to the config plane: use `shoal config set` (with --why)",
            ));
        }
        if key.is_empty() || key.len() > SETTING_KEY_MAX || key.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(ApiError::invalid(
                "bad_key",
                "a setting key is 1 to 256 characters without spaces or control characters",
            ));
        }
        if let Some(v) = &value {
            if serde_json::to_vec(v).map(|b| b.len()).unwrap_or(usize::MAX) > SETTING_VALUE_MAX_BYTES {
                return Err(ApiError::invalid("bad_value", "a setting value is at most 64 KiB of JSON"));
            }
            if crate::meta::records::json_depth(v) > crate::meta::records::API_VALUE_DEPTH_MAX {
                return Err(ApiError::invalid(
                    "bad_value",
                    format!(
                        "a setting value nests at most {} levels of arrays and objects",
                        crate::meta::records::API_VALUE_DEPTH_MAX
                    ),
                ));
            }
        }
        let removed = value.is_none();
        let setting = Setting {
            key: key.to_string(),
            value: value.unwrap_or(Value::Null),
            removed,
            version: self.hlc.next(wall),
        };
        self.submit_record(wall, Record::Setting(setting.clone()));
        Ok(setting)
    }

    pub fn policy_list(&self) -> PolicyList {
        PolicyList { policies: self.meta.state().policies().filter(|p| !p.removed).cloned().collect() }
    }

    /// Set the copy count of a folder (0 removes the policy, so the parent's applies).
    pub fn policy_set(&mut self, wall: Millis, folder: &str, replicas: u32) -> Result<Policy, ApiError> {
        self.in_cluster()?;
        let folder =
            crate::meta::namespace::normalize(folder).map_err(|e| ApiError::invalid("bad_path", e.to_string()))?;
        if replicas > POLICY_REPLICAS_MAX {
            return Err(ApiError::invalid("bad_replicas", format!("at most {POLICY_REPLICAS_MAX} copies")));
        }
        let policy = Policy { folder, replicas, removed: replicas == 0, version: self.hlc.next(wall) };
        self.submit_record(wall, Record::Policy(policy.clone()));
        Ok(policy)
    }

    /// Submit any record made elsewhere in the node (storage, jobs); versions are the caller's.
    pub fn submit_meta_record(&mut self, wall: Millis, record: Record) -> Result<(), ApiError> {
        self.in_cluster()?;
        self.submit_record(wall, record);
        Ok(())
    }

    /// A new version for a record this node writes.
    pub fn next_version(&mut self, wall: Millis) -> crate::hlc::Version {
        self.hlc.next(wall)
    }
}

impl Node {
    /// `meta ls`: the immediate children of a folder, tombstones hidden.
    pub fn meta_ls(&self, path: &str) -> Result<Listing, ApiError> {
        let dir = crate::meta::namespace::normalize(path).map_err(|e| ApiError::invalid("bad_path", e.to_string()))?;
        let entries = crate::meta::namespace::list(self.meta.state(), &dir)
            .map_err(|e| ApiError::invalid("bad_path", e.to_string()))?;
        Ok(Listing { path: dir, entries })
    }

    /// `meta stat`: one record with its copies written node first, its policy and checksum.
    pub fn meta_stat(&self, path: &str) -> Result<Stat, ApiError> {
        use crate::meta::namespace;
        let p = namespace::normalize(path).map_err(|e| ApiError::invalid("bad_path", e.to_string()))?;
        let state = self.meta.state();
        match state.file(&p).filter(|f| !f.removed) {
            Some(f) => {
                let copies = f
                    .locations
                    .iter()
                    .map(|l| CopyView {
                        copy: format!("{}:{}{}", l.node_id, l.volume_id, f.path),
                        node_id: l.node_id.clone(),
                        volume_id: l.volume_id.clone(),
                        state: l.state,
                        checksum: l.checksum.clone(),
                    })
                    .collect();
                Ok(Stat::File {
                    path: f.path.clone(),
                    record: Box::new(f.clone()),
                    copies,
                    wanted_copies: namespace::wanted_copies(state, f),
                    policy: namespace::policy_for(state, &f.path),
                })
            }
            None => {
                let children = namespace::list(state, &p).map(|l| l.len()).unwrap_or(0);
                if p == "/" || children > 0 {
                    let policy = namespace::policy_for(state, &p);
                    Ok(Stat::Folder { path: p, is_dir: true, children, policy })
                } else {
                    Err(ApiError::not_found("not_found", format!("nothing at cluster:{p}")))
                }
            }
        }
    }
}

impl Node {
    /// The valid metadata lease as this node sees it at wall time `wall`.
    pub fn meta_leader(&self, wall: Millis) -> Option<crate::meta::lease::Lease> {
        self.meta.leader(self.clock.peek(wall)).cloned()
    }
}

/// How a client's change is acknowledged (`meta.ack`, issue 18 "Acknowledged means safe").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckMode {
    /// Once another node holds it (the leader, or a follower when this node leads).
    Replicated,
    /// Once another node holds it and this node's store has fsynced it.
    Durable,
    /// At once: a crash of this node within the store's write-behind window loses it.
    Local,
}

/// What an acknowledgement waits for: the mode, its bound, and the changes it covers (made
/// between `from`, taken before the request, and `to`, after it).
#[derive(Clone, Debug)]
pub struct AckPlan {
    pub mode: AckMode,
    pub wait_ms: u64,
    pub from: crate::meta::machine::WriteMark,
    pub to: crate::meta::machine::WriteMark,
}

/// What an acknowledgement reached (the `x-shoal-ack` header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckReached {
    /// Another node holds every change the request made.
    Replicated,
    /// No other member is reachable now: the change is as safe as this node's disk.
    Alone,
    /// No other node can be counted holding the change any more (it was numbered under a term
    /// the log has left, see `Meta::mark_never_held`): answered `unconfirmed` at once rather
    /// than at the end of `meta.ack_wait`. The change still travels.
    Unconfirmed,
    /// The leader refused a record of the change (its version too far ahead of the leader's
    /// clock, or out of bounds): it is made on this node only and will not travel as it is.
    Refused,
    /// The leader refused a remove or a move because the file changed after this node decided
    /// it (another node's change had not reached this node yet): undone here; the client gets
    /// a conflict and may try again.
    Changed,
}

/// Whether a client's request waits for its changes to be safe (`meta.ack`): every change but a
/// login, whose only replicated write is its audit entry (a session is this node's own, and a
/// login must not wait on a leader the member cannot reach: it falls back to the local
/// directory within the forward-auth timeout).
pub fn waits_for_ack(method: &str, path: &str) -> bool {
    !matches!(method, "GET" | "HEAD") && path != "/v1/login"
}

/// Default bound of an acknowledgement's wait (`meta.ack_wait`).
pub const ACK_WAIT_MS: u64 = 5_000;

impl Node {
    /// Taken before a client's request: where this node's writes stand.
    pub fn ack_position(&self) -> crate::meta::machine::WriteMark {
        self.meta.write_mark()
    }

    /// Taken right after a client's request made its changes: what its acknowledgement waits for.
    pub fn ack_plan(&self, from: crate::meta::machine::WriteMark) -> AckPlan {
        self.ack_plan_between(from, self.meta.write_mark())
    }

    /// The plan for exactly the changes made between two marks, taken by the caller around
    /// its writes under one hold of the node (nothing else can fall between them): a request
    /// then waits for its own changes only, not for those other requests made meanwhile
    /// (issue 18).
    pub fn ack_plan_between(
        &self,
        from: crate::meta::machine::WriteMark,
        to: crate::meta::machine::WriteMark,
    ) -> AckPlan {
        let applied = |key: &str| self.config_applied.as_ref()?.get("meta")?.get(key)?.value.clone();
        let mode = match applied("ack").as_ref().and_then(|v| v.as_str()) {
            Some("durable") => AckMode::Durable,
            Some("local") => AckMode::Local,
            _ => AckMode::Replicated,
        };
        let wait_ms = applied("ack_wait").and_then(|v| v.as_u64()).unwrap_or(ACK_WAIT_MS);
        AckPlan { mode, wait_ms, from, to }
    }

    /// What [`Node::ack_ready`] and [`Node::file_record_held_elsewhere`] read, but time: while
    /// it is unchanged after a call, a wait for one of them need not look again (the shell
    /// looks at every driver turn too, where liveness moves with time).
    pub fn held_progress(&self) -> (bool, crate::meta::machine::HeldProgress) {
        (self.cluster.is_some(), self.meta.held_progress())
    }

    /// Whether the changes of `plan` may be answered, and how: another node holds them, the
    /// leader refused one, no other member is alive by its heartbeats (a node alone keeps
    /// working), or no other node can be counted holding them any more (`Unconfirmed`, at once).
    /// `None`: not yet.
    pub fn ack_ready(&self, wall: Millis, plan: &AckPlan) -> Option<AckReached> {
        if self.cluster.is_none() {
            return Some(AckReached::Alone);
        }
        if self.meta.mark_changed(&plan.from, &plan.to) {
            return Some(AckReached::Changed);
        }
        if self.meta.mark_refused(&plan.from, &plan.to) {
            return Some(AckReached::Refused);
        }
        // A single-member cluster: no other node can ever hold it (the log counts it held at
        // once), so it is `alone`, answered once this node's store has committed it. Before,
        // such an install answered `replicated` at once, before anything was on its disk.
        // (`durable` waits for that commit anyway, and says `durable` as before.)
        if plan.mode != AckMode::Durable && !self.members.records().any(|r| !r.removed && r.id != self.id) {
            return Some(AckReached::Alone);
        }
        if self.meta.mark_held(&plan.from, &plan.to) {
            return Some(AckReached::Replicated);
        }
        let now = self.clock.peek(wall);
        let alive = self
            .members
            .records()
            .filter(|r| !r.removed && r.id != self.id)
            .any(|r| matches!(self.members.liveness(&r.id, now), NodeState::Online | NodeState::Degraded));
        if !alive {
            return Some(AckReached::Alone);
        }
        self.meta.mark_never_held(&plan.from, &plan.to).then_some(AckReached::Unconfirmed)
    }
}
