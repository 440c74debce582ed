//! HTTPS on real processes (issue 15): two nodes serving self-signed certificates form a
//! cluster, heartbeat and copy a file between them over TLS, each holding the other to the
//! certificate pin in its signed record (and the joiner to the pin in the join token). The CLI
//! reaches an https:// node with the pin from the data dir, `--pin` or `--ca`, and with no trust
//! anchor, or a wrong pin, refuses to talk. Plain HTTP to a TLS port gets nothing.

mod common;

use common::*;
use serde_json::Value;

fn pin_file(n: &Node) -> String {
    std::fs::read_to_string(n.dir.join("tls.pin")).unwrap().trim().to_string()
}

#[test]
fn two_nodes_talk_https_with_pinned_self_signed_certificates() {
    let root = tempfile::tempdir().unwrap();
    let mut nodes = Nodes((0..2).map(|i| Node::new(root.path().join(format!("n{i}")))).collect());
    for n in nodes.0.iter_mut() {
        n.args = vec!["--tls".into(), "self-signed".into()];
        n.start();
    }
    let (a, b) = (&nodes.0[0], &nodes.0[1]);
    let created = a.cli_json(&["cluster", "create", "--name", "tls"]);
    assert!(created["id"].is_string(), "{created}");
    let pin_a = pin_file(a);
    assert_eq!(pin_a.len(), 64);
    let st = a.cli_json(&["cluster", "status"]);
    assert_eq!(st["tlsPin"], pin_a.as_str(), "{st}");
    assert!(st["advertiseUrl"].as_str().unwrap().starts_with("https://"), "{st}");
    assert_eq!(st["warnings"], serde_json::json!([]), "no plain-HTTP member: {st}");

    // The token carries the issuer's pin; the joiner holds the issuer to it.
    let token = a.cli_json(&["token", "new"])["token"].as_str().unwrap().to_string();
    b.cli_json(&["join", &token]);
    let ids: Vec<String> =
        nodes.0.iter().map(|n| n.cli_json(&["cluster", "status"])["node"].as_str().unwrap().into()).collect();
    wait_for("both nodes ONLINE to each other over HTTPS", || {
        nodes.0.iter().all(|n| {
            let v = n.cli_json(&["nodes"]);
            ids.iter().all(|id| {
                v["nodes"].as_array().unwrap().iter().any(|r| {
                    r["id"] == id.as_str() && r["state"].as_str().is_some_and(|s| s == "ONLINE" || s == "DEGRADED")
                })
            })
        })
    });
    // Each record carries its node's pin.
    let v = b.cli_json(&["nodes"]);
    let rec_a = v["nodes"].as_array().unwrap().iter().find(|r| r["id"] == ids[0].as_str()).unwrap().clone();
    assert_eq!(rec_a["tlsPin"], pin_a.as_str(), "{rec_a}");

    // A file with two copies: the second is written to the other node over HTTPS.
    for (i, n) in nodes.0.iter().enumerate() {
        let vol = root.path().join(format!("vol{i}"));
        n.cli_json(&["volume", "add", vol.to_str().unwrap(), "--create"]);
    }
    a.cli_json(&["policy", "set", "cluster:/docs", "2"]);
    wait_for("both volumes and the policy everywhere", || {
        nodes.0.iter().all(|n| {
            n.cli_json(&["volume", "list"])["volumes"].as_array().is_some_and(|v| v.len() == 2)
                && n.cli_json(&["policy", "list"])["policies"].as_array().is_some_and(|p| !p.is_empty())
                && n.cli_json(&["meta", "status"])["leader"].is_string()
        })
    });
    let local = root.path().join("in.bin");
    let content: Vec<u8> = (0..3 * 1024 * 1024 + 7).map(|i: usize| (i * 7 % 251) as u8).collect();
    std::fs::write(&local, &content).unwrap();
    let put = a.cli_json(&["put", local.to_str().unwrap(), "cluster:/docs/in.bin"]);
    assert_eq!((put["copies"].as_u64(), put["wanted"].as_u64()), (Some(2), Some(2)), "{put}");
    assert!(std::fs::read(root.path().join("vol1/docs/in.bin")).unwrap() == content, "the copy on node b");
    let out = root.path().join("out.bin");
    b.cli_json(&["get", "cluster:/docs/in.bin", out.to_str().unwrap()]);
    assert!(std::fs::read(&out).unwrap() == content);

    // The CLI away from the data dir: no trust anchor, a wrong pin, then --pin and --ca.
    let token_a = a.token();
    let anon = |extra: &[&str]| {
        let mut args = vec!["--json", "--token", token_a.as_str()];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["cluster", "status"]);
        a.cli_with(&args, false, "", &[])
    };
    let (ok, _, err) = anon(&[]);
    assert!(!ok && err.contains("--pin"), "no anchor, no talk: {err}");
    let wrong = pin_file(b);
    let (ok, _, err) = anon(&["--pin", &wrong]);
    assert!(!ok && err.contains("not the pinned"), "a wrong pin is refused: {err}");
    let (ok, out, err) = anon(&["--pin", &pin_a.to_uppercase()]);
    assert!(ok, "{err}");
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["tlsPin"], pin_a.as_str());
    let ca = a.dir.join("tls/cert.pem");
    let (ok, _, err) = anon(&["--ca", ca.to_str().unwrap()]);
    assert!(ok, "the self-signed certificate as a CA: {err}");
    let ca_b = b.dir.join("tls/cert.pem");
    let (ok, _, _) = anon(&["--ca", ca_b.to_str().unwrap()]);
    assert!(!ok, "another node's certificate is no CA for this one");

    // Plain HTTP to the TLS port gets no answer.
    assert_eq!(a.call("GET", "/v1/cluster/status", None).status, 0);

    // The certificate is kept across a restart: the pin does not change.
    nodes.0[0].kill();
    nodes.0[0].start();
    assert_eq!(pin_file(&nodes.0[0]), pin_a);
    let st = nodes.0[0].cli_json(&["cluster", "status"]);
    assert_eq!(st["tlsPin"], pin_a.as_str());
}

/// On plain HTTP, `cluster status` says what an operator risks (issue 15).
#[test]
fn plain_http_members_are_named_in_a_warning() {
    let root = tempfile::tempdir().unwrap();
    let mut nodes = Nodes(vec![Node::new(root.path().join("n0"))]);
    nodes.0[0].start();
    let n = &nodes.0[0];
    n.cli_json(&["cluster", "create", "--name", "plain"]);
    let st = n.cli_json(&["cluster", "status"]);
    let w = st["warnings"][0].as_str().unwrap_or_default();
    assert!(w.contains("plain HTTP") && w.contains("replayed"), "{st}");
    let (ok, human, _) = n.cli_with(&["cluster", "status"], true, "", &[]);
    assert!(ok && human.contains("warning: 1 member(s) serve plain HTTP"), "{human}");
    // Asking for a checked connection to an http:// node is an error, not a silent clear one.
    let (ok, _, err) = n.cli_with(&["--pin", &"ab".repeat(32), "cluster", "status"], true, "", &[]);
    assert!(!ok && err.contains("plain http://"), "{err}");
}
