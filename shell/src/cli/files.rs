//! `shoal put` and `shoal get`: stream a local file to `PUT /v1/files/{path}` and back, with a
//! progress bar on stderr. A put hashes the file as it sends it and checks the SHA-256 the
//! node answers (an API client may instead send `x-shoal-sha256` up front, which the node
//! checks before publishing); a get writes `LOCAL.part-get`, checks the SHA-256 the node names, and only then
//! renames it into place. When the bytes do not match (the node marks that copy stale) or the
//! stream breaks, the get asks again, up to three times, and the node serves another copy.

use crate::cli::output::CliError;
use crate::net::client::{parse_url, ChannelBody, UrlParts};
use crate::net::tls::MaybeTls;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;

const BLOCK: usize = 1 << 20;
/// What a download writes at a time.
const PIECE: usize = 4 << 20;
const GET_ATTEMPTS: usize = 3;

/// `cluster:/a/b` or `/a/b` as the API path `/a/b`.
pub fn cluster_path(p: &str) -> Result<String, CliError> {
    let p = p.strip_prefix("cluster:").unwrap_or(p);
    if !p.starts_with('/') {
        return Err(CliError(format!("{p:?} is not a cluster path (write cluster:/path)")));
    }
    Ok(p.to_string())
}

fn bar(len: u64, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}

/// What an `https://` node is checked against (`--pin`, `--ca`, ...); `None` for none.
pub(super) type Tls = Option<std::sync::Arc<rustls::ClientConfig>>;

/// TLS over `tcp` when the URL is `https://` (checked against `tls`, which must then be set).
pub(super) async fn secure(
    tcp: tokio::net::TcpStream,
    url: &UrlParts,
    tls: Tls,
) -> Result<MaybeTls<tokio::net::TcpStream>, CliError> {
    if !url.https {
        return Ok(MaybeTls::Plain(tcp));
    }
    let Some(config) = tls else {
        return Err(CliError(format!(
            "{} serves https://: pass its certificate pin (--pin SHA256, shown by `shoal cluster status` there) or a CA (--ca FILE)",
            url.authority
        )));
    };
    crate::net::tls::connect(tcp, url.host(), Some(config))
        .await
        .map_err(|e| CliError(format!("TLS to {}: {e}", url.authority)))
}

/// The connection half of a request: it moves the bytes, and must be polled while the request
/// and its answer's body are.
type Conn = http1::Connection<TokioIo<MaybeTls<tokio::net::TcpStream>>, ChannelBody>;

/// The request half of a connection to the node's API, with the authority and the URL's path
/// prefix its requests name.
struct Api {
    sender: http1::SendRequest<ChannelBody>,
    authority: String,
    prefix: String,
}

/// A connection to the node's API: its request half, and the connection to drive.
async fn connect(base: &str, tls: &Tls) -> Result<(Api, Conn), CliError> {
    let url = parse_url(base).map_err(|e| CliError(e.to_string()))?;
    let (authority, prefix) = (url.authority.clone(), url.prefix.clone());
    let tcp = tokio::net::TcpStream::connect(&authority)
        .await
        .map_err(|e| CliError(format!("cannot reach the node's API at {base}: {e}")))?;
    let _ = tcp.set_nodelay(true);
    let tcp = secure(tcp, &url, tls.clone()).await?;
    let (sender, conn) =
        http1::handshake(TokioIo::new(tcp)).await.map_err(|e| CliError(format!("cannot talk to {base}: {e}")))?;
    Ok((Api { sender, authority, prefix }, conn))
}

/// Run `work` while driving `conn` in the same task, so the bytes `conn` reads reach `work`
/// without a hand-over to another thread (a wake-up and a context switch per frame, about a
/// tenth of a download's CPU when the connection ran as a task of its own). The connection
/// is dropped (closed) once `work` ends.
async fn with_conn<T>(conn: Conn, work: impl std::future::Future<Output = T>) -> T {
    let driven = async {
        let _ = conn.await;
        std::future::pending::<std::convert::Infallible>().await
    };
    tokio::select! {
        out = work => out,
        never = driven => match never {},
    }
}

fn api_error(status: u16, body: &[u8]) -> CliError {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let msg = v.pointer("/error/message").and_then(|m| m.as_str()).unwrap_or("request failed");
    let code = v.pointer("/error/code").and_then(|m| m.as_str()).unwrap_or("error");
    CliError(format!("{msg} ({code}, HTTP {status})"))
}

/// Upload `local` to cluster path `remote`. The file is hashed while it is sent (no second
/// read); the node answers the SHA-256 of what it received, and a mismatch sends it again once.
pub async fn put(
    base: &str,
    tls: Tls,
    token: &str,
    local: &Path,
    remote: &str,
    quiet: bool,
) -> Result<Value, CliError> {
    let remote = cluster_path(remote)?;
    let md = std::fs::metadata(local).map_err(|e| CliError(format!("{}: {e}", local.display())))?;
    if !md.is_file() {
        return Err(CliError(format!("{} is not a file", local.display())));
    }
    let mut last = None;
    for _ in 0..2 {
        let (api, conn) = connect(base, &tls).await?;
        let (v, sent) = with_conn(conn, put_once(api, token, local, &remote, md.len(), quiet)).await?;
        if v["checksum"].as_str() == Some(sent.as_str()) {
            return Ok(v);
        }
        last = Some(v);
    }
    Err(CliError(format!(
        "the node stored different bytes than were sent ({}); the file changed while it was read?",
        last.map(|v| v["checksum"].to_string()).unwrap_or_default()
    )))
}

/// One upload on a connection of its own.
async fn put_once(
    api: Api,
    token: &str,
    local: &Path,
    remote: &str,
    size: u64,
    quiet: bool,
) -> Result<(Value, String), CliError> {
    let Api { mut sender, authority, prefix } = api;
    let (tx, body) = ChannelBody::new(4);
    let pb = bar(size, quiet);
    let (file, pb2) = (local.to_path_buf(), pb.clone());
    let feeder = tokio::task::spawn_blocking(move || {
        let mut f = match std::fs::File::open(&file) {
            Ok(f) => f,
            Err(e) => {
                let _ = tx.blocking_send(Err(e));
                return None;
            }
        };
        let mut hash = Sha256::new();
        loop {
            // Read into the block's spare capacity: no zeroing pass over bytes about to be read.
            let mut buf = Vec::with_capacity(BLOCK);
            match (&mut f).take(BLOCK as u64).read_to_end(&mut buf) {
                Ok(0) => return Some(hex::encode(hash.finalize())),
                Ok(n) => {
                    hash.update(&buf);
                    pb2.inc(n as u64);
                    if tx.blocking_send(Ok(Bytes::from(buf))).is_err() {
                        return None;
                    }
                }
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                    return None;
                }
            }
        }
    });
    let req = hyper::Request::put(format!("{prefix}{}", crate::wire::files_target(remote)))
        .header("host", authority)
        .header("authorization", format!("Bearer {token}"))
        .header("content-length", size.to_string())
        .header("content-type", "application/octet-stream")
        .body(body)
        .map_err(|e| CliError(e.to_string()))?;
    let resp = sender.send_request(req).await.map_err(|e| CliError(format!("upload failed: {e}")))?;
    let sent = feeder.await.ok().flatten();
    pb.finish_and_clear();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.map_err(|e| CliError(format!("upload failed: {e}")))?.to_bytes();
    if status >= 400 {
        return Err(api_error(status, &bytes));
    }
    let sent = sent.ok_or_else(|| CliError(format!("could not read {}", local.display())))?;
    Ok((serde_json::from_slice(&bytes).unwrap_or(Value::Null), sent))
}

/// Download cluster path `remote` to `local`, verified.
pub async fn get(
    base: &str,
    tls: Tls,
    token: &str,
    remote: &str,
    local: &Path,
    quiet: bool,
) -> Result<Value, CliError> {
    let remote = cluster_path(remote)?;
    let mut last = CliError("no attempt made".into());
    for _ in 0..GET_ATTEMPTS {
        let (api, conn) = connect(base, &tls).await?;
        match with_conn(conn, get_once(api, token, &remote, local, quiet)).await {
            Ok(v) => return Ok(v),
            Err((e, retry)) => {
                if !retry {
                    return Err(e);
                }
                if !quiet {
                    eprintln!("{e}; trying again");
                }
                last = e;
            }
        }
    }
    Err(last)
}

/// One download on a connection of its own; the error says whether to try again.
async fn get_once(api: Api, token: &str, remote: &str, local: &Path, quiet: bool) -> Result<Value, (CliError, bool)> {
    let Api { mut sender, authority, prefix } = api;
    let (_, empty) = ChannelBody::new(1);
    let req = hyper::Request::get(format!("{prefix}{}", crate::wire::files_target(remote)))
        .header("host", authority)
        .header("authorization", format!("Bearer {token}"))
        .body(empty)
        .map_err(|e| (CliError(e.to_string()), false))?;
    let resp = sender.send_request(req).await.map_err(|e| (CliError(format!("download failed: {e}")), true))?;
    let status = resp.status().as_u16();
    if status >= 400 {
        let bytes = resp.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        return Err((api_error(status, &bytes), false));
    }
    let want = resp.headers().get(crate::wire::SHA_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let copy = resp.headers().get(crate::wire::COPY_HEADER).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let size: u64 =
        resp.headers().get("content-length").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()).unwrap_or(0);
    let name = local.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let part = local.with_file_name(shoal_core::storage::transfer::part_file_name(&name, "get"));
    std::fs::File::create(&part).map_err(|e| (CliError(format!("{}: {e}", part.display())), false))?;
    // The file is written on its own thread while this one hashes what comes in and gathers it
    // in aligned 4 MiB pieces: the writer is woken once a piece, and writes it straight to the
    // disk where it can (see `disk::write_at`) with no copy of its own.
    let (to_disk, from_net) = tokio::sync::mpsc::channel::<crate::disk::Piece>(2);
    let part2 = part.clone();
    let writer = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        let mut from_net = from_net;
        let mut at = 0u64;
        while let Some(piece) = from_net.blocking_recv() {
            crate::disk::write_at(&part2, at, piece.as_ref())?;
            at += piece.len() as u64;
        }
        Ok(())
    });
    let pb = bar(size, quiet);
    let mut hash = Sha256::new();
    let mut body = resp.into_body();
    let mut got = 0u64;
    let failed = |e: String| {
        let _ = std::fs::remove_file(&part);
        (CliError(e), true)
    };
    let mut broke = None;
    let mut piece = crate::disk::Piece::new(PIECE);
    'frames: while let Some(frame) = body.frame().await {
        let data = match frame {
            Ok(f) => match f.into_data() {
                Ok(d) => d,
                Err(_) => continue,
            },
            Err(e) => {
                broke = Some(format!("download of {remote} broke off: {e}"));
                break;
            }
        };
        hash.update(&data);
        got += data.len() as u64;
        pb.inc(data.len() as u64);
        let mut rest = &data[..];
        while !rest.is_empty() {
            rest = &rest[piece.fill(rest)..];
            if piece.room() == 0 {
                let full = std::mem::replace(&mut piece, crate::disk::Piece::new(PIECE));
                if to_disk.send(full).await.is_err() {
                    break 'frames; // the writer failed; its error is below
                }
            }
        }
    }
    if !piece.is_empty() {
        let _ = to_disk.send(piece).await;
    }
    drop(to_disk);
    pb.finish_and_clear();
    let written = writer.await.unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&part);
        return Err((CliError(format!("{}: {e}", part.display())), false));
    }
    if let Some(e) = broke {
        return Err(failed(e));
    }
    let sum = hex::encode(hash.finalize());
    if got != size || sum != want {
        return Err(failed(format!("the copy {copy} did not match the file's checksum")));
    }
    std::fs::rename(&part, local).map_err(|e| (CliError(format!("{}: {e}", local.display())), false))?;
    Ok(
        serde_json::json!({ "path": remote, "local": local.display().to_string(), "size": got, "checksum": sum, "copy": copy }),
    )
}

/// Read until `buf` is full or the file ends; the bytes read.
fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// `shoal checksum LOCAL`: the file's SHA-256 and how fast it was read and hashed.
pub fn checksum(local: &Path, chunks: bool, json: bool) -> Result<(), CliError> {
    let started = std::time::Instant::now();
    let mut f = std::fs::File::open(local).map_err(|e| CliError(format!("{}: {e}", local.display())))?;
    let mut hash = crate::disk::hash::FileHash::new();
    // With `--chunks`, whole chunks are read and hashed as a node hashes them.
    let mut buf = vec![0u8; if chunks { shoal_core::storage::transfer::CHUNK_BYTES as usize } else { BLOCK }];
    let mut total = 0u64;
    loop {
        let n = read_full(&mut f, &mut buf).map_err(|e| CliError(format!("{}: {e}", local.display())))?;
        if n == 0 {
            break;
        }
        if chunks {
            hash.update_with_chunk_sum(&buf[..n]);
        } else {
            hash.update(&buf[..n]);
        }
        total += n as u64;
    }
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    let sum = hash.hex();
    if json {
        crate::cli::output::say(
            serde_json::json!({"checksum": sum, "size": total, "bytesPerSec": (total as f64 / secs) as u64}),
        );
    } else {
        crate::cli::output::say(format_args!("{sum}  {}", local.display()));
    }
    Ok(())
}
