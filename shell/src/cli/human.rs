//! Answers of the admin API as a person reads them (`--json` prints them as they came).

use super::output as fmt;
use serde_json::{json, Value};

pub(super) fn human_json(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

pub(super) fn human_config(v: &Value) -> String {
    // Declared types by key name, so durations and sizes read as an operator writes them.
    let types: std::collections::BTreeMap<String, String> = v["predefined"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| Some((d["key"].as_str()?.to_string(), d["type"].as_str()?.to_string())))
        .collect();
    let type_of = |key: &str| {
        types.iter().find(|(k, _)| key == k.as_str() || key.ends_with(&format!(".{k}"))).map(|(_, t)| t.as_str())
    };
    let mut out = String::from("stored values:\n");
    for e in v["values"].as_array().into_iter().flatten() {
        let level = s(&e["level"]);
        out.push_str(&format!(
            "  {} = {}  (by {}, {}: {})\n",
            level,
            fmt::config_value(&e["value"], type_of(&level)),
            s(&e["by"]),
            s(&e["at"]),
            s(&e["why"])
        ));
    }
    out.push_str("resolved:\n");
    for r in v["resolved"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "  {} {}.{} = {}  [{}]\n",
            s(&r["node"]),
            s(&r["module"]),
            s(&r["key"]),
            fmt::config_value(&r["value"], type_of(&format!("{}.{}", s(&r["module"]), s(&r["key"])))),
            s(&r["source"])
        ));
    }
    for u in v["unresolved"].as_array().into_iter().flatten() {
        out.push_str(&format!("unresolved: {} on {}: {}\n", s(&u["module"]), s(&u["node"]), s(&u["why"])));
    }
    out.trim_end().to_string()
}

pub(super) fn human_history(v: &Value) -> String {
    let mut out = String::new();
    for h in v["history"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "{} {} {} = {} (was {}) by {}: {}; moved {}\n",
            s(&h["at"]),
            s(&h["action"]),
            s(&h["level"]),
            h["value"],
            h["previous"],
            s(&h["by"]),
            s(&h["why"]),
            h["moved"].as_array().map_or(0, |m| m.len())
        ));
    }
    if out.is_empty() {
        "no history".into()
    } else {
        out.trim_end().to_string()
    }
}

pub(super) fn human_moved(v: &Value) -> String {
    let mut out = format!("{} = {} (was {})", s(&v["level"]), v["value"], v["previous"]);
    for m in v["moved"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "\n  moved: {} {}.{} -> {}",
            s(&m["node"]),
            s(&m["module"]),
            s(&m["key"]),
            m["to"]["value"]
        ));
    }
    out
}

pub(super) fn human_proposals(v: &Value) -> String {
    let mut out = String::new();
    for p in v["proposals"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "{} {} {} = {} (against {}) by {}: {}\n",
            s(&p["id"]),
            s(&p["status"]),
            s(&p["level"]),
            p["value"],
            p["shownAgainst"],
            s(&p["by"]),
            s(&p["why"])
        ));
    }
    if out.is_empty() {
        "no proposals".into()
    } else {
        out.trim_end().to_string()
    }
}

pub(super) fn s(v: &Value) -> String {
    match v {
        Value::String(x) => x.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

pub(super) fn human_kv(v: &Value) -> String {
    match v.as_object() {
        Some(m) => m.iter().map(|(k, x)| format!("{k:<20} {}", s(x))).collect::<Vec<_>>().join("\n"),
        None => s(v),
    }
}

pub(super) fn human_status(v: &Value) -> String {
    if v["inCluster"] != json!(true) {
        return format!("node {} ({}) is not in a cluster", s(&v["node"]), s(&v["nodeName"]));
    }
    let states = v["states"]
        .as_object()
        .map(|m| m.iter().map(|(k, c)| format!("{c} {k}")).collect::<Vec<_>>().join(", "))
        .unwrap_or_default();
    format!(
        "cluster  {} ({})\nnode     {} ({})\nurl      {}\nmembers  {} [{}]",
        s(&v["id"]),
        s(&v["name"]),
        s(&v["node"]),
        s(&v["nodeName"]),
        s(&v["advertiseUrl"]),
        s(&v["members"]),
        states
    ) + &v["tlsPin"].as_str().map(|p| format!("\ntls pin  {p}")).unwrap_or_default()
        + &v["warnings"].as_array().into_iter().flatten().map(|w| format!("\nwarning: {}", s(w))).collect::<String>()
}

pub(super) fn human_tokens(v: &Value) -> String {
    let mut out = format!("{:<18} {:>6} {:>12} {}", "ID", "USES", "EXPIRES", "STATUS");
    for t in v["tokens"].as_array().into_iter().flatten() {
        let status = if t["revoked"] == json!(true) { "revoked" } else { "active" };
        out.push_str(&format!("\n{:<18} {:>6} {:>12} {}", s(&t["id"]), s(&t["uses"]), s(&t["expires"]), status));
    }
    out
}

pub(super) fn human_nodes(v: &Value) -> String {
    let mut out = format!("{:<38} {:<16} {:<12} {:>9}  {:<24} {}", "ID", "NAME", "STATE", "LATENCY", "ROUTE", "URL");
    for n in v["nodes"].as_array().into_iter().flatten() {
        if n["removed"] == json!(true) {
            continue;
        }
        let lat = n["latencyMs"].as_f64().unwrap_or(-1.0);
        let lat = if n["local"] == json!(true) {
            "local".to_string()
        } else if lat < 0.0 {
            "-".to_string()
        } else {
            format!("{lat:.1}ms")
        };
        let url = match s(&n["advertiseUrl"]) {
            u if u.is_empty() => "(behind NAT)".to_string(),
            u => u,
        };
        out.push_str(&format!(
            "\n{:<38} {:<16} {:<12} {:>9}  {:<24} {}",
            s(&n["id"]),
            s(&n["name"]),
            s(&n["state"]),
            lat,
            s(&n["route"]),
            url
        ));
    }
    out
}

pub(super) fn human_tunnel(v: &Value) -> String {
    let own = match (v["wanted"].as_bool(), v["state"].as_str()) {
        (Some(false), _) => "no tunnel: this node has an advertised URL".to_string(),
        (_, Some("up")) => format!("tunnel up to {}", s(&v["host"])),
        (_, Some("connecting")) => format!("tunnel connecting to {}", s(&v["host"])),
        (_, Some("waiting")) => "tunnel down: waiting to try again".to_string(),
        _ => "tunnel off".to_string(),
    };
    let preferred = match &v["preferred"] {
        Value::String(p) => format!("\npreferred host: {p} (used while it is ONLINE)"),
        _ => String::new(),
    };
    let linked: Vec<String> = v["linked"].as_array().into_iter().flatten().map(s).collect();
    let linked = if linked.is_empty() {
        "\nno live tunnels".to_string()
    } else {
        format!("\nlive tunnels with: {}", linked.join(", "))
    };
    format!("{own}{preferred}{linked}")
}

pub(super) fn human_probe(v: &Value) -> String {
    if v["reachable"] == json!(true) {
        format!(
            "node {} answered in {:.1} ms via {}",
            s(&v["node"]),
            v["rttMs"].as_f64().unwrap_or(0.0),
            s(&v["route"])
        )
    } else {
        format!("node {} did not answer: {}", s(&v["node"]), s(&v.get("error").cloned().unwrap_or(v["status"].clone())))
    }
}

pub(super) fn human_ls(v: &Value) -> String {
    let mut out = String::new();
    for e in v["entries"].as_array().into_iter().flatten() {
        let kind = if e["isDir"] == json!(true) { "dir " } else { "file" };
        out.push_str(&format!("{kind} {:>12}  {}\n", fmt::bytes_of(&e["size"]), s(&e["name"])));
    }
    if out.is_empty() {
        format!("{} is empty", s(&v["path"]))
    } else {
        out.trim_end().to_string()
    }
}

pub(super) fn human_stat(v: &Value) -> String {
    if v["isDir"] == json!(true) {
        return format!(
            "cluster:{}  directory, {} entries, policy {} copies",
            s(&v["path"]),
            s(&v["children"]),
            s(&v["policy"])
        );
    }
    let r = &v["record"];
    let mut out = format!(
        "cluster:{}\nid        {}\nsize      {} ({} bytes)\nchecksum  {}\ncopies    {} wanted",
        s(&v["path"]),
        s(&r["id"]),
        fmt::bytes_of(&r["size"]),
        s(&r["size"]),
        s(&r["checksum"]),
        s(&v["wantedCopies"])
    );
    for c in v["copies"].as_array().into_iter().flatten() {
        out.push_str(&format!("\n  {}  {}", s(&c["copy"]), s(&c["state"])));
    }
    out
}

pub(super) fn human_put(v: &Value) -> String {
    let mut out = format!(
        "cluster:{}  {}, {} of {} copies written",
        s(&v["path"]),
        fmt::bytes_of(&v["size"]),
        s(&v["copies"]),
        s(&v["wanted"])
    );
    if v["copies"].as_u64() < v["wanted"].as_u64() {
        out.push_str("\n(fewer copies than the folder policy wants: the others are made when nodes can take them)");
    }
    if v["recordReplicated"] == Value::Bool(false) {
        out.push_str("\n(no metadata leader has the record yet: until it does, it lives on this node only)");
    }
    out
}

pub(super) fn human_get(v: &Value) -> String {
    format!("{}  {}, checksum verified (from {})", s(&v["local"]), fmt::bytes_of(&v["size"]), s(&v["copy"]))
}

pub(super) fn human_verify(v: &Value) -> String {
    let mut out = format!("{} files, {} copies verified", s(&v["files"]), s(&v["verified"]));
    for c in v["stale"].as_array().into_iter().flatten() {
        out.push_str(&format!("\n  mismatch, marked stale: {}", s(c)));
    }
    for c in v["unreachable"].as_array().into_iter().flatten() {
        out.push_str(&format!("\n  not reachable: {}", s(c)));
    }
    for c in v["renamePending"].as_array().into_iter().flatten() {
        out.push_str(&format!("\n  moved, waiting for its rename (not checked): {}", s(c)));
    }
    out
}

pub(super) fn human_rescan(v: &Value) -> String {
    let mut out = String::new();
    for r in v["volumes"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "{}: {} files, {} adopted, {} copies added, {} marked stale\n",
            s(&r["volumeId"]),
            s(&r["files"]),
            s(&r["adopted"]),
            s(&r["copiesAdded"]),
            s(&r["markedStale"])
        ));
    }
    if out.is_empty() {
        "this node has no volumes".into()
    } else {
        out.trim_end().to_string()
    }
}

pub(super) fn human_audit(v: &Value) -> String {
    let mut out = String::new();
    for a in v["audit"].as_array().into_iter().flatten() {
        out.push_str(&format!("{} {} {} via {}\n", s(&a["at"]), s(&a["act"]), s(&a["account"]), s(&a["node"])));
    }
    if out.is_empty() {
        "no admin acts recorded".into()
    } else {
        out.trim_end().to_string()
    }
}

const WEIGHT_NAMES: [&str; 9] =
    ["locality", "cpu", "memory", "disk", "queue", "latency", "health", "features", "diversity"];

pub(super) fn human_weights(v: &Value) -> String {
    WEIGHT_NAMES
        .iter()
        .map(|n| format!("{n:<10} {:.2}", v[*n].as_f64().unwrap_or(f64::NAN)))
        .collect::<Vec<_>>()
        .join("\n")
}

fn factor(v: &Value) -> String {
    v.as_f64().map_or_else(|| "-".to_string(), |x| format!("{x:.2}"))
}

/// One ranked node per line: score, state, factors, and why not when it is not eligible.
fn human_ranked(ranked: &Value) -> String {
    let mut out = format!(
        "{:<38} {:>5}  {:<11} {:>4} {:>4} {:>4} {:>4} {:>5} {:>4} {:>4}  {}\n",
        "NODE", "SCORE", "STATE", "LOC", "CPU", "MEM", "DISK", "QUEUE", "LAT", "DIV", "WHY NOT"
    );
    for r in ranked.as_array().into_iter().flatten() {
        let f = &r["factors"];
        out.push_str(&format!(
            "{:<38} {:>5.3}  {:<11} {:>4} {:>4} {:>4} {:>4} {:>5} {:>4} {:>4}  {}\n",
            r["node"].as_str().unwrap_or("?"),
            r["score"].as_f64().unwrap_or(0.0),
            r["state"].as_str().unwrap_or("?"),
            factor(&f["locality"]),
            factor(&f["cpu"]),
            factor(&f["memory"]),
            factor(&f["disk"]),
            factor(&f["queue"]),
            factor(&f["latency"]),
            factor(&f["diversity"]),
            r["reason"].as_str().unwrap_or("")
        ));
    }
    out.trim_end().to_string()
}

pub(super) fn human_sched_status(v: &Value) -> String {
    let mut out =
        format!("weights\n{}\n\nscores (no locality)\n{}\n", human_weights(&v["weights"]), human_ranked(&v["preview"]));
    let rows = v["latency"]["rows"].as_object();
    match rows.filter(|r| !r.is_empty()) {
        None => out.push_str("\nlatency matrix: not gathered (the leader gathers it with three or more nodes)"),
        Some(rows) => {
            out.push_str("\nlatency matrix (ms, -1 not measured)\n");
            for (from, row) in rows {
                for (to, ms) in row.as_object().into_iter().flatten() {
                    out.push_str(&format!("{from} -> {to}: {}\n", factor(ms)));
                }
            }
        }
    }
    out.trim_end().to_string()
}

pub(super) fn human_explain(v: &Value) -> String {
    let head = match v["chosen"].as_str() {
        Some(n) => format!("{}: {n} takes it", v["subject"].as_str().unwrap_or("")),
        None => format!(
            "{}: no node takes it: {}",
            v["subject"].as_str().unwrap_or(""),
            v["whyNone"].as_str().unwrap_or("")
        ),
    };
    format!("{head}\n{}", human_ranked(&v["ranked"]))
}

/// One event on one line: sequence, time, type, the node that raised it, the payload.
pub(super) fn human_event(e: &Value) -> String {
    format!(
        "{:>6}  {}  {:<16} {}  {}",
        e["seq"].as_u64().unwrap_or(0),
        e["time"].as_u64().unwrap_or(0),
        e["type"].as_str().unwrap_or("?"),
        e["node"].as_str().unwrap_or("?"),
        e["data"]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_put_short_of_copies_or_of_a_replicated_record_says_so() {
        let full = json!({"path": "/a", "size": 3, "copies": 2, "wanted": 2, "recordReplicated": true});
        assert_eq!(human_put(&full), "cluster:/a  3 B, 2 of 2 copies written");
        let big = json!({"path": "/b", "size": 3_u64 << 30, "copies": 1, "wanted": 1, "recordReplicated": true});
        assert_eq!(human_put(&big), "cluster:/b  3.0 GiB, 1 of 1 copies written");
        let short = json!({"path": "/a", "size": 3, "copies": 1, "wanted": 2, "recordReplicated": false});
        let text = human_put(&short);
        assert!(text.contains("1 of 2 copies") && text.contains("fewer copies"), "{text}");
        assert!(text.contains("lives on this node only"), "{text}");
    }
}
