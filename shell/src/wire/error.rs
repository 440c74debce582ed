//! Answers of the HTTP API as JSON: an error is `{"error": {"code", "message"}}` with its status
//! (the core's [`Reply`], and [`ApiError`] whose [`ErrorKind`] is mapped to a status here), a
//! success the value itself.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use shoal_core::node::{ApiError, ErrorKind, Reply};

/// The HTTP status of each kind of refusal.
pub fn status_of(kind: ErrorKind) -> u16 {
    match kind {
        ErrorKind::Invalid => 400,
        ErrorKind::Forbidden => 403,
        ErrorKind::NotFound => 404,
        ErrorKind::Conflict => 409,
        ErrorKind::TooLarge => 413,
        ErrorKind::BadRange => 416,
        ErrorKind::Internal => 500,
        ErrorKind::PeerFailed => 502,
        ErrorKind::Unavailable => 503,
        ErrorKind::PeerTimeout => 504,
        ErrorKind::StorageFull => 507,
    }
}

/// A refused command as its JSON error answer.
pub fn api_error_response(e: ApiError) -> Response {
    error_response(status_of(e.kind), e.code, e.message)
}

/// An error answer with `status`, a machine-readable `code` and a message for a person.
pub fn error_response(status: u16, code: &str, message: impl Into<String>) -> Response {
    reply_response(Reply::error(status, code, message))
}

/// The core's answer as an HTTP response.
pub fn reply_response(r: Reply) -> Response {
    let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, axum::Json(r.body)).into_response()
}

/// A result of the admin API: 200 with the value, or its error.
pub fn api_result(r: Result<Value, ApiError>) -> Response {
    match r {
        Ok(v) => (StatusCode::OK, axum::Json(v)).into_response(),
        Err(e) => api_error_response(e),
    }
}
