//! What the CLI shows a person: lines on stdout, failures on stderr (with the log's filter),
//! and numbers (`--json` keeps the exact numbers): sizes in B, KiB, MiB, GiB or TiB and
//! durations as `15s`, `2m`, `1h`, `7d` — the same way an operator writes them in
//! `shoal config set`.

use serde_json::Value;

/// A failure to report on stderr.
#[derive(Debug)]
pub struct CliError(pub String);

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Print a line on stdout. A reader that went away (`shoal ls | head -1`, a demo piped into a
/// closed pager) is no error: the output is dropped rather than the process panicking.
pub fn say(text: impl std::fmt::Display) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{text}");
}

pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SHOAL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// `n` bytes for a person: `512 B`, `1.5 KiB`, `20.0 MiB`, `3.2 GiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// `ms` milliseconds in the largest unit that divides it: `15s`, `500ms`, `2m`, `1h`, `7d`.
pub fn duration_ms(ms: u64) -> String {
    for (unit, len) in [("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)] {
        if ms >= len && ms.is_multiple_of(len) {
            return format!("{}{unit}", ms / len);
        }
    }
    format!("{ms}ms")
}

/// A JSON size field for a person (as it is when it is not a number).
pub fn bytes_of(v: &Value) -> String {
    v.as_u64().map(bytes).unwrap_or_else(|| v.to_string())
}

/// A config value for a person, given its declared type (`duration`, `bytes`, ...).
pub fn config_value(v: &Value, ty: Option<&str>) -> String {
    match (ty, v.as_u64()) {
        (Some("duration"), Some(ms)) => duration_ms(ms),
        (Some("bytes"), Some(n)) => bytes(n),
        _ => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sizes_and_durations_read_as_an_operator_writes_them() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(20 * 1024 * 1024), "20.0 MiB");
        assert_eq!(bytes(3 << 40), "3.0 TiB");
        assert_eq!(bytes(5 << 50), "5120.0 TiB");
        assert_eq!(duration_ms(15_000), "15s");
        assert_eq!(duration_ms(500), "500ms");
        assert_eq!(duration_ms(120_000), "2m");
        assert_eq!(duration_ms(86_400_000 * 7), "7d");
        assert_eq!(duration_ms(1_500), "1500ms");
        assert_eq!(duration_ms(0), "0ms");
        assert_eq!(config_value(&json!(15000), Some("duration")), "15s");
        assert_eq!(config_value(&json!(65536), Some("bytes")), "64.0 KiB");
        assert_eq!(config_value(&json!(15000), Some("int")), "15000");
        assert_eq!(config_value(&json!("x"), None), "\"x\"");
        assert_eq!(bytes_of(&json!(2048)), "2.0 KiB");
        assert_eq!(bytes_of(&Value::Null), "null");
    }
}
