//! A node's files in its data dir: `node.key` (hex of the 32-byte Ed25519 seed, 0600), `node.id`
//! (a UUID), `admin.token` (the API token, 0600). Created on first start, kept across restarts;
//! a malformed file is an error that names it, never silently replaced.

use ed25519_dalek::SigningKey;
use shoal_core::ids::is_uuid;
use shoal_core::{NodeId, SeededRng};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

pub const KEY_FILE: &str = "node.key";
pub const ID_FILE: &str = "node.id";
pub const TOKEN_FILE: &str = "admin.token";
pub const DB_FILE: &str = "cluster.redb";
pub const API_URL_FILE: &str = "api.url";

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("cannot use data dir {0}: {1}")]
    Dir(PathBuf, std::io::Error),
    #[error("cannot read or write {0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error("{0} is malformed: {1}")]
    Malformed(PathBuf, &'static str),
}

pub struct Identity {
    pub id: NodeId,
    pub key: SigningKey,
    pub admin_token: String,
}

/// Write a secret file readable by the owner only.
pub fn write_secret(path: &Path, contents: &str) -> std::io::Result<()> {
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(path)?;
    f.write_all(contents.as_bytes())?;
    f.sync_all()
}

/// Warn when a secret file can be read by others (it should be 0600).
fn warn_if_exposed(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(m) = fs::metadata(path) {
            if m.permissions().mode() & 0o077 != 0 {
                tracing::warn!(file = %path.display(), mode = format!("{:o}", m.permissions().mode() & 0o777), "secret file is readable by others; chmod 600 it");
            }
        }
    }
}

fn read_trimmed(path: &Path) -> Result<Option<String>, IdentityError> {
    match fs::read_to_string(path) {
        Ok(s) => Ok(Some(s.trim().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(IdentityError::Io(path.to_path_buf(), e)),
    }
}

/// Load the identity in `dir`, creating what is missing. `rng` supplies new ids and keys.
pub fn load_or_create(dir: &Path, rng: &mut SeededRng) -> Result<Identity, IdentityError> {
    fs::create_dir_all(dir).map_err(|e| IdentityError::Dir(dir.to_path_buf(), e))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o700));
    }
    let key_path = dir.join(KEY_FILE);
    let key = match read_trimmed(&key_path)? {
        Some(hex_seed) => {
            warn_if_exposed(&key_path);
            let bytes = hex::decode(&hex_seed).map_err(|_| IdentityError::Malformed(key_path.clone(), "not hex"))?;
            let seed: [u8; 32] =
                bytes.try_into().map_err(|_| IdentityError::Malformed(key_path.clone(), "not 32 bytes"))?;
            SigningKey::from_bytes(&seed)
        }
        None => {
            let seed: [u8; 32] = rng.bytes();
            write_secret(&key_path, &hex::encode(seed)).map_err(|e| IdentityError::Io(key_path.clone(), e))?;
            SigningKey::from_bytes(&seed)
        }
    };
    let id_path = dir.join(ID_FILE);
    let id = match read_trimmed(&id_path)? {
        Some(s) if is_uuid(&s) => NodeId::new(s.to_ascii_lowercase()),
        Some(_) => return Err(IdentityError::Malformed(id_path, "not a UUID")),
        None => {
            let id = rng.uuid_v4();
            fs::write(&id_path, &id).map_err(|e| IdentityError::Io(id_path.clone(), e))?;
            NodeId::new(id)
        }
    };
    let token_path = dir.join(TOKEN_FILE);
    let admin_token = match read_trimmed(&token_path)? {
        Some(t) if t.len() >= 32 => {
            warn_if_exposed(&token_path);
            t
        }
        Some(_) => return Err(IdentityError::Malformed(token_path, "shorter than 32 characters")),
        None => {
            let t = rng.hex(32);
            write_secret(&token_path, &t).map_err(|e| IdentityError::Io(token_path.clone(), e))?;
            t
        }
    };
    Ok(Identity { id, key, admin_token })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_created_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let a = load_or_create(dir.path(), &mut SeededRng::new(1)).unwrap();
        let b = load_or_create(dir.path(), &mut SeededRng::new(2)).unwrap();
        assert_eq!(a.id, b.id);
        assert_eq!(a.key.to_bytes(), b.key.to_bytes());
        assert_eq!(a.admin_token, b.admin_token);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            for f in [KEY_FILE, TOKEN_FILE] {
                let mode = fs::metadata(dir.path().join(f)).unwrap().permissions().mode();
                assert_eq!(mode & 0o777, 0o600, "{f}");
            }
        }
    }

    #[test]
    fn a_malformed_key_is_an_error_not_a_new_identity() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(KEY_FILE), "zz").unwrap();
        let err = load_or_create(dir.path(), &mut SeededRng::new(1)).err().unwrap();
        assert!(err.to_string().contains("node.key is malformed"), "{err}");
    }
}
