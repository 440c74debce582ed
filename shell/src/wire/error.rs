//! Answers of the HTTP API as JSON: an error is `{"error": {"code", "message"}}` with its status
//! (the core's [`Reply`], and [`ApiError`] whose [`ErrorKind`] is mapped to a status here), a
//! success the value itself.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use shoal_core::answer::{ApiError, ErrorKind, PeerAnswer, Reply};

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
        ErrorKind::Unauthorized => 401,
        ErrorKind::WrongMethod => 405,
        ErrorKind::Gone => 410,
        ErrorKind::TooMany => 429,
    }
}

/// A peer's HTTP answer in the core's terms: any 2xx is carried out, every other status the
/// kind of refusal it stands for ([`status_of`] read backwards; an unlisted 4xx is a refusal
/// of the request, an unlisted 5xx a failure of the peer).
pub fn peer_answer(status: u16, body: Vec<u8>) -> PeerAnswer {
    let kind = match status {
        200..=299 => return PeerAnswer::ok(body),
        401 => ErrorKind::Unauthorized,
        403 => ErrorKind::Forbidden,
        404 => ErrorKind::NotFound,
        405 => ErrorKind::WrongMethod,
        409 => ErrorKind::Conflict,
        410 => ErrorKind::Gone,
        413 => ErrorKind::TooLarge,
        416 => ErrorKind::BadRange,
        429 => ErrorKind::TooMany,
        503 => ErrorKind::Unavailable,
        504 => ErrorKind::PeerTimeout,
        507 => ErrorKind::StorageFull,
        400..=499 => ErrorKind::Invalid,
        _ => ErrorKind::PeerFailed,
    };
    PeerAnswer::refused(kind, body)
}

/// A refused command as its JSON error answer.
pub fn api_error_response(e: ApiError) -> Response {
    error_response(status_of(e.kind), e.code, e.message)
}

/// An error answer with `status`, a machine-readable `code` and a message for a person.
pub fn error_response(status: u16, code: &str, message: impl Into<String>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, axum::Json(serde_json::json!({"error": {"code": code, "message": message.into()}}))).into_response()
}

/// The core's answer as an HTTP response.
pub fn reply_response(r: Reply) -> Response {
    let status = r.refused.map_or(200, status_of);
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, axum::Json(r.body)).into_response()
}

/// A result of the admin API: 200 with the value as JSON (the core's result types give the
/// shapes), or its error.
pub fn api_result<T: serde::Serialize>(r: Result<T, ApiError>) -> Response {
    match r {
        Ok(v) => (StatusCode::OK, axum::Json(v)).into_response(),
        Err(e) => api_error_response(e),
    }
}

/// A core result as JSON, for an answer the shell adds to or picks from.
pub fn json_of<T: serde::Serialize>(t: T) -> Value {
    serde_json::to_value(t).expect("core results serialise")
}
