//! Passwords and secrets (issue 15 "Accounts and sessions"): argon2id hashing and checking,
//! run on blocking threads (they are CPU- and memory-bound on purpose), and the secrets of
//! sessions and API keys drawn from the OS. The core keeps only the hash and the secret's
//! SHA-256 ([`digest_of`]); which hash to check and what follows is its decision.

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};
use rand_core::RngCore;
use sha2::{Digest, Sha256};
use shoal_core::node::identity::PasswordParams;
use shoal_core::node::ApiError;
use std::sync::{Mutex, OnceLock};

fn hasher(p: PasswordParams) -> Result<Argon2<'static>, ApiError> {
    let params = Params::new(p.memory_kib, p.time, p.lanes, None)
        .map_err(|e| ApiError::invalid("bad_argon2_params", format!("identity.argon2_*: {e}")))?;
    Ok(Argon2::new(Algorithm::Argon2id, Version::V0x13, params))
}

/// The PHC string of `password` hashed with argon2id under `params`, with a fresh 16-byte salt.
pub async fn hash(params: PasswordParams, password: String) -> Result<String, ApiError> {
    let argon = hasher(params)?;
    let _turn = hashing().acquire().await.map_err(|e| ApiError::internal("hash_failed", e.to_string()))?;
    tokio::task::spawn_blocking(move || {
        let mut salt = [0u8; 16];
        rand_core::OsRng.fill_bytes(&mut salt);
        let salt = SaltString::encode_b64(&salt).map_err(|e| ApiError::internal("salt", e.to_string()))?;
        argon
            .hash_password(password.as_bytes(), &salt)
            .map(|h| h.to_string())
            .map_err(|e| ApiError::internal("hash_failed", e.to_string()))
    })
    .await
    .map_err(|e| ApiError::internal("hash_failed", e.to_string()))?
}

/// A hash of a password nobody has, checked when the account does not exist, so a wrong name
/// costs what a wrong password costs.
/// Made with the parameters in force (remade when they change), so the cost matches.
fn dummy(params: PasswordParams) -> String {
    static DUMMY: OnceLock<Mutex<Option<(PasswordParams, String)>>> = OnceLock::new();
    let mut d = crate::sync::lock(DUMMY.get_or_init(|| Mutex::new(None)));
    match &*d {
        Some((p, h)) if *p == params => h.clone(),
        _ => {
            let argon = hasher(params).unwrap_or_default();
            let salt = SaltString::encode_b64(&[7u8; 16]).expect("a 16-byte salt encodes");
            let h =
                argon.hash_password(b"no account has this password", &salt).map(|h| h.to_string()).unwrap_or_default();
            *d = Some((params, h.clone()));
            h
        }
    }
}

/// argon2 runs at most this many at once (each takes `identity.argon2_memory_kib`): a flood
/// of logins waits its turn instead of taking the node's memory.
const HASHING_MAX: usize = 4;

fn hashing() -> &'static tokio::sync::Semaphore {
    static S: OnceLock<tokio::sync::Semaphore> = OnceLock::new();
    S.get_or_init(|| tokio::sync::Semaphore::new(HASHING_MAX))
}

/// Whether `password` matches the PHC `hash` (its own parameters; argon2 compares in constant
/// time). `None`: no such account; a dummy hash is checked instead and the answer is `false`.
pub async fn verify(params: PasswordParams, hash: Option<String>, password: String) -> bool {
    let known = hash.is_some();
    let Ok(_turn) = hashing().acquire().await else { return false };
    tokio::task::spawn_blocking(move || {
        let hash = hash.unwrap_or_else(|| dummy(params));
        let Ok(parsed) = PasswordHash::new(&hash) else { return false };
        Argon2::default().verify_password(password.as_bytes(), &parsed).is_ok() && known
    })
    .await
    .unwrap_or(false)
}

/// A fresh secret, `PREFIX` and 32 random bytes in base64url, and its digest.
pub fn new_secret(prefix: &str) -> (String, String) {
    use base64::Engine;
    let mut bytes = [0u8; 32];
    rand_core::OsRng.fill_bytes(&mut bytes);
    let token = format!("{prefix}{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes));
    let digest = digest_of(&token);
    (token, digest)
}

/// The SHA-256 of a presented secret, hex: how the core knows a credential.
pub fn digest_of(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// `plain` sealed to the X25519 public key `box_key` (base64): an anonymous sealed box
/// (ephemeral key, XSalsa20-Poly1305), base64. Only the key's owner can open it.
pub fn seal(box_key: &str, plain: &[u8]) -> Result<String, ApiError> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let bytes: [u8; 32] = b64
        .decode(box_key)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| ApiError::peer_failed("bad_box_key", "the origin's sealing key is malformed"))?;
    let sealed = crypto_box::PublicKey::from(bytes)
        .seal(&mut rand_core::OsRng, plain)
        .map_err(|_| ApiError::internal("seal_failed", "could not seal the password"))?;
    Ok(b64.encode(sealed))
}

/// Open what [`seal`] made for this node's `secret`.
pub fn open(secret: &[u8; 32], sealed_b64: &str) -> Result<Vec<u8>, ApiError> {
    use base64::Engine;
    let sealed = base64::engine::general_purpose::STANDARD
        .decode(sealed_b64)
        .map_err(|_| ApiError::invalid("bad_sealed", "the sealed password is not base64"))?;
    crypto_box::SecretKey::from(*secret)
        .unseal(&sealed)
        .map_err(|_| ApiError::invalid("bad_sealed", "the sealed password does not open with this node's key"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHEAP: PasswordParams = PasswordParams { memory_kib: 64, time: 1, lanes: 1 };

    #[tokio::test]
    async fn a_hash_checks_its_password_only() {
        let h = hash(CHEAP, "correct horse".into()).await.unwrap();
        assert!(h.starts_with("$argon2id$v=19$m=64,t=1,p=1$"), "{h}");
        assert!(verify(CHEAP, Some(h.clone()), "correct horse".into()).await);
        assert!(!verify(CHEAP, Some(h.clone()), "correct horse ".into()).await);
        assert!(!verify(CHEAP, None, "no account has this password".into()).await);
        assert!(!verify(CHEAP, Some("garbage".into()), "x".into()).await);
        // Salted: the same password hashes differently.
        assert_ne!(h, hash(CHEAP, "correct horse".into()).await.unwrap());
    }

    #[test]
    fn secrets_differ_and_their_digest_is_what_the_core_keeps() {
        let (a, da) = new_secret("shs_");
        let (b, _) = new_secret("shs_");
        assert!(a.starts_with("shs_") && a.len() == 4 + 43 && a != b);
        assert_eq!(da, digest_of(&a));
        assert_eq!(da.len(), 64);
    }

    #[test]
    fn only_the_key_owner_opens_a_sealed_password() {
        let me = ed25519_dalek::SigningKey::from_bytes(&[3; 32]);
        let other = ed25519_dalek::SigningKey::from_bytes(&[4; 32]);
        let sealed = seal(&shoal_core::identity::box_public(&me), b"hunter22").unwrap();
        assert!(!sealed.contains("hunter22"));
        assert_eq!(open(&shoal_core::identity::box_secret(&me), &sealed).unwrap(), b"hunter22");
        assert_eq!(open(&shoal_core::identity::box_secret(&other), &sealed).unwrap_err().code, "bad_sealed");
        assert!(open(&shoal_core::identity::box_secret(&me), "!!").is_err());
        assert!(seal("short", b"x").is_err());
    }

    #[tokio::test]
    async fn parameters_out_of_argon2s_range_are_a_clear_error() {
        let bad = PasswordParams { memory_kib: 1, time: 1, lanes: 1 };
        assert_eq!(hash(bad, "whatever1".into()).await.unwrap_err().code, "bad_argon2_params");
    }
}
