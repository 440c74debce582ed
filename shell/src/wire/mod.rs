//! What both ends of shoal's HTTP agree on, in one place: header names and how a path or a
//! query value is written into a request target. The CLI and the node's services both use it;
//! it imports nothing else of the shell.

pub mod error;

/// A file's SHA-256: sent by a client with a put (checked before anything is published),
/// answered on a get.
pub const SHA_HEADER: &str = "x-shoal-sha256";
/// Which copy answered a get (`<node id>:<volume id>/<path>`).
pub const COPY_HEADER: &str = "x-shoal-copy";
/// A chunk's SHA-256 on `store/chunk` and `store/read` (reference-facts.md "Chunked store/*").
pub const CHUNK_SHA_HEADER: &str = "x-aroz-chunk-sha256";
/// The whole file's size on `store/read`.
pub const FILE_SIZE_HEADER: &str = "x-aroz-file-size";

/// Percent-encode a query value: RFC 3986 unreserved characters and `/` stay as they are.
pub fn escape_query(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Percent-encode one path segment (a `/` in it is encoded too).
pub fn escape_segment(v: &str) -> String {
    escape_query(v).replace('/', "%2F")
}

/// The API target of a file in `cluster:/`: `/v1/files` + the path, each segment encoded.
pub fn files_target(path: &str) -> String {
    format!("/v1/files{}", escape_query(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_and_paths_are_encoded_byte_by_byte() {
        assert_eq!(escape_query("/a b/ü?&=#%"), "/a%20b/%C3%BC%3F%26%3D%23%25");
        assert_eq!(escape_segment("a/b c"), "a%2Fb%20c");
        assert_eq!(files_target("/photos/cat 1.jpg"), "/v1/files/photos/cat%201.jpg");
    }
}
