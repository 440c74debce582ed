//! Helpers shared by the core's test files.

use shoal_core::node::ErrorKind;

/// The kind of refusal an HTTP status names (the shell maps kinds to statuses:
/// `shell/src/wire/error.rs`).
pub fn kind_of(status: u16) -> ErrorKind {
    match status {
        400 => ErrorKind::Invalid,
        403 => ErrorKind::Forbidden,
        404 => ErrorKind::NotFound,
        409 => ErrorKind::Conflict,
        413 => ErrorKind::TooLarge,
        416 => ErrorKind::BadRange,
        502 => ErrorKind::PeerFailed,
        503 => ErrorKind::Unavailable,
        507 => ErrorKind::StorageFull,
        other => panic!("no kind for {other}"),
    }
}
