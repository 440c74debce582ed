//! TLS for the node's listener, its calls to peers and the CLI (issue 15; the bytes only: which
//! pin a connection is held to is the core's `Node::route_pin`, the join token's `issuer_pin`).
//!
//! - **Serving**: `shoal serve --tls-cert PEM --tls-key PEM` serves the operator's certificate;
//!   `--tls self-signed` makes one on first start and keeps it in `DATA/tls/` (mode 0600).
//!   Either way the SHA-256 of the certificate (its *pin*) goes in the node's owner-signed
//!   record, so peers hold the connection to exactly that certificate and need no CA.
//! - **Dialling**: an `https://` peer is checked against its pin ([`PinVerifier`]: the
//!   certificate's hash must match, and the handshake's signature must verify with its key).
//!   The CLI takes `--pin SHA256` or `--ca FILE` (ordinary chain and name checks against those
//!   roots), and pins its own node's certificate from the data dir when given neither.
//!
//! rustls with the *ring* provider, TLS 1.2 and 1.3, ALPN `http/1.1`.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use sha2::{Digest, Sha256};
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Where `--tls self-signed` keeps its certificate and key, under the data dir.
pub const SELF_SIGNED_DIR: &str = "tls";
pub const CERT_FILE: &str = "cert.pem";
pub const KEY_FILE: &str = "key.pem";
/// The pin of the certificate the node serves, in its data dir, for the CLI on the same host
/// (public: it is in the node's record too). Absent while the node serves plain HTTP.
pub const PIN_FILE: &str = "tls.pin";

/// What `shoal serve` serves HTTPS with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TlsSource {
    /// `--tls-cert` / `--tls-key`: PEM files the operator keeps (a chain, leaf first).
    Files { cert: PathBuf, key: PathBuf },
    /// `--tls self-signed`: made on first start for `hosts`, kept in `DATA/tls/`.
    SelfSigned,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {0}: {1}")]
    Read(PathBuf, String),
    #[error("{0} holds no PEM certificate")]
    NoCert(PathBuf),
    #[error("{0} holds no PEM private key (PKCS#8, PKCS#1 or SEC1)")]
    NoKey(PathBuf),
    #[error("cannot write {0}: {1}")]
    Write(PathBuf, String),
    #[error("cannot make a self-signed certificate: {0}")]
    Generate(String),
    #[error("the certificate and key do not go together, or are not usable: {0}")]
    Config(String),
    #[error("bad certificate pin {0:?}: a pin is the SHA-256 of the certificate, 64 hex digits")]
    BadPin(String),
}

/// The listener's TLS and the pin that goes in the node's record.
#[derive(Clone)]
pub struct ServerTls {
    pub acceptor: tokio_rustls::TlsAcceptor,
    /// SHA-256 of the leaf certificate, lowercase hex.
    pub pin: String,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").field("pin", &self.pin).finish()
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The pin of a certificate: SHA-256 of its DER bytes, lowercase hex.
pub fn pin_of(der: &[u8]) -> String {
    hex::encode(Sha256::digest(der))
}

/// A pin as typed (`AB:CD:...`, upper or lower case) in the form records carry.
pub fn normalize_pin(typed: &str) -> Result<String, TlsError> {
    let p: String = typed.trim().chars().filter(|c| *c != ':').collect::<String>().to_ascii_lowercase();
    if shoal_core::token::valid_pin(&p) {
        Ok(p)
    } else {
        Err(TlsError::BadPin(typed.to_string()))
    }
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = std::fs::read(path).map_err(|e| TlsError::Read(path.into(), e.to_string()))?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&bytes).filter_map(Result::ok).collect();
    if certs.is_empty() {
        return Err(TlsError::NoCert(path.into()));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = std::fs::read(path).map_err(|e| TlsError::Read(path.into(), e.to_string()))?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|_| TlsError::NoKey(path.into()))
}

/// Write `text` to `path` readable by its owner only.
fn write_private(path: &Path, text: &str) -> Result<(), TlsError> {
    use std::io::Write;
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    let mut f = o.open(path).map_err(|e| TlsError::Write(path.into(), e.to_string()))?;
    f.write_all(text.as_bytes()).and_then(|_| f.sync_all()).map_err(|e| TlsError::Write(path.into(), e.to_string()))
}

/// The self-signed certificate in `data_dir/tls/`, made now for `hosts` (names and addresses
/// the node is reached at) if there is none yet. Returns the cert and key files.
pub fn self_signed(data_dir: &Path, hosts: &[String]) -> Result<(PathBuf, PathBuf), TlsError> {
    let dir = data_dir.join(SELF_SIGNED_DIR);
    let (cert, key) = (dir.join(CERT_FILE), dir.join(KEY_FILE));
    if cert.is_file() && key.is_file() {
        return Ok((cert, key));
    }
    std::fs::create_dir_all(&dir).map_err(|e| TlsError::Write(dir.clone(), e.to_string()))?;
    let mut names: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    for h in hosts {
        if !h.is_empty() && !names.contains(h) {
            names.push(h.clone());
        }
    }
    let made = rcgen::generate_simple_self_signed(names).map_err(|e| TlsError::Generate(e.to_string()))?;
    // The key first: a cert without its key would be taken as a pair on the next start.
    write_private(&key, &made.key_pair.serialize_pem())?;
    write_private(&cert, &made.cert.pem())?;
    Ok((cert, key))
}

/// The listener's TLS from `source` (for [`TlsSource::SelfSigned`], made or loaded in
/// `data_dir` for `hosts`).
pub fn server(source: &TlsSource, data_dir: &Path, hosts: &[String]) -> Result<ServerTls, TlsError> {
    let (cert, key) = match source {
        TlsSource::Files { cert, key } => (cert.clone(), key.clone()),
        TlsSource::SelfSigned => self_signed(data_dir, hosts)?,
    };
    let chain = read_certs(&cert)?;
    let key = read_key(&key)?;
    let pin = pin_of(&chain[0]);
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(ServerTls { acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)), pin })
}

/// Holds a server to one certificate: its SHA-256 must be the pin, and the handshake must be
/// signed by that certificate's key. Names, dates and issuers are not looked at: the pin came
/// from the peer's owner-signed record (or the operator), which is what vouches for it.
#[derive(Debug)]
pub struct PinVerifier {
    pin: String,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for PinVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let got = pin_of(end_entity);
        if got == self.pin {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!("the server's certificate {got} is not the pinned {}", self.pin)))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

fn client_builder() -> rustls::ConfigBuilder<ClientConfig, rustls::WantsVerifier> {
    ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("the ring provider supports the default protocol versions")
}

/// A client that accepts exactly the certificate whose SHA-256 is `pin` (normalised).
pub fn client_pinned(pin: &str) -> Result<Arc<ClientConfig>, TlsError> {
    let pin = normalize_pin(pin)?;
    let verifier = Arc::new(PinVerifier { pin, provider: provider() });
    let mut c = client_builder().dangerous().with_custom_certificate_verifier(verifier).with_no_client_auth();
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(c))
}

/// A client that trusts the CA certificates in the PEM file `ca` (chain and name checked).
pub fn client_ca(ca: &Path) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in read_certs(ca)? {
        roots.add(c).map_err(|e| TlsError::Config(format!("{}: {e}", ca.display())))?;
    }
    let mut c = client_builder().with_root_certificates(roots).with_no_client_auth();
    c.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(c))
}

/// A stream that is TLS or not: what the client and the tunnel dial.
pub enum MaybeTls<S> {
    Plain(S),
    Tls(Box<tokio_rustls::client::TlsStream<S>>),
}

/// TLS over `stream` to `host` (a name or an address, IPv6 without brackets) when `config` is
/// set; the stream as it is otherwise.
pub async fn connect<S>(stream: S, host: &str, config: Option<Arc<ClientConfig>>) -> io::Result<MaybeTls<S>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let Some(config) = config else { return Ok(MaybeTls::Plain(stream)) };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(host.to_string())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("{host} is not a host name TLS can check")))?;
    let tls = tokio_rustls::TlsConnector::from(config).connect(name, stream).await?;
    Ok(MaybeTls::Tls(Box::new(tls)))
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for MaybeTls<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_read(cx, buf),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for MaybeTls<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_write(cx, buf),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    // Vectored writes pass through: without them hyper copies every body byte into its own
    // write buffer before sending (its "flatten" strategy), a memcpy per byte a put or a copy
    // sends (issue 18 "CPU per byte").
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            MaybeTls::Plain(s) => s.is_write_vectored(),
            MaybeTls::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_flush(cx),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_shutdown(cx),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_plain_stream_keeps_its_vectored_writes() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tcp, accepted) = tokio::join!(tokio::net::TcpStream::connect(addr), listener.accept());
        let mut plain = MaybeTls::Plain(tcp.unwrap());
        assert!(plain.is_write_vectored(), "hyper would copy every body byte into its own buffer");
        let parts = [io::IoSlice::new(b"two "), io::IoSlice::new(b"slices")];
        let n = plain.write_vectored(&parts).await.unwrap();
        plain.shutdown().await.unwrap();
        let mut got = Vec::new();
        accepted.unwrap().0.read_to_end(&mut got).await.unwrap();
        assert_eq!(&got[..], &b"two slices"[..n]);
    }

    #[test]
    fn pins_are_normalised_and_bad_ones_refused() {
        let p = "AB:".repeat(31) + "AB";
        assert_eq!(normalize_pin(&p).unwrap(), "ab".repeat(32));
        assert!(normalize_pin("abc").is_err());
        assert!(normalize_pin(&"g".repeat(64)).is_err());
    }

    #[test]
    fn a_self_signed_certificate_is_made_once_private_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let a = server(&TlsSource::SelfSigned, dir.path(), &["node.lan".into()]).unwrap();
        let b = server(&TlsSource::SelfSigned, dir.path(), &[]).unwrap();
        assert_eq!(a.pin, b.pin, "kept across starts");
        assert!(shoal_core::token::valid_pin(&a.pin));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let key = dir.path().join(SELF_SIGNED_DIR).join(KEY_FILE);
            assert_eq!(std::fs::metadata(key).unwrap().permissions().mode() & 0o777, 0o600);
        }
        let other = tempfile::tempdir().unwrap();
        assert_ne!(server(&TlsSource::SelfSigned, other.path(), &[]).unwrap().pin, a.pin);
    }

    #[test]
    fn files_that_are_not_a_certificate_and_key_say_so() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "hello").unwrap();
        let (cert, key) = self_signed(dir.path(), &[]).unwrap();
        let files = |c: &Path, k: &Path| TlsSource::Files { cert: c.into(), key: k.into() };
        assert!(matches!(server(&files(&junk, &key), dir.path(), &[]), Err(TlsError::NoCert(_))));
        assert!(matches!(server(&files(&cert, &junk), dir.path(), &[]), Err(TlsError::NoKey(_))));
        assert!(matches!(server(&files(&dir.path().join("none"), &key), dir.path(), &[]), Err(TlsError::Read(..))));
        // Another certificate's key does not go with this one.
        let other = tempfile::tempdir().unwrap();
        let (_, other_key) = self_signed(other.path(), &[]).unwrap();
        assert!(matches!(server(&files(&cert, &other_key), dir.path(), &[]), Err(TlsError::Config(_))));
    }
}
