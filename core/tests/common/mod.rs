//! Helpers shared by the core's test files: the tests speak of answers by the HTTP status the
//! shell gives them (`shell/src/wire/error.rs` maps kinds to statuses both ways).

#![allow(dead_code)]

pub mod net;

use shoal_core::answer::{ErrorKind, PeerAnswer, Reply};

/// The kind of refusal an HTTP status names.
pub fn kind_of(status: u16) -> ErrorKind {
    match status {
        400 => ErrorKind::Invalid,
        401 => ErrorKind::Unauthorized,
        403 => ErrorKind::Forbidden,
        404 => ErrorKind::NotFound,
        405 => ErrorKind::WrongMethod,
        409 => ErrorKind::Conflict,
        410 => ErrorKind::Gone,
        413 => ErrorKind::TooLarge,
        416 => ErrorKind::BadRange,
        500 => ErrorKind::Internal,
        502 => ErrorKind::PeerFailed,
        503 => ErrorKind::Unavailable,
        504 => ErrorKind::PeerTimeout,
        507 => ErrorKind::StorageFull,
        other => panic!("no kind for {other}"),
    }
}

/// The HTTP status the shell gives an answer: 200 when carried out.
pub fn status_of(refused: Option<ErrorKind>) -> u16 {
    let Some(kind) = refused else { return 200 };
    const STATUSES: [u16; 14] = [400, 401, 403, 404, 405, 409, 410, 413, 416, 500, 502, 503, 504, 507];
    STATUSES.into_iter().find(|s| kind_of(*s) == kind).expect("every kind has a status")
}

/// A peer's answer with an HTTP status, as the shell hands it to the core.
pub fn answer(status: u16, body: Vec<u8>) -> PeerAnswer {
    if (200..300).contains(&status) {
        PeerAnswer::ok(body)
    } else {
        PeerAnswer::refused(kind_of(status), body)
    }
}

/// The status of one of the core's replies.
pub trait Status {
    fn status(&self) -> u16;
}

impl Status for Reply {
    fn status(&self) -> u16 {
        status_of(self.refused)
    }
}

/// A core result as the JSON the API answers with (the tests read the wire shape).
pub trait Json {
    fn json(&self) -> serde_json::Value;
}

impl<T: serde::Serialize> Json for T {
    fn json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("core results serialise")
    }
}

/// Node 1 of a test cluster (`http://10.0.0.1:7000`, build 0.1.0, a fixed key and seed), not
/// yet in a cluster.
pub fn node_one() -> shoal_core::node::Node {
    use shoal_core::node::{Node, NodeConfig, SelfInfo};
    let me = SelfInfo {
        name: "node-1".into(),
        advertise_url: "http://10.0.0.1:7000".into(),
        software_version: "0.1.0".into(),
        capabilities: shoal_core::records::Capabilities::default(),
        tls_pin: String::new(),
    };
    let id = shoal_core::NodeId::new("aaaaaaaa-aaaa-4aaa-8aaa-000000000001");
    Node::new(id, ed25519_dalek::SigningKey::from_bytes(&[1; 32]), 1001, NodeConfig::default(), me)
}
