//! How a request ends, in the core's own terms: [`ApiError`] for a refused command (its
//! [`ErrorKind`], a stable code and a message), [`Reply`] for the core's answer to a peer's
//! request, and [`PeerAnswer`] for a peer's answer to this node's request. HTTP statuses
//! are the shell's (`shell/src/wire/error.rs` maps each kind to a status and back).

use serde_json::{json, Value};

/// What kind of refusal an [`ApiError`] is; the shell maps each to its HTTP status
/// (`shell/src/wire/error.rs`, both ways), so the core speaks no HTTP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The request itself is wrong (a bad path, value, body or token).
    Invalid,
    /// Not allowed to anyone asking this way (a trusted key without approval, a used-up token).
    Forbidden,
    NotFound,
    /// The state of the cluster does not allow it now (not in a cluster, a busy path, a race).
    Conflict,
    TooLarge,
    /// A byte range outside the file.
    BadRange,
    /// This node failed (its disk, its store).
    Internal,
    /// A peer refused or could not be reached.
    PeerFailed,
    /// Not now: too many sessions, no readable copy.
    Unavailable,
    /// A peer did not answer in time.
    PeerTimeout,
    /// A disk is full.
    StorageFull,
    /// A peer request that is not signed, or not by a member (the ACN's refusals).
    Unauthorized,
    /// A known endpoint asked with the wrong method.
    WrongMethod,
    /// What was asked for is no longer kept here (a log compacted past the asked index).
    Gone,
    /// Too many tries: wait (failed logins' backoff).
    TooMany,
}

/// A refused command: its kind, a stable code and a message for the operator.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub kind: ErrorKind,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(kind: ErrorKind, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { kind, code, message: message.into() }
    }
    pub fn invalid(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::Invalid, code, message)
    }
    pub fn forbidden(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::Forbidden, code, message)
    }
    pub fn not_found(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::NotFound, code, message)
    }
    pub fn conflict(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::Conflict, code, message)
    }
    pub fn too_large(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::TooLarge, code, message)
    }
    pub fn bad_range(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::BadRange, code, message)
    }
    pub fn internal(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::Internal, code, message)
    }
    pub fn peer_failed(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::PeerFailed, code, message)
    }
    pub fn unavailable(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::Unavailable, code, message)
    }
    pub fn peer_timeout(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::PeerTimeout, code, message)
    }
    pub fn storage_full(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(ErrorKind::StorageFull, code, message)
    }
    pub fn not_in_cluster() -> ApiError {
        ApiError::conflict(
            "not_in_cluster",
            "this node is not in a cluster; run `shoal cluster create` or `shoal join TOKEN`",
        )
    }
}

/// The core's JSON answer to a request: a value, or a refusal of some kind with its body
/// (`{"error": {"code", "message"}}`, or a protocol answer such as a lease refusal).
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    /// `None` when the request was carried out.
    pub refused: Option<ErrorKind>,
    pub body: Value,
}

impl Reply {
    pub fn ok(body: Value) -> Reply {
        Reply { refused: None, body }
    }
    /// A refusal whose body is not the error shape (e.g. "409 with the lease").
    pub fn refused(kind: ErrorKind, body: Value) -> Reply {
        Reply { refused: Some(kind), body }
    }
    pub fn error(kind: ErrorKind, code: &str, message: impl Into<String>) -> Reply {
        Reply::refused(kind, json!({"error": {"code": code, "message": message.into()}}))
    }
    pub fn is_ok(&self) -> bool {
        self.refused.is_none()
    }
}

impl From<ApiError> for Reply {
    fn from(e: ApiError) -> Reply {
        Reply::error(e.kind, e.code, e.message)
    }
}

/// A peer's answer to a request this node made: carried out (`refused: None`) or refused,
/// and the body as it came.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerAnswer {
    pub refused: Option<ErrorKind>,
    pub body: Vec<u8>,
}

impl PeerAnswer {
    pub fn ok(body: Vec<u8>) -> PeerAnswer {
        PeerAnswer { refused: None, body }
    }
    pub fn refused(kind: ErrorKind, body: Vec<u8>) -> PeerAnswer {
        PeerAnswer { refused: Some(kind), body }
    }
    pub fn is_ok(&self) -> bool {
        self.refused.is_none()
    }
}
