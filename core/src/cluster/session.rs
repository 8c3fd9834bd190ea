//! The session directory: where `raylet start` keeps the cluster token (mode
//! 0600), the head's address, a record of each process it started, and logs.
//!
//! ```text
//! /tmp/raylet/                          the temp root (--temp-dir, RAYLET_TEMP_DIR)
//!   session_latest -> session_2026-11-22_02-50-01_123456_4242
//!   session_2026-11-22_02-50-01_123456_4242/
//!     token  head_address  processes/<pid>.json  logs/head.log  logs/node-<pid>.log
//! ```
//!
//! Whoever can write in the temp root can point `session_latest` at a
//! session of their own, whose `head_address` then sends this user's CLI and
//! drivers (with the token) to their listener. So the temp root, the
//! `session_latest` link and the session it names must belong to this user
//! (or to root) and be writable by no one else; otherwise reading or making
//! a session fails with an error that says what is wrong and how to fix it.
//! Only the temp root and what is below it are checked: its parent may be a
//! shared, sticky directory such as `/tmp`.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use raylet_common::auth::AuthToken;
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The temp root used when neither `--temp-dir` nor `RAYLET_TEMP_DIR` is set.
pub const DEFAULT_TEMP_DIR: &str = "/tmp/raylet";
/// The link to the newest session in the temp root.
pub const LATEST_LINK: &str = "session_latest";
const SESSION_PREFIX: &str = "session_";
const TOKEN_FILE: &str = "token";
const HEAD_ADDRESS_FILE: &str = "head_address";
const DASHBOARD_ADDRESS_FILE: &str = "dashboard_address";
const PROCESSES_DIR: &str = "processes";
const LOGS_DIR: &str = "logs";

/// The directory that holds every session of this machine.
#[derive(Clone, Debug)]
pub struct TempRoot {
    path: PathBuf,
}

impl TempRoot {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        TempRoot { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Creates a new session directory. It becomes `session_latest` only
    /// once [`TempRoot::make_latest`] is called, after its daemon is ready.
    pub fn create_session(&self) -> Result<Session> {
        create_private_dir(&self.path)?;
        self.check_trusted()?;
        let name = format!("{SESSION_PREFIX}{}_{}", timestamp_for_name(), std::process::id());
        let dir = self.path.join(name);
        for sub in [PROCESSES_DIR, LOGS_DIR] {
            create_private_dir(&dir.join(sub))?;
        }
        Ok(Session { dir })
    }

    /// The session `session_latest` points to; `None` when there is no link.
    /// A link to a directory that is gone is an error that says so.
    pub fn latest(&self) -> Result<Option<Session>> {
        self.check_trusted()?;
        let link = self.path.join(LATEST_LINK);
        let Ok(link_metadata) = fs::symlink_metadata(&link) else {
            return Ok(None);
        };
        check_owner(&link, &link_metadata, &format!("remove it (rm {})", link.display()))?;
        let target = fs::read_link(&link).map_err(|e| Error::session(&link, format!("is not a readable link: {e}")))?;
        let is_session_name = target.to_str().is_some_and(|name| name.starts_with(SESSION_PREFIX));
        if target.components().count() != 1 || !is_session_name {
            return Err(Error::session(
                &link,
                format!(
                    "points to {}, not to a session directory beside it; remove it (rm {})",
                    target.display(),
                    link.display()
                ),
            ));
        }
        let dir = self.path.join(target);
        if let Ok(metadata) = fs::metadata(&dir) {
            check_private(&dir, &metadata)?;
        }
        if !dir.is_dir() {
            return Err(Error::session(
                &link,
                format!(
                    "points to {}, which is missing; run `raylet stop` to clean up, then start a new cluster",
                    dir.display()
                ),
            ));
        }
        Ok(Some(Session { dir }))
    }

    /// The latest session, or an error telling how to start one.
    pub fn require_latest(&self) -> Result<Session> {
        self.latest()?.ok_or_else(|| {
            Error::session(
                &self.path,
                format!(
                    "has no {LATEST_LINK}: no raylet cluster was started on this machine; \
                     run `raylet start --head`, or pass --address"
                ),
            )
        })
    }

    /// Every session directory in the temp root that this user owns and
    /// no one else can write to.
    pub fn sessions(&self) -> Vec<Session> {
        let Ok(entries) = fs::read_dir(&self.path) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(SESSION_PREFIX))
            .filter(|e| e.file_name() != LATEST_LINK && e.path().is_dir())
            .filter(|e| fs::metadata(e.path()).is_ok_and(|m| check_private(&e.path(), &m).is_ok()))
            .map(|e| Session { dir: e.path() })
            .collect()
    }

    /// Checks that the temp root, if it exists, belongs to this user (or to
    /// root) and that no other user can write in it: whoever can would
    /// control which head this user's commands connect to.
    pub fn check_trusted(&self) -> Result<()> {
        if let Ok(link) = fs::symlink_metadata(&self.path)
            && link.file_type().is_symlink()
        {
            check_owner(
                &self.path,
                &link,
                "remove the link, or pass --temp-dir (RAYLET_TEMP_DIR) with a directory of your own",
            )?;
        }
        match fs::metadata(&self.path) {
            Ok(metadata) => check_private(&self.path, &metadata),
            Err(_) => Ok(()),
        }
    }

    /// Removes a session directory whose daemon never became ready.
    pub fn discard(&self, session: Session) {
        let _ = fs::remove_dir_all(session.dir);
    }

    /// Removes the `session_latest` link, if any.
    pub fn clear_latest(&self) -> Result<()> {
        match fs::remove_file(self.path.join(LATEST_LINK)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(Error::session(&self.path, format!("cannot remove {LATEST_LINK}: {e}")))
            }
            _ => Ok(()),
        }
    }

    /// Points `session_latest` at `session`, atomically.
    pub fn make_latest(&self, session: &Session) -> Result<()> {
        let name = session.dir.file_name().unwrap_or_default();
        let staging = self.path.join(format!(".{LATEST_LINK}.{}", std::process::id()));
        let _ = fs::remove_file(&staging);
        let link = self.path.join(LATEST_LINK);
        std::os::unix::fs::symlink(name, &staging)
            .and_then(|()| fs::rename(&staging, &link))
            .map_err(|e| Error::session(&link, format!("cannot update the link: {e}")))
    }
}

/// Which daemon a process record describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessRole {
    /// The head: the cluster's control plane, its dashboard and autoscaler.
    Head,
    /// The node manager of the head's machine, which the head starts as a
    /// daemon of its own: it outlives a head that dies, so that a head
    /// started again with `--recover` finds its workers and drivers running.
    HeadNode,
    /// A node manager that joined a head.
    Node,
}

/// A process that `raylet start` left running, so `raylet stop` can end it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessRecord {
    pub pid: u32,
    pub role: ProcessRole,
    /// The address it serves on.
    pub address: String,
    pub node_id: String,
}

/// One session directory.
#[derive(Clone, Debug)]
pub struct Session {
    dir: PathBuf,
}

impl Session {
    /// Opens an existing session directory.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self> {
        let dir = dir.into();
        if !dir.join(PROCESSES_DIR).is_dir() {
            return Err(Error::session(&dir, "is not a raylet session directory"));
        }
        Ok(Session { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn token_path(&self) -> PathBuf {
        self.dir.join(TOKEN_FILE)
    }

    /// Where a daemon's stdout and stderr go.
    pub fn log_path(&self, name: &str) -> PathBuf {
        self.dir.join(LOGS_DIR).join(format!("{name}.log"))
    }

    /// Stores the token readable by its owner only (mode 0600).
    pub fn write_token(&self, token: &AuthToken) -> Result<()> {
        write_private(&self.token_path(), token.expose())
    }

    /// The stored token; `None` when the session has none.
    pub fn read_token(&self) -> Result<Option<AuthToken>> {
        let Some(text) = self.read_optional(TOKEN_FILE)? else {
            return Ok(None);
        };
        AuthToken::parse(&text)
            .map(Some)
            .map_err(|e| Error::session(self.token_path(), format!("is corrupt: {}", e.message())))
    }

    pub fn write_head_address(&self, address: &str) -> Result<()> {
        write_private(&self.dir.join(HEAD_ADDRESS_FILE), address)
    }

    /// Records where the head's HTTP server listens.
    pub fn write_dashboard_address(&self, address: &str) -> Result<()> {
        write_private(&self.dir.join(DASHBOARD_ADDRESS_FILE), address)
    }

    /// Where the head's HTTP server listens; `None` when it has none.
    pub fn read_dashboard_address(&self) -> Result<Option<String>> {
        Ok(self
            .read_optional(DASHBOARD_ADDRESS_FILE)?
            .map(|text| text.trim().to_string()))
    }

    /// The head's address; `None` when this session has no head.
    pub fn read_head_address(&self) -> Result<Option<String>> {
        let Some(text) = self.read_optional(HEAD_ADDRESS_FILE)? else {
            return Ok(None);
        };
        let address = text.trim().to_string();
        raylet_proto::channel::endpoint(&address)
            .map_err(|e| Error::session(self.dir.join(HEAD_ADDRESS_FILE), format!("is corrupt: {}", e.message())))?;
        Ok(Some(address))
    }

    pub fn record_process(&self, record: &ProcessRecord) -> Result<()> {
        let json = serde_json::to_string(record).map_err(|e| Error::session(&self.dir, e.to_string()))?;
        write_private(&self.process_path(record.pid), &json)
    }

    pub fn remove_process(&self, pid: u32) {
        let _ = fs::remove_file(self.process_path(pid));
    }

    /// The process records, and the paths of records that could not be read.
    pub fn processes(&self) -> (Vec<ProcessRecord>, Vec<(PathBuf, String)>) {
        let mut records = Vec::new();
        let mut corrupt = Vec::new();
        let Ok(entries) = fs::read_dir(self.dir.join(PROCESSES_DIR)) else {
            return (records, corrupt);
        };
        for path in entries.flatten().map(|e| e.path()) {
            let parsed = fs::read_to_string(&path)
                .map_err(|e| e.to_string())
                .and_then(|text| serde_json::from_str(&text).map_err(|e| e.to_string()));
            match parsed {
                Ok(record) => records.push(record),
                Err(error) => corrupt.push((path, error)),
            }
        }
        (records, corrupt)
    }

    fn process_path(&self, pid: u32) -> PathBuf {
        self.dir.join(PROCESSES_DIR).join(format!("{pid}.json"))
    }

    fn read_optional(&self, name: &str) -> Result<Option<String>> {
        let path = self.dir.join(name);
        match fs::read_to_string(&path) {
            Ok(text) => Ok(Some(text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::session(path, format!("cannot be read: {e}"))),
        }
    }
}

/// The user this process acts as.
fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions, touches no memory and cannot fail.
    unsafe { libc::geteuid() }
}

/// Checks that `path` belongs to this user or to root; `fix` says what to do otherwise.
fn check_owner(path: &Path, metadata: &fs::Metadata, fix: &str) -> Result<()> {
    let me = effective_uid();
    let owner = metadata.uid();
    if owner == me || owner == 0 {
        return Ok(());
    }
    Err(Error::session(
        path,
        format!(
            "belongs to another user (uid {owner}, not your uid {me}), who could point raylet \
             at a head of theirs; {fix}"
        ),
    ))
}

/// Checks that the directory `path` belongs to this user (or root) and
/// that neither its group nor other users can write in it.
fn check_private(path: &Path, metadata: &fs::Metadata) -> Result<()> {
    let elsewhere = "pass --temp-dir (or set RAYLET_TEMP_DIR) to a directory of your own";
    check_owner(
        path,
        metadata,
        &format!("remove it if it is not in use, or {elsewhere}"),
    )?;
    let mode = metadata.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(Error::session(
            path,
            format!(
                "is writable by other users (mode {mode:04o}), who could point raylet at a head \
                 of theirs; run `chmod go-w {}`, or {elsewhere}",
                path.display()
            ),
        ));
    }
    Ok(())
}

fn create_private_dir(path: &Path) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|e| Error::session(path, format!("cannot be created: {e}")))
}

/// Writes `text` to `path` atomically, readable by the owner only.
fn write_private(path: &Path, text: &str) -> Result<()> {
    let staging = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&staging)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        fs::rename(&staging, path)
    };
    write().map_err(|e| Error::session(path, format!("cannot be written: {e}")))
}

/// `2026-11-22_02-50-01_123456`: sortable, and safe in a file name.
fn timestamp_for_name() -> String {
    let now = SystemTime::now();
    let seconds = humantime::format_rfc3339_seconds(now).to_string();
    let micros = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_micros());
    let stamp = seconds.trim_end_matches('Z').replace('T', "_").replace(':', "-");
    format!("{stamp}_{micros:06}")
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_new_session_becomes_latest_and_keeps_its_files() {
        let temp = tempfile::tempdir().unwrap();
        let root = TempRoot::new(temp.path());
        assert!(root.latest().unwrap().is_none());
        let session = root.create_session().unwrap();
        assert!(root.latest().unwrap().is_none(), "not latest before it is ready");
        root.make_latest(&session).unwrap();
        let token = AuthToken::generate();
        session.write_token(&token).unwrap();
        session.write_head_address("127.0.0.1:6380").unwrap();
        let latest = root.require_latest().unwrap();
        assert_eq!(latest.dir(), session.dir());
        assert_eq!(latest.read_token().unwrap(), Some(token));
        assert_eq!(latest.read_head_address().unwrap().as_deref(), Some("127.0.0.1:6380"));
        let mode = fs::metadata(session.token_path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn process_records_round_trip_and_corrupt_ones_are_reported() {
        let temp = tempfile::tempdir().unwrap();
        let session = TempRoot::new(temp.path()).create_session().unwrap();
        let record = ProcessRecord {
            pid: 42,
            role: ProcessRole::Node,
            address: "127.0.0.1:1".into(),
            node_id: "ab".into(),
        };
        session.record_process(&record).unwrap();
        fs::write(session.dir().join(PROCESSES_DIR).join("7.json"), "{not json").unwrap();
        let (records, corrupt) = session.processes();
        assert_eq!(records, [record]);
        assert_eq!(corrupt.len(), 1);
        session.remove_process(42);
        assert!(session.processes().0.is_empty());
    }

    #[test]
    fn missing_and_corrupt_sessions_give_clear_errors() {
        let temp = tempfile::tempdir().unwrap();
        let root = TempRoot::new(temp.path());
        let error = root.require_latest().unwrap_err().to_string();
        assert!(error.contains("raylet start --head"), "{error}");

        let session = root.create_session().unwrap();
        root.make_latest(&session).unwrap();
        fs::write(session.dir().join(HEAD_ADDRESS_FILE), "not an address").unwrap();
        let error = session.read_head_address().unwrap_err().to_string();
        assert!(error.contains("head_address is corrupt"), "{error}");
        fs::write(session.token_path(), "").unwrap();
        let error = session.read_token().unwrap_err().to_string();
        assert!(error.contains("token is corrupt"), "{error}");

        fs::remove_dir_all(session.dir()).unwrap();
        let error = root.latest().unwrap_err().to_string();
        assert!(error.contains("missing"), "{error}");
        root.clear_latest().unwrap();
        assert!(root.latest().unwrap().is_none());
    }

    /// A user that is not this one (nobody), or `None` when this process may
    /// not give files away (it does not run as root).
    fn another_user() -> Option<u32> {
        (effective_uid() == 0).then_some(65534)
    }

    #[test]
    fn a_temp_root_writable_by_others_is_refused_with_the_fix() {
        let temp = tempfile::tempdir().unwrap();
        let path = temp.path().join("raylet");
        let root = TempRoot::new(&path);
        let session = root.create_session().unwrap();
        root.make_latest(&session).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "a new temp root is private");

        for open in [0o777, 0o770, 0o1777] {
            fs::set_permissions(&path, fs::Permissions::from_mode(open)).unwrap();
            for error in [
                root.latest().unwrap_err().to_string(),
                root.create_session().unwrap_err().to_string(),
            ] {
                assert!(error.contains("writable by other users"), "{error}");
                assert!(error.contains(&format!("chmod go-w {}", path.display())), "{error}");
                assert!(error.contains("--temp-dir"), "{error}");
            }
        }
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(root.require_latest().unwrap().dir(), session.dir(), "0755 is fine");

        fs::set_permissions(session.dir(), fs::Permissions::from_mode(0o777)).unwrap();
        let error = root.latest().unwrap_err().to_string();
        assert!(error.contains("writable by other users"), "{error}");
        assert!(root.sessions().is_empty(), "an open session is not listed");
    }

    #[test]
    fn a_temp_root_or_latest_link_of_another_user_is_refused_with_the_fix() {
        let Some(other) = another_user() else {
            println!("skipped: only root can give a directory to another user");
            return;
        };
        let temp = tempfile::tempdir().unwrap();
        let path = temp.path().join("raylet");
        let root = TempRoot::new(&path);
        let session = root.create_session().unwrap();
        root.make_latest(&session).unwrap();

        std::os::unix::fs::chown(&path, Some(other), None).unwrap();
        for error in [
            root.latest().unwrap_err().to_string(),
            root.create_session().unwrap_err().to_string(),
        ] {
            assert!(error.contains("belongs to another user (uid 65534"), "{error}");
            assert!(error.contains("--temp-dir"), "{error}");
            println!("refused: {error}");
        }
        std::os::unix::fs::chown(&path, Some(effective_uid()), None).unwrap();
        assert!(root.latest().unwrap().is_some());

        // Another user's link to a session of theirs, beside a real one.
        let theirs = path.join("session_theirs");
        fs::create_dir_all(theirs.join(PROCESSES_DIR)).unwrap();
        fs::write(theirs.join(HEAD_ADDRESS_FILE), "127.0.0.1:1").unwrap();
        let link = path.join(LATEST_LINK);
        fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink("session_theirs", &link).unwrap();
        std::os::unix::fs::lchown(&link, Some(other), None).unwrap();
        let error = root.latest().unwrap_err().to_string();
        assert!(error.contains("session_latest belongs to another user"), "{error}");
        assert!(error.contains(&format!("rm {}", link.display())), "{error}");
        println!("refused: {error}");

        // Their session, behind a link of ours.
        fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink("session_theirs", &link).unwrap();
        std::os::unix::fs::chown(&theirs, Some(other), None).unwrap();
        let error = root.latest().unwrap_err().to_string();
        assert!(error.contains("session_theirs belongs to another user"), "{error}");
        assert_eq!(root.sessions().len(), 1, "only our own session is listed");

        // A link that leaves the temp root.
        fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(temp.path(), &link).unwrap();
        let error = root.latest().unwrap_err().to_string();
        assert!(error.contains("not to a session directory beside it"), "{error}");
    }
}
