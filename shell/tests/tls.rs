//! The HTTPS listener and client in process (issue 15): a node serving a self-signed
//! certificate answers a client held to its pin and no other, the session cookie is `Secure`
//! there, and the listener's guards hold during the TLS handshake (a client that never
//! finishes it is closed, and one evicted mid-handshake does not stall the accept loop).

use serde_json::Value;
use shoal_shell::daemon::{self, Daemon, ServeOptions};
use shoal_shell::env::TokioEnv;
use shoal_shell::net::client::HttpClient;
use shoal_shell::net::tls::TlsSource;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;

async fn tls_node(dir: &std::path::Path, max_connections: usize) -> Daemon<TokioEnv> {
    let mut opts = ServeOptions::new(dir, "127.0.0.1:0");
    opts.tls = Some(TlsSource::SelfSigned);
    opts.limits.header_read_ms = 400;
    opts.limits.max_connections = max_connections;
    daemon::start(TokioEnv::default(), opts).await.expect("start")
}

async fn call(
    client: &HttpClient<TokioEnv>,
    d: &Daemon<TokioEnv>,
    pin: &str,
    token: &str,
    method: &str,
    path: &str,
    body: &str,
) -> Result<(u16, Value, Option<String>), String> {
    let auth = format!("Bearer {token}");
    let headers: Vec<(&str, &str)> = if token.is_empty() { vec![] } else { vec![("authorization", &auth)] };
    let r = client
        .request_pinned(&d.url(), pin, method, path, &headers, body.as_bytes().to_vec(), 5_000)
        .await
        .map_err(|e| e.to_string())?;
    let cookie = r.header("set-cookie").map(str::to_string);
    Ok((r.status, serde_json::from_slice(&r.body).unwrap_or(Value::Null), cookie))
}

#[tokio::test]
async fn a_tls_node_answers_only_a_client_holding_its_pin_and_its_cookie_is_secure() {
    let dir = tempfile::tempdir().unwrap();
    let d = tls_node(dir.path(), 64).await;
    let pin = d.tls_pin.clone().expect("serves TLS");
    assert!(d.url().starts_with("https://"));
    let client = HttpClient::new(TokioEnv::default());
    let admin = d.shared().admin_token.clone();

    let (st, v, _) = call(&client, &d, &pin, &admin, "GET", "/v1/cluster/status", "").await.unwrap();
    assert_eq!(st, 200, "{v}");
    // Another certificate's pin: the handshake fails, nothing is sent.
    let err = call(&client, &d, &"0".repeat(64), &admin, "GET", "/v1/cluster/status", "").await.unwrap_err();
    assert!(err.contains("not the pinned"), "{err}");
    // No pin and no trust of the client's own: refused before connecting.
    let err = call(&client, &d, "", &admin, "GET", "/v1/cluster/status", "").await.unwrap_err();
    assert!(err.contains("certificate pin"), "{err}");
    // A client whose own trust is the pin reaches it without naming one per call.
    let trusting = HttpClient::new(TokioEnv::default()).with_tls(shoal_shell::net::tls::client_pinned(&pin).unwrap());
    assert_eq!(call(&trusting, &d, "", &admin, "GET", "/v1/cluster/status", "").await.unwrap().0, 200);

    // The session cookie is Secure over HTTPS.
    call(&client, &d, &pin, &admin, "POST", "/v1/cluster/create", r#"{"name":"t"}"#).await.unwrap();
    // A node serving TLS cannot be told to advertise http:// (peers would talk in clear and
    // never check the pin); https:// stays.
    let (st, v, _) =
        call(&client, &d, &pin, &admin, "POST", "/v1/cluster/config", r#"{"advertiseUrl":"http://127.0.0.1:9"}"#)
            .await
            .unwrap();
    assert_eq!((st, v["error"]["code"].as_str()), (400, Some("bad_url")), "{v}");
    let (st, v, _) =
        call(&client, &d, &pin, &admin, "POST", "/v1/cluster/config", r#"{"advertiseUrl":"https://127.0.0.1:9"}"#)
            .await
            .unwrap();
    assert_eq!(st, 200, "{v}");
    // And the client never sends in clear to a URL whose node has a pin.
    let http_url = d.url().replacen("https://", "http://", 1);
    let err = client.request_pinned(&http_url, &pin, "GET", "/v1/cluster/status", &[], Vec::new(), 5_000).await;
    assert!(err.is_err_and(|e| e.to_string().contains("serves TLS")));
    let (st, v, _) =
        call(&client, &d, &pin, &admin, "POST", "/v1/users", r#"{"name":"anna","password":"correct horse"}"#)
            .await
            .unwrap();
    assert_eq!(st, 200, "{v}");
    let (st, v, cookie) =
        call(&client, &d, &pin, "", "POST", "/v1/login", r#"{"username":"anna","password":"correct horse"}"#)
            .await
            .unwrap();
    assert_eq!(st, 200, "{v}");
    let cookie = cookie.expect("a cookie");
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict") && cookie.ends_with("; Secure"),
        "{cookie}"
    );
    d.shutdown().await;

    // And not on plain HTTP, where a browser would drop a Secure cookie.
    let plain_dir = tempfile::tempdir().unwrap();
    let p = daemon::start(TokioEnv::default(), ServeOptions::new(plain_dir.path(), "127.0.0.1:0")).await.unwrap();
    let admin = p.shared().admin_token.clone();
    call(&client, &p, "", &admin, "POST", "/v1/cluster/create", r#"{"name":"t"}"#).await.unwrap();
    call(&client, &p, "", &admin, "POST", "/v1/users", r#"{"name":"anna","password":"correct horse"}"#).await.unwrap();
    let (_, _, cookie) =
        call(&client, &p, "", "", "POST", "/v1/login", r#"{"username":"anna","password":"correct horse"}"#)
            .await
            .unwrap();
    assert!(!cookie.expect("a cookie").contains("Secure"));
    p.shutdown().await;
}

/// The advertised URL's scheme is the listener's: `--advertise http://` with `--tls`, or
/// `https://` without it, stops the start with the reason.
#[tokio::test]
async fn an_advertised_scheme_that_is_not_the_listeners_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = ServeOptions::new(dir.path().join("a"), "127.0.0.1:0");
    opts.tls = Some(TlsSource::SelfSigned);
    opts.advertise = Some("http://127.0.0.1:7300".into());
    let err = daemon::start(TokioEnv::default(), opts).await.err().expect("refused").to_string();
    assert!(err.contains("https://"), "{err}");
    let mut opts = ServeOptions::new(dir.path().join("b"), "127.0.0.1:0");
    opts.advertise = Some("https://127.0.0.1:7300".into());
    let err = daemon::start(TokioEnv::default(), opts).await.err().expect("refused").to_string();
    assert!(err.contains("--tls"), "{err}");
}

#[tokio::test]
async fn a_stalled_handshake_is_closed_and_an_evicted_one_does_not_stall_the_listener() {
    let dir = tempfile::tempdir().unwrap();
    let d = tls_node(dir.path(), 2).await;
    let pin = d.tls_pin.clone().unwrap();
    let admin = d.shared().admin_token.clone();

    // Connected, silent: closed once the head's time is up, with nothing written.
    let started = Instant::now();
    let mut silent = tokio::net::TcpStream::connect(&d.local_addr).await.unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf)).await.expect("closed in time");
    assert_eq!(n.unwrap_or(0), 0);
    assert!(started.elapsed() < Duration::from_secs(4));

    // Plain HTTP to the TLS port gets no HTTP answer.
    let mut plain = tokio::net::TcpStream::connect(&d.local_addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut plain, b"GET /v1/status HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut got)).await;
    assert!(!String::from_utf8_lossy(&got).starts_with("HTTP/"), "{got:?}");

    // Both connection slots taken by clients stuck in the handshake: a real client evicts one,
    // and the listener goes on accepting.
    let _a = tokio::net::TcpStream::connect(&d.local_addr).await.unwrap();
    let _b = tokio::net::TcpStream::connect(&d.local_addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    for _ in 0..3 {
        // A fresh client each time: no kept-alive connection to reuse.
        let client = HttpClient::new(TokioEnv::default());
        let (st, v, _) = call(&client, &d, &pin, &admin, "GET", "/v1/cluster/status", "").await.unwrap();
        assert_eq!(st, 200, "{v}");
    }
    d.shutdown().await;
}
