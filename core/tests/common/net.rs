//! A hand-driven network of in-memory nodes (used by `node.rs` and `jobs.rs`): every
//! `Output::Send` is delivered to the addressed node's `handle_acn` and its reply fed back as
//! `Input::Response`; each node has its own wall clock (a fixed offset from the test's true time).

#![allow(dead_code)]

use super::{answer, Json, Status};
use ed25519_dalek::SigningKey;
use serde_json::Value;
use shoal_core::acn::SignedHeaders;
use shoal_core::ids::NodeId;
use shoal_core::membership::NodeState;
use shoal_core::node::{ApiError, Event, Input, Node, NodeConfig, NodeStatus, Output, PersistOp, Reply, SelfInfo};
use shoal_core::records::Capabilities;
use shoal_core::time::Millis;

pub const T0: Millis = Millis(1_700_000_000_000);
pub const JOIN: &str = "/cluster/acn/join";

pub fn id_of(i: usize) -> NodeId {
    NodeId::new(format!("aaaaaaaa-aaaa-4aaa-8aaa-{:012x}", i + 1))
}

pub fn key_of(seed: u8) -> SigningKey {
    SigningKey::from_bytes(&[seed; 32])
}

pub fn url_of(i: usize) -> String {
    format!("http://10.0.0.{}:7000", i + 1)
}

pub fn new_node(i: usize, id: NodeId, key: SigningKey) -> Node {
    let me = SelfInfo {
        name: format!("node-{i}"),
        advertise_url: url_of(i),
        software_version: "0.1.0".into(),
        capabilities: Capabilities::default(),
        tls_pin: String::new(),
    };
    Node::new(id, key, 1000 + i as u64, NodeConfig::default(), me)
}

pub fn body_bytes(r: &Reply) -> Vec<u8> {
    serde_json::to_vec(&r.body).unwrap()
}

pub fn code(r: &Reply) -> &str {
    r.body.pointer("/error/code").and_then(Value::as_str).unwrap_or("")
}

/// One delivered request: to which node, which endpoint, and the answer (None: no route).
#[derive(Clone, Debug)]
pub struct Sent {
    pub to: Option<usize>,
    pub target: String,
    pub status: Option<u16>,
    /// The error code of a refusal, for the failure messages.
    #[allow(dead_code)]
    pub code: String,
}

/// A hand-driven network of nodes. Node `i` listens on `url_of(i)`.
pub struct Net {
    pub nodes: Vec<Node>,
    pub keys: Vec<SigningKey>,
    pub offsets_ms: Vec<i64>,
    /// True time; node `i` reads `now + offsets_ms[i]`.
    pub now: Millis,
    pub events: Vec<Vec<Event>>,
    pub persisted: Vec<Vec<PersistOp>>,
    /// Every request each node sent, in order.
    pub sent: Vec<Vec<Sent>>,
    /// Nodes that are switched off: no timers, unreachable.
    pub down: Vec<bool>,
    /// Nodes cut off from the others: their timers run, but nothing they send arrives and
    /// nothing reaches them.
    pub isolated: Vec<bool>,
    /// Job runs handed to each node's shell (`Output::JobRun`) and stops asked of it.
    pub runs: Vec<Vec<shoal_core::node::jobs::JobRun>>,
    pub stops: Vec<Vec<(shoal_core::ids::JobId, u32)>>,
}

impl Net {
    /// `offsets_ms[i]` is how far node i's clock is off the true time.
    pub fn new(offsets_ms: &[i64]) -> Net {
        let n = offsets_ms.len();
        let keys: Vec<SigningKey> = (0..n).map(|i| key_of(i as u8 + 1)).collect();
        Net {
            nodes: (0..n).map(|i| new_node(i, id_of(i), keys[i].clone())).collect(),
            keys,
            offsets_ms: offsets_ms.to_vec(),
            now: T0,
            events: vec![Vec::new(); n],
            persisted: vec![Vec::new(); n],
            sent: vec![Vec::new(); n],
            down: vec![false; n],
            isolated: vec![false; n],
            runs: vec![Vec::new(); n],
            stops: vec![Vec::new(); n],
        }
    }

    pub fn clock(&self, i: usize) -> Millis {
        Millis((self.now.0 as i64 + self.offsets_ms[i]) as u64)
    }

    pub fn id(&self, i: usize) -> NodeId {
        self.nodes[i].id().clone()
    }

    /// Deliver every queued output until the network is quiet.
    pub fn pump(&mut self) {
        for _round in 0..1000 {
            let mut moved = false;
            for i in 0..self.nodes.len() {
                while let Some(o) = self.nodes[i].poll_output() {
                    moved = true;
                    match o {
                        Output::Send(req) => {
                            let target = (0..self.nodes.len()).find(|&j| url_of(j) == req.url);
                            let result = match target {
                                Some(j) if j != i && !self.down[j] && !self.isolated[i] && !self.isolated[j] => {
                                    assert_eq!(self.nodes[j].id(), &req.to, "{} is addressed to {}", req.url, req.to);
                                    let at = self.clock(j);
                                    let r = self.nodes[j].handle_acn(
                                        at,
                                        req.method,
                                        &req.target,
                                        Some(&req.headers()),
                                        &req.body,
                                    );
                                    let c = code(&r).to_string();
                                    self.sent[i].push(Sent {
                                        to: Some(j),
                                        target: req.target.clone(),
                                        status: Some(r.status()),
                                        code: c,
                                    });
                                    Ok(answer(r.status(), body_bytes(&r)))
                                }
                                _ => {
                                    let s = Sent {
                                        to: None,
                                        target: req.target.clone(),
                                        status: None,
                                        code: String::new(),
                                    };
                                    self.sent[i].push(s);
                                    Err(format!("no route to {}", req.url))
                                }
                            };
                            let at = self.clock(i);
                            self.nodes[i].handle(at, Input::Response { token: req.token, result });
                        }
                        Output::Persist(p) => self.persisted[i].push(p),
                        Output::Meta(_)
                        | Output::ConfigFiles(_)
                        | Output::Chore(_)
                        | Output::ScrubCopy(_)
                        | Output::ReplDispatch { .. }
                        | Output::TunnelOpen { .. }
                        | Output::TunnelClose { .. }
                        | Output::WakeBroadcast { .. }
                        | Output::SampleHealth => {}
                        Output::JobRun(run) => self.runs[i].push(*run),
                        Output::JobStop { job, attempt, .. } => self.stops[i].push((job, attempt)),
                        Output::Event(e) => self.events[i].push(e),
                    }
                }
            }
            if !moved {
                return;
            }
        }
        panic!("the network never went quiet");
    }

    /// Advance true time in `step_ms` steps for `total_ms`, firing due timers and delivering.
    pub fn run_for(&mut self, total_ms: u64, step_ms: u64) {
        let end = self.now.plus(total_ms);
        while self.now < end {
            self.now = self.now.plus(step_ms).min(end);
            for i in 0..self.nodes.len() {
                let at = self.clock(i);
                if !self.down[i] && self.nodes[i].poll_timeout().is_some_and(|d| d <= at) {
                    self.nodes[i].handle_timeout(at);
                }
            }
            self.pump();
        }
    }

    pub fn token(&mut self, issuer: usize) -> String {
        let at = self.clock(issuer);
        let t = self.nodes[issuer].new_token(at, None, None).expect("issue a token");
        self.pump();
        t.json()["token"].as_str().unwrap().to_string()
    }

    /// `joiner` presents `token` to `issuer`: prepare, POST join, finish; then deliver.
    pub fn join_with(
        &mut self,
        joiner: &mut Node,
        joiner_clock: Millis,
        issuer: usize,
        token: &str,
    ) -> (Reply, Result<NodeStatus, ApiError>) {
        let plan = joiner.prepare_join(joiner_clock, token).expect("prepare join");
        assert_eq!(plan.url, format!("{}{JOIN}", url_of(issuer)));
        let at = self.clock(issuer);
        let reply = self.nodes[issuer].handle_acn(at, "POST", JOIN, None, &plan.body);
        let done = joiner.finish_join(joiner_clock, &answer(reply.status(), body_bytes(&reply)));
        (reply, done)
    }

    /// Node `joiner` of this net joins through `issuer` with a fresh token.
    pub fn join(&mut self, joiner: usize, issuer: usize) -> (Reply, Result<NodeStatus, ApiError>) {
        let token = self.token(issuer);
        let at = self.clock(joiner);
        // Take the joiner out so both it and the issuer can be borrowed.
        let placeholder = new_node(99, id_of(99), key_of(99));
        let mut j = std::mem::replace(&mut self.nodes[joiner], placeholder);
        let out = self.join_with(&mut j, at, issuer, &token);
        self.nodes[joiner] = j;
        self.pump();
        out
    }

    pub fn live_members(&self, i: usize) -> Vec<NodeId> {
        self.nodes[i].members().records().filter(|r| !r.removed).map(|r| r.id.clone()).collect()
    }

    pub fn state(&self, at: usize, of: usize) -> NodeState {
        self.nodes[at].members().state(&self.id(of), self.clock(at))
    }

    /// Everyone in `who` sees exactly `who` as live members, all ONLINE.
    pub fn assert_all_online(&self, who: &[usize]) {
        let mut ids: Vec<NodeId> = who.iter().map(|&i| self.id(i)).collect();
        ids.sort();
        for &i in who {
            assert!(self.nodes[i].cluster().is_some(), "node {i} is in the cluster");
            assert_eq!(self.live_members(i), ids, "members seen by node {i}");
            for &j in who {
                assert_eq!(self.state(i, j), NodeState::Online, "node {j} as seen by node {i}");
            }
        }
    }

    /// Node `i` signs a request as itself, on its own clock.
    pub fn signed(&mut self, i: usize, method: &str, target: &str, body: &[u8]) -> SignedHeaders {
        let at = self.clock(i);
        self.nodes[i].sign(at, method, target, body).expect("in a cluster")
    }
}
