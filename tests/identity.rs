//! Accounts and sessions on real processes (issue 15): users and groups made with the CLI (the
//! password on stdin), a login kept in the config dir with mode 0600, a user refused admin
//! routes, an API key, an expired session refused, 429 with `Retry-After` after repeated
//! failures, logins in the audit log, and a logout that ends the session.

mod common;

use common::*;
use serde_json::{json, Value};
use std::time::Duration;

#[test]
fn accounts_sessions_keys_and_backoff_on_a_real_node() {
    let root = tempfile::tempdir().unwrap();
    let mut nodes = Nodes(vec![Node::new(root.path().join("n0"))]);
    nodes.0[0].start();
    let n = &nodes.0[0];
    n.cli_json(&["cluster", "create", "--name", "ident"]);
    let conf = root.path().join("conf");
    let env = [("SHOAL_CONFIG_DIR", conf.to_str().unwrap())];

    // A group must exist before an account is put in it; a short password is refused.
    let (ok, _, err) = n.cli_with(&["user", "add", "anna", "--group", "staff"], true, "correct horse\n", &[]);
    assert!(!ok && err.contains("no group"), "{err}");
    n.cli_json(&["group", "add", "staff"]);
    let (ok, _, err) = n.cli_with(&["user", "add", "anna"], true, "short\n", &[]);
    assert!(!ok && err.contains("at least 8"), "{err}");
    let (ok, out, err) =
        n.cli_with(&["--json", "user", "add", "anna", "--group", "staff"], true, "correct horse\n", &[]);
    assert!(ok, "{err}");
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["role"], "user");
    let list = n.cli_json(&["user", "list"]);
    assert!(list.to_string().contains("anna") && !list.to_string().contains("argon2"), "no hash shown: {list}");

    // Log in (password on stdin); the session is kept 0600 and used by later commands.
    let (ok, _, err) = n.cli_with(&["login", "--user", "anna"], false, "wrong password\n", &env);
    assert!(!ok && err.contains("wrong username or password"), "{err}");
    let (ok, out, err) = n.cli_with(&["login", "--user", "anna"], false, "correct horse\n", &env);
    assert!(ok, "{err}");
    assert!(out.contains("logged in as anna"), "{out}");
    let kept = conf.join("session.json");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&kept).unwrap().permissions().mode() & 0o777, 0o600);
    }
    let (ok, out, err) = n.cli_with(&["whoami"], false, "", &env);
    assert!(ok && out.contains("anna (user)"), "{out} {err}");
    // A user is refused admin routes, with the reason.
    let (ok, _, err) = n.cli_with(&["nodes"], false, "", &env);
    assert!(!ok && err.contains("admin_only") && err.contains("403"), "{err}");
    let (ok, _, err) = n.cli_with(&["user", "add", "bo"], false, "correct horse\n", &env);
    assert!(!ok && err.contains("403"), "{err}");
    // ... and reaches the drive.
    let (ok, _, err) = n.cli_with(&["mkdir", "cluster:/home/anna/docs"], false, "", &env);
    assert!(ok, "{err}");

    // An API key for a script, no higher than its maker.
    let (ok, _, err) = n.cli_with(&["apikey", "new", "--name", "ci", "--role", "admin"], false, "", &env);
    assert!(!ok && err.contains("role_too_high"), "{err}");
    let (ok, out, err) = n.cli_with(&["--json", "apikey", "new", "--name", "ci", "--expires", "1d"], false, "", &env);
    assert!(ok, "{err}");
    let key: Value = serde_json::from_str(&out).unwrap();
    let secret = key["token"].as_str().unwrap();
    let me = n.call_as(secret, "GET", "/v1/me", None, &[]);
    assert_eq!((me.status, me.body["user"].as_str()), (200, Some("anna")), "{}", me.body);
    assert_eq!(n.call_as(secret, "GET", "/v1/volumes", None, &[]).status, 403);
    let id = key["key"]["id"].as_str().unwrap();
    let (ok, _, err) = n.cli_with(&["apikey", "revoke", id], false, "", &env);
    assert!(ok, "{err}");
    assert_eq!(n.call_as(secret, "GET", "/v1/me", None, &[]).status, 401);

    // A browser's login: the cookie is HttpOnly and SameSite=Strict and signs requests in.
    let login =
        n.call_as("", "POST", "/v1/login", Some(&json!({"username": "anna", "password": "correct horse"})), &[]);
    assert_eq!(login.status, 200, "{}", login.body);
    let cookie = login.header("set-cookie").unwrap().to_string();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"), "{cookie}");
    let pair = cookie.split(';').next().unwrap();
    assert_eq!(n.call_as("", "GET", "/v1/me", None, &[("cookie", pair)]).status, 200);

    // Sessions end after identity.session_idle without use.
    let set = json!({"action": "set", "key": "identity.session_idle", "value": "2s", "why": "identity test"});
    assert_eq!(n.call("POST", "/v1/config", Some(&set)).status, 200);
    let probe =
        n.call_as("", "POST", "/v1/login", Some(&json!({"username": "anna", "password": "correct horse"})), &[]);
    let probe = probe.body["token"].as_str().unwrap().to_string();
    wait_for("the idle limit applied", || {
        std::thread::sleep(Duration::from_millis(2_100));
        n.call_as(&probe, "GET", "/v1/me", None, &[]).body["error"]["code"] == "session_expired"
    });
    let (ok, _, err) = n.cli_with(&["whoami"], false, "", &env);
    assert!(!ok && err.contains("session_expired"), "{err}");
    let clear = json!({"action": "clear", "key": "identity.session_idle", "why": "identity test"});
    assert_eq!(n.call("POST", "/v1/config", Some(&clear)).status, 200);

    // Failed logins: five are free (one came above), the next waits, with Retry-After; a
    // right password too.
    for _ in 0..4 {
        let r = n.call_as("", "POST", "/v1/login", Some(&json!({"username": "anna", "password": "guess guess"})), &[]);
        assert_eq!(r.status, 401, "{}", r.body);
    }
    let r = n.call_as("", "POST", "/v1/login", Some(&json!({"username": "anna", "password": "correct horse"})), &[]);
    assert_eq!(r.status, 429, "{}", r.body);
    assert!(r.header("retry-after").is_some_and(|v| v.parse::<u64>().unwrap() >= 1), "{:?}", r.headers);
    let entries = n.cli_json(&["audit"]);
    let audit = entries.to_string();
    // Tries and failures are audited with who made them; a backoff's refusals are not (they
    // cost an attacker nothing and would only fill the log). Statuses are read from the
    // entries: a random node id may hold the digits "429".
    let logins: Vec<&Value> =
        entries["audit"].as_array().unwrap().iter().filter(|e| e["act"] == "POST /v1/login anna").collect();
    assert!(logins.iter().any(|e| e["status"] == 401) && logins.iter().any(|e| e["status"] == 200), "{audit}");
    assert!(logins.iter().all(|e| e["status"] != 429), "{audit}");
    assert!(audit.contains("@admin-token"), "{audit}");

    // Logout ends the kept session at the node and removes it here.
    std::thread::sleep(Duration::from_millis(1_100));
    let (ok, _, err) = n.cli_with(&["login", "--user", "anna"], false, "correct horse\n", &env);
    assert!(ok, "{err}");
    let token: Value = serde_json::from_slice(&std::fs::read(&kept).unwrap()).unwrap();
    let (ok, _, err) = n.cli_with(&["logout"], false, "", &env);
    assert!(ok, "{err}");
    assert!(!kept.exists());
    assert_eq!(n.call_as(token["token"].as_str().unwrap(), "GET", "/v1/me", None, &[]).status, 401);
    // Removing an account ends what it held; the admin token stays the root credential.
    n.cli_json(&["user", "rm", "anna"]);
    assert_eq!(n.call_as("", "GET", "/v1/me", None, &[("cookie", pair)]).status, 401);
    assert_eq!(n.call("GET", "/v1/me", None).body["role"], "admin");
}

fn login(n: &Node, user: &str, password: &str) -> Answer {
    n.call_as("", "POST", "/v1/login", Some(&json!({"username": user, "password": password})), &[])
}

/// One sign-on (issue 15): a user added on a member acts at the origin (the node that made
/// the cluster) and signs in on either node; with the origin down, the member's copy of the
/// directory decides and a password changed there is written back once the origin is back.
#[test]
fn one_sign_on_across_two_nodes_with_the_origin_down_and_back() {
    let root = tempfile::tempdir().unwrap();
    let mut nodes = Nodes(vec![Node::new(root.path().join("n0")), Node::new(root.path().join("n1"))]);
    for n in &mut nodes.0 {
        n.start();
    }
    nodes.0[0].cli_json(&["cluster", "create", "--name", "sso"]);
    let t = nodes.0[0].cli_json(&["token", "new"]);
    nodes.0[1].cli_json(&["join", t["token"].as_str().unwrap()]);
    wait_for("both ready", || nodes.0.iter().all(|n| n.call("GET", "/readyz", None).status == 200));
    let set = json!({"action": "set", "key": "identity.sync_every", "value": "1s", "why": "sso test"});
    assert_eq!(nodes.0[0].call("POST", "/v1/config", Some(&set)).status, 200);
    for n in &nodes.0 {
        n.cli_json(&["group", "add", "staff"]);
    }
    let (n0, n1) = (&nodes.0[0], &nodes.0[1]);
    let origin = n1.call("GET", "/v1/identity/status", None);
    assert_eq!(origin.body["isOrigin"], false, "{}", origin.body);
    let n0_id = n0.call("GET", "/v1/cluster/status", None).body["node"].clone();
    assert_eq!(origin.body["origin"], n0_id);

    // Added on the member: it lands at the origin, and comes back to the member's directory.
    let (ok, _, err) = n1.cli_with(&["user", "add", "anna", "--group", "staff"], true, "correct horse\n", &[]);
    assert!(ok, "{err}");
    assert!(n0.call("GET", "/v1/users", None).body.to_string().contains("anna"), "held at the origin");
    wait_for("mirrored on the member", || {
        n1.call("GET", "/v1/users", None).body["users"].as_array().is_some_and(|u| {
            u.iter().any(|a| a["name"] == "anna" && a["mirrored"] == true && a["groups"] == json!(["staff"]))
        })
    });
    // Signs on at either node; a wrong password is refused at the member (the origin says so).
    for n in [n0, n1] {
        let r = login(n, "anna", "correct horse");
        assert_eq!(r.status, 200, "{}", r.body);
    }
    assert_eq!(login(n1, "anna", "wrong password").status, 401);
    let st = n1.call("GET", "/v1/identity/status", None).body;
    assert!(st["lastForward"].is_number() && st["lastForwardError"].is_null(), "{st}");

    // The origin goes down: the member's directory decides, and a new password is kept
    // there until the origin takes it.
    nodes.0[0].kill();
    let (n0, n1) = (&nodes.0[0], &nodes.0[1]);
    let r = login(n1, "anna", "correct horse");
    assert_eq!(r.status, 200, "fallback to the directory: {}", r.body);
    assert!(n1.call("GET", "/v1/identity/status", None).body["lastForwardError"].is_string());
    let (ok, out, err) = n1.cli_with(&["--json", "user", "passwd", "anna"], true, "battery staple\n", &[]);
    assert!(ok, "{err}");
    assert!(out.contains("pending"), "{out}");
    assert_eq!(login(n1, "anna", "battery staple").status, 200);
    let _ = n0;
    nodes.0[0].start();
    let (n0, n1) = (&nodes.0[0], &nodes.0[1]);
    // (Not by trying logins at the origin: their failures would set off its backoff.)
    wait_for("the password written back to the origin", || {
        n1.call("GET", "/v1/identity/status", None).body["pendingWriteBacks"] == 0
    });
    let r = login(n0, "anna", "battery staple");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(login(n1, "anna", "correct horse").status, 401, "the old password is gone everywhere");

    // Removed on the member: gone at the origin and here.
    let v = n1.cli_json(&["user", "rm", "anna"]);
    assert_eq!(v["name"], "anna");
    assert!(!n0.call("GET", "/v1/users", None).body.to_string().contains("anna"));
    assert_eq!(login(n1, "anna", "battery staple").status, 401);
}

fn put_as(n: &Node, token: &str, path: &str, text: &str) -> Answer {
    // The body is JSON-shaped bytes here; the drive takes any bytes.
    n.call_as(token, "PUT", &format!("/v1/files{path}"), Some(&json!(text)), &[])
}

/// Per-folder access (issue 15 "Access"): rules by group, inherited downwards, a user's own
/// home, listings that show only what one may read, 403s that name the rule, file owners,
/// jobs that run as their owner, and events only for readable folders.
#[test]
fn folders_are_reached_by_their_rules_on_a_real_node() {
    let root = tempfile::tempdir().unwrap();
    let mut nodes = Nodes(vec![Node::new(root.path().join("n0"))]);
    nodes.0[0].start();
    let n = &nodes.0[0];
    n.cli_json(&["cluster", "create", "--name", "access"]);
    let vol = root.path().join("vol0");
    n.cli_json(&["volume", "add", vol.to_str().unwrap(), "--create"]);
    n.cli_json(&["group", "add", "staff"]);
    for (user, group) in [("anna", Some("staff")), ("bo", None)] {
        let mut args = vec!["user", "add", user];
        if let Some(g) = group {
            args.extend(["--group", g]);
        }
        let (ok, _, err) = n.cli_with(&args, true, "correct horse\n", &[]);
        assert!(ok, "{err}");
    }
    let anna = login(n, "anna", "correct horse").body["token"].as_str().unwrap().to_string();
    let bo = login(n, "bo", "correct horse").body["token"].as_str().unwrap().to_string();
    assert_eq!(put_as(n, &n.token(), "/projects/a.txt", "plan").status, 200);

    // No rule: nothing but one's own home.
    let r = n.call_as(&anna, "GET", "/v1/files/projects/a.txt", None, &[]);
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body["error"]["message"].as_str().unwrap().contains("no rule"), "{}", r.body);
    let r = put_as(n, &anna, "/home/anna/notes.txt", "mine");
    assert_eq!(r.status, 200, "{}", r.body);
    let st = n.call_as(&anna, "GET", "/v1/meta/stat?path=/home/anna/notes.txt", None, &[]);
    assert_eq!(st.body["record"]["owner"], "anna", "{}", st.body);
    assert_eq!(n.call_as(&bo, "GET", "/v1/files/home/anna/notes.txt", None, &[]).status, 403);

    // A read rule for staff: anna reads below it, cannot write; bo still nothing.
    n.cli_json(&["access", "set", "cluster:/projects", "--group", "staff", "--mode", "read"]);
    let r = n.call_as(&anna, "GET", "/v1/files/projects/a.txt", None, &[]);
    assert_eq!(r.status, 200);
    let r = put_as(n, &anna, "/projects/b.txt", "x");
    assert_eq!(r.status, 403, "{}", r.body);
    assert!(r.body["error"]["message"].as_str().unwrap().contains("/projects → staff: read"), "{}", r.body);
    let r =
        n.call_as(&anna, "POST", "/v1/mv", Some(&json!({"from": "/projects/a.txt", "to": "/home/anna/a.txt"})), &[]);
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(n.call_as(&anna, "DELETE", "/v1/files/projects/a.txt", None, &[]).status, 403);
    assert_eq!(n.call_as(&bo, "GET", "/v1/files/projects/a.txt", None, &[]).status, 403);
    // Listings: the way to what one may read, nothing else.
    let names = |token: &str, path: &str| -> Vec<String> {
        let r = n.call_as(token, "GET", &format!("/v1/meta/ls?path={path}"), None, &[]);
        r.body["entries"].as_array().into_iter().flatten().map(|e| e["name"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(names(&anna, "/"), ["home", "projects"]);
    assert_eq!(names(&bo, "/"), ["home"]);
    assert_eq!(names(&bo, "/home"), Vec::<String>::new(), "anna's home is hers");
    assert_eq!(n.call_as(&bo, "GET", "/v1/meta/ls?path=/projects", None, &[]).status, 403);
    // Write: anna may now put there.
    n.cli_json(&["access", "set", "cluster:/projects", "--group", "staff", "--mode", "write"]);
    assert_eq!(put_as(n, &anna, "/projects/b.txt", "x").status, 200);
    let rules = n.cli_json(&["access", "list"]);
    assert_eq!(rules["rules"].as_array().unwrap().len(), 1, "{rules}");

    // A job runs as its owner: bo's job cannot read or write the project, its own home yes.
    let script = r#"function run(job){ fs.writeText('cluster:/home/bo/out.txt', 'ok'); return fs.readText('cluster:/projects/a.txt'); }"#;
    let r = n.call_as(&bo, "POST", "/v1/jobs", Some(&json!({"script": script})), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    let id = r.body["id"].as_str().unwrap().to_string();
    let mut last = Value::Null;
    wait_for("bo's job ends", || {
        last = n.call_as(&bo, "GET", &format!("/v1/jobs/{id}"), None, &[]).body;
        last["status"] == "failed" || last["status"] == "succeeded"
    });
    assert_eq!(last["status"], "failed", "{last}");
    assert!(last["error"].as_str().unwrap_or("").contains("no rule"), "{last}");
    assert_eq!(n.call("GET", "/v1/meta/stat?path=/home/bo/out.txt", None).body["record"]["owner"], "bo");
    // A large output is spilled to a file under the jobs' folder: its owner reads it, no one else.
    let big = json!({"script": "function run(){ return 'x'.repeat(600000); }"});
    let r = n.call_as(&bo, "POST", "/v1/jobs", Some(&big), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    let big_id = r.body["id"].as_str().unwrap().to_string();
    let mut spilled = Value::Null;
    wait_for("bo's big job ends", || {
        spilled = n.call_as(&bo, "GET", &format!("/v1/jobs/{big_id}/output"), None, &[]).body;
        spilled["status"] == "succeeded" || spilled["status"] == "failed"
    });
    let file = spilled["output"]["spilled"].as_str().unwrap_or_else(|| panic!("{spilled}")).to_string();
    let file = file.strip_prefix("cluster:").unwrap();
    assert_eq!(n.call_as(&bo, "GET", &format!("/v1/files{file}"), None, &[]).status, 200, "{file}");
    assert_eq!(n.call_as(&anna, "GET", &format!("/v1/files{file}"), None, &[]).status, 403, "{file}");
    // Jobs are their owner's: anna does not see bo's.
    assert_eq!(n.call_as(&anna, "GET", &format!("/v1/jobs/{id}"), None, &[]).status, 404);
    let inputs = json!({"script": "function run(){}", "inputs": ["cluster:/projects/a.txt"]});
    assert_eq!(n.call_as(&bo, "POST", "/v1/jobs", Some(&inputs), &[]).status, 403, "an input bo may not read");

    // A dataset is expanded with its owner's rules: "b*" may read its own home, whose name as
    // a glob would also take bo's files; they are left out (here: nothing is left).
    let (ok, _, err) = n.cli_with(&["user", "add", "b*"], true, "correct horse\n", &[]);
    assert!(ok, "{err}");
    let bstar = login(n, "b*", "correct horse").body["token"].as_str().unwrap().to_string();
    let mr = json!({"script": "function mapper(files, emit){} function reducer(key, values){ return values; }", "dataset": "cluster:/home/b*/**"});
    let r = n.call_as(&bstar, "POST", "/v1/jobs", Some(&mr), &[]);
    assert_eq!(r.status, 200, "{}", r.body);
    let id = r.body["id"].as_str().unwrap().to_string();
    let mut last = Value::Null;
    wait_for("the dataset job ends", || {
        last = n.call("GET", &format!("/v1/jobs/{id}"), None).body;
        last["status"] == "succeeded" || last["status"] == "failed"
    });
    assert_eq!(last["children"], json!([]), "bo's files are not b*'s to map: {last}");

    // Events: bo sees none about the project; anna does.
    let seen = |token: &str| n.call_as(token, "GET", "/v1/events?follow=false", None, &[]).body.to_string();
    assert!(seen(&anna).contains("/projects/b.txt"));
    assert!(!seen(&bo).contains("/projects/"), "{}", seen(&bo));
    // Removing the rule takes the access away.
    n.cli_json(&["access", "rm", "cluster:/projects", "--group", "staff"]);
    assert_eq!(n.call_as(&anna, "GET", "/v1/files/projects/a.txt", None, &[]).status, 403);
}
