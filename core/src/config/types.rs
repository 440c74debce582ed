//! Declared keys and their values (spec mesh-config.md "How a value resolves"; DESIGN.md
//! "Configuration"): the eight value types, parsing an operator's text into a typed value, and
//! the validation a declaration asks for (range, pattern, enum).
//!
//! Values are kept as JSON: booleans, integers, floats and strings as themselves, durations in
//! milliseconds and sizes in bytes (integers), lists as arrays of strings. An operator writes
//! `15s`, `500ms`, `2m`, `1h`, `7d`; `64MiB`, `1GB`, `4096`; lists as `a,b,c` or a JSON array.

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyType {
    Bool,
    Int,
    Float,
    String,
    /// Milliseconds; written `15s`, `500ms`, `2m`, `1h`, `7d`.
    Duration,
    /// Bytes; written `4096`, `64KiB`, `20MiB`, `1GB`.
    Bytes,
    /// One of the declaration's `choices`.
    Enum,
    /// A list of strings.
    List,
}

impl KeyType {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyType::Bool => "bool",
            KeyType::Int => "int",
            KeyType::Float => "float",
            KeyType::String => "string",
            KeyType::Duration => "duration",
            KeyType::Bytes => "bytes",
            KeyType::Enum => "enum",
            KeyType::List => "list",
        }
    }
}

/// One declared key of a module's manifest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Declaration {
    pub name: String,
    #[serde(rename = "type")]
    pub ty: KeyType,
    /// The default, typed; `None` when the key has none (a required key must then be set).
    #[serde(default)]
    pub default: Option<Value>,
    #[serde(default)]
    pub required: bool,
    /// Inclusive bounds for numbers, durations (ms) and sizes (bytes).
    #[serde(default)]
    pub min: Option<f64>,
    #[serde(default)]
    pub max: Option<f64>,
    /// A regular expression a string (or each list item) must match whole.
    #[serde(default)]
    pub pattern: Option<String>,
    /// The values an enum takes.
    #[serde(default)]
    pub choices: Vec<String>,
    /// The predefined key this one falls back to (mesh and node values of it apply).
    #[serde(default)]
    pub fallback: Option<String>,
    /// Set only through an approved proposal.
    #[serde(default)]
    pub trusted: bool,
    /// The name this key had before.
    #[serde(default)]
    pub renamed_from: Option<String>,
    #[serde(default)]
    pub doc: String,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    #[error("{key}: {text:?} is not a {ty}{hint}")]
    Type { key: String, ty: &'static str, text: String, hint: &'static str },
    #[error("{key}: {value} is below the minimum {min}")]
    Below { key: String, value: String, min: String },
    #[error("{key}: {value} is above the maximum {max}")]
    Above { key: String, value: String, max: String },
    #[error("{key}: {value:?} does not match the pattern {pattern}")]
    Pattern { key: String, value: String, pattern: String },
    #[error("{key}: {value:?} is not one of {choices}")]
    Choice { key: String, value: String, choices: String },
    #[error("{key}: the declaration's pattern {pattern} is not a valid regular expression")]
    BadPattern { key: String, pattern: String },
}

/// Milliseconds in `15s`, `500ms`, `2m`, `1h`, `7d` (or a bare number of ms).
pub fn parse_duration_ms(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult = match unit.trim() {
        "" | "ms" => 1.0,
        "s" => 1e3,
        "m" | "min" => 60e3,
        "h" => 3_600e3,
        "d" => 86_400e3,
        _ => return None,
    };
    let v = n * mult;
    (v.is_finite() && v >= 0.0 && v <= u64::MAX as f64 && v.fract() == 0.0).then_some(v as u64)
}

/// Bytes in `4096`, `64KiB`, `20MiB`, `1GiB`, `1TiB`, `1KB`, `1MB`, `1GB`, `1TB`.
pub fn parse_bytes(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "TiB" => 1024f64.powi(4),
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        _ => return None,
    };
    let v = n * mult;
    (v.is_finite() && v >= 0.0 && v <= u64::MAX as f64 && v.fract() == 0.0).then_some(v as u64)
}

fn type_error(d: &Declaration, text: &str, hint: &'static str) -> ValueError {
    ValueError::Type { key: d.name.clone(), ty: d.ty.as_str(), text: text.to_string(), hint }
}

/// An operator's text (or a JSON value already typed) as the typed value of `d`, validated.
pub fn parse_value(d: &Declaration, input: &Value) -> Result<Value, ValueError> {
    let text = match input {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let v = match d.ty {
        KeyType::Bool => match (input, text.trim()) {
            (Value::Bool(b), _) => Value::Bool(*b),
            (_, "true" | "on" | "yes") => Value::Bool(true),
            (_, "false" | "off" | "no") => Value::Bool(false),
            _ => return Err(type_error(d, &text, " (true or false)")),
        },
        KeyType::Int => match input.as_i64().or_else(|| text.trim().parse().ok()) {
            Some(i) => Value::from(i),
            None => return Err(type_error(d, &text, " (a whole number)")),
        },
        KeyType::Float => match input.as_f64().or_else(|| text.trim().parse::<f64>().ok()).filter(|f| f.is_finite()) {
            Some(f) => Value::from(f),
            None => return Err(type_error(d, &text, " (a number)")),
        },
        KeyType::String => Value::String(text.clone()),
        KeyType::Duration => match input.as_u64().or_else(|| parse_duration_ms(&text)) {
            Some(ms) => Value::from(ms),
            None => return Err(type_error(d, &text, " (like 15s, 500ms, 2m, 1h, 7d)")),
        },
        KeyType::Bytes => match input.as_u64().or_else(|| parse_bytes(&text)) {
            Some(b) => Value::from(b),
            None => return Err(type_error(d, &text, " (like 4096, 64KiB, 20MiB, 1GB)")),
        },
        KeyType::Enum => {
            let t = text.trim();
            if !d.choices.iter().any(|c| c == t) {
                return Err(ValueError::Choice {
                    key: d.name.clone(),
                    value: t.to_string(),
                    choices: d.choices.join(", "),
                });
            }
            Value::String(t.to_string())
        }
        KeyType::List => match input {
            Value::Array(items) => {
                let mut out = Vec::with_capacity(items.len());
                for i in items {
                    match i {
                        Value::String(s) => out.push(Value::String(s.clone())),
                        _ => return Err(type_error(d, &text, " (a list of strings)")),
                    }
                }
                Value::Array(out)
            }
            _ => {
                let parsed: Option<Vec<String>> = serde_json::from_str(text.trim()).ok();
                let items = parsed.unwrap_or_else(|| {
                    text.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect()
                });
                Value::Array(items.into_iter().map(Value::String).collect())
            }
        },
    };
    validate(d, &v)?;
    Ok(v)
}

/// Check a typed value against the declaration's range, pattern and choices.
pub fn validate(d: &Declaration, v: &Value) -> Result<(), ValueError> {
    if let Some(x) = v.as_f64() {
        if let Some(min) = d.min.filter(|m| x < *m) {
            return Err(ValueError::Below { key: d.name.clone(), value: v.to_string(), min: min.to_string() });
        }
        if let Some(max) = d.max.filter(|m| x > *m) {
            return Err(ValueError::Above { key: d.name.clone(), value: v.to_string(), max: max.to_string() });
        }
    }
    if let Some(p) = &d.pattern {
        let re = regex_lite::Regex::new(&format!("^(?:{p})$"))
            .map_err(|_| ValueError::BadPattern { key: d.name.clone(), pattern: p.clone() })?;
        let items: Vec<&str> = match v {
            Value::String(s) => vec![s.as_str()],
            Value::Array(a) => a.iter().filter_map(|x| x.as_str()).collect(),
            _ => vec![],
        };
        if let Some(bad) = items.into_iter().find(|s| !re.is_match(s)) {
            return Err(ValueError::Pattern { key: d.name.clone(), value: bad.to_string(), pattern: p.clone() });
        }
    }
    if d.ty == KeyType::Enum {
        let s = v.as_str().unwrap_or_default();
        if !d.choices.iter().any(|c| c == s) {
            return Err(ValueError::Choice {
                key: d.name.clone(),
                value: s.to_string(),
                choices: d.choices.join(", "),
            });
        }
    }
    Ok(())
}
