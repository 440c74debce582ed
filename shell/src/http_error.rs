//! Answers of the HTTP API as JSON: an error is `{"error": {"code", "message"}}` with its status
//! (the core's [`Reply`] and [`ApiError`]), a success the value itself.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use shoal_core::node::{ApiError, Reply};

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
        Err(e) => error_response(e.status, e.code, e.message),
    }
}
