//! Namespace helpers (placeholder; see the metadata issue).
