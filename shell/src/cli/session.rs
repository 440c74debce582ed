//! The session `shoal login` keeps for later verbs (issue 15): in `$SHOAL_CONFIG_DIR`, else
//! `$XDG_CONFIG_HOME/shoal`, else `~/.config/shoal`, as `session.json` with mode 0600 (its
//! folder 0700), written to a temporary file and renamed.

use super::output::CliError;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// A session kept by `shoal login`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Kept {
    pub api: String,
    pub token: String,
    pub user: String,
    /// The certificate pin the login was made with (`--pin`), kept for an `https://` node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin: Option<String>,
}

fn config_dir() -> Option<PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    env("SHOAL_CONFIG_DIR")
        .or_else(|| env("XDG_CONFIG_HOME").map(|d| d.join("shoal")))
        .or_else(|| env("HOME").map(|h| h.join(".config").join("shoal")))
}

pub(super) fn session_file() -> Option<PathBuf> {
    config_dir().map(|d| d.join("session.json"))
}

/// The session `shoal login` kept, if any.
pub(super) fn kept_session() -> Option<Kept> {
    serde_json::from_slice(&std::fs::read(session_file()?).ok()?).ok()
}

pub(super) fn keep_session(k: &Kept) -> Result<PathBuf, CliError> {
    let path = session_file().ok_or_else(|| CliError("no config dir: set SHOAL_CONFIG_DIR or HOME".into()))?;
    let dir = path.parent().expect("a file in a dir");
    let fail = |e: std::io::Error| CliError(format!("cannot keep the session in {}: {e}", path.display()));
    std::fs::create_dir_all(dir).map_err(fail)?;
    let tmp = path.with_extension("json.tmp");
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        opts.mode(0o600);
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    }
    let f = opts.open(&tmp).map_err(fail)?;
    serde_json::to_writer(&f, k).map_err(|e| fail(std::io::Error::other(e)))?;
    f.sync_all().map_err(fail)?;
    std::fs::rename(&tmp, &path).map_err(fail)?;
    Ok(path)
}
