//! Where a worker's task stream, an owner's calls (see
//! [`crate::owner_calls`]) and a node's store calls also listen on a Unix
//! socket, for peers on the same machine: a folder of the machine's temporary directory, one
//! per user and network namespace (so that hosts simulated in namespaces
//! stay apart), made by the first process that needs it with mode 0700 so
//! that only the cluster's user can connect. A socket is named after the
//! TCP port it stands beside (a worker's task port, a process's owner
//! port, a node manager's port), which no other live process of the namespace holds; a peer that
//! finds none there, or whose connect is refused (a process that died),
//! takes TCP. The node manager removes a worker's socket files once the
//! worker has exited.

use std::collections::HashMap;
use std::fs::DirBuilder;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

/// The longest path a Unix socket address holds on Linux.
const MAX_SOCKET_PATH: usize = 107;

/// The same-node socket beside the TCP port `address`, if this process
/// runs without TLS (with TLS every byte between processes is encrypted,
/// so none is bound or used) and the folder for this user and namespace
/// is sound; `None` means TCP only.
pub fn socket_for(address: SocketAddr) -> Option<PathBuf> {
    if !matches!(raylet_common::tls::current(), Ok(None)) {
        return None;
    }
    let folder = folder().ok()?;
    let path = folder.join(format!("{}_{}.sock", address.ip(), address.port()));
    (path.as_os_str().len() <= MAX_SOCKET_PATH).then_some(path)
}

/// Listens on the same-node socket beside the TCP port `address`, in place
/// of a file a dead process left; `None` (logged, with `purpose`) means
/// TCP only.
pub fn bind(address: SocketAddr, purpose: &str) -> Option<UnixListener> {
    let path = socket_for(address)?;
    let _ = std::fs::remove_file(&path);
    let bound = UnixListener::bind(&path).and_then(|listener| {
        listener.set_nonblocking(true)?;
        Ok(listener)
    });
    match bound {
        Ok(listener) => Some(listener),
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "{purpose} from this machine take TCP");
            None
        }
    }
}

/// Removes the socket file of the worker whose task stream listened on
/// `address`, once it is gone (a worker killed cannot remove its own).
pub fn remove_socket_of(address: &str) {
    let Some(path) = address.parse().ok().and_then(socket_for) else {
        return;
    };
    if let Err(error) = std::fs::remove_file(&path)
        && error.kind() != io::ErrorKind::NotFound
    {
        tracing::debug!(path = %path.display(), %error, "a dead worker's socket file stays");
    }
}

/// The same-node sockets that process `pid` listens on in this user's
/// folder, read from `/proc` (its descriptors, and `/proc/net/unix` of this
/// namespace); none once it is gone.
pub fn listening_sockets_of(pid: u32) -> Vec<PathBuf> {
    /// `__SO_ACCEPTCON` in /proc/net/unix's flags: a listening socket.
    const LISTENING: &str = "00010000";
    let (Ok(folder), Ok(table)) = (folder(), unix_sockets()) else {
        return Vec::new();
    };
    let listening: HashMap<&str, &str> = socket_rows(&table)
        .filter(|row| row.flags == LISTENING)
        .map(|row| (row.inode, row.path))
        .collect();
    let Ok(descriptors) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    descriptors
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy();
            let inode = target.strip_prefix("socket:[")?.strip_suffix(']')?;
            listening.get(inode).map(PathBuf::from)
        })
        .filter(|path| path.parent() == Some(folder.as_path()))
        .collect()
}

/// Removes the socket files that process `pid` listens on, before it is
/// killed: a worker that had not told its node manager its addresses yet.
pub fn remove_sockets_of_process(pid: u32) {
    for path in listening_sockets_of(pid) {
        if let Err(error) = std::fs::remove_file(&path) {
            tracing::debug!(path = %path.display(), %error, "a killed worker's socket file stays");
        }
    }
}

/// Socket files younger than this are never swept: their process may be
/// between binding and listening.
const SWEEP_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Removes the socket files in this user's folder that no socket of the
/// namespace is bound to any more: those of processes killed before they
/// could remove their own (a driver or node ended by SIGKILL). A node
/// manager sweeps when it starts. Returns how many it removed.
pub fn remove_stale_sockets() -> usize {
    let (Ok(folder), Ok(table)) = (folder(), unix_sockets()) else {
        return 0;
    };
    let bound: std::collections::HashSet<&str> = socket_rows(&table).map(|row| row.path).collect();
    let Ok(entries) = std::fs::read_dir(&folder) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "sock"))
        .filter(|path| !bound.contains(path.to_string_lossy().as_ref()))
        .filter(|path| older_than(path, SWEEP_GRACE))
        .filter(|path| std::fs::remove_file(path).is_ok())
        .count()
}

/// The Unix sockets of this network namespace bound to a path, as
/// `/proc/net/unix` lists them.
fn unix_sockets() -> io::Result<String> {
    std::fs::read_to_string("/proc/net/unix")
}

/// A bound socket's row of `/proc/net/unix`.
struct SocketRow<'a> {
    flags: &'a str,
    inode: &'a str,
    path: &'a str,
}

/// The rows of `table` (from [`unix_sockets`]) of sockets bound to a path.
fn socket_rows(table: &str) -> impl Iterator<Item = SocketRow<'_>> {
    table.lines().skip(1).filter_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        Some(SocketRow {
            flags: fields.get(3)?,
            inode: fields.get(6)?,
            path: fields.get(7)?,
        })
    })
}

/// Whether the file at `path` was last changed more than `age` ago.
fn older_than(path: &Path, age: std::time::Duration) -> bool {
    std::fs::symlink_metadata(path)
        .and_then(|metadata| metadata.modified())
        .is_ok_and(|modified| modified.elapsed().is_ok_and(|elapsed| elapsed > age))
}

/// The folder for this user and network namespace, made if missing; an
/// error if it exists with another owner or more permissions than 0700,
/// which another user could have set up to listen in.
fn folder() -> io::Result<PathBuf> {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    let namespace = std::fs::metadata("/proc/self/ns/net")?.ino();
    let folder = std::env::temp_dir().join(format!("raylet-{uid}-net{namespace}"));
    match DirBuilder::new().mode(0o700).create(&folder) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
        Err(error) => return Err(error),
    }
    check_private(&folder, uid)?;
    Ok(folder)
}

fn check_private(folder: &Path, uid: u32) -> io::Result<()> {
    let metadata = std::fs::symlink_metadata(folder)?;
    let mode = metadata.permissions().mode() & 0o777;
    if !metadata.is_dir() || metadata.uid() != uid || mode != 0o700 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a folder of user {uid} with mode 0700 (uid {}, mode {mode:o})",
                folder.display(),
                metadata.uid()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workers_socket_is_named_after_its_tcp_address_in_a_private_folder() {
        let path = socket_for("127.0.0.1:4567".parse().unwrap()).unwrap();
        assert!(path.ends_with("127.0.0.1_4567.sock"), "{}", path.display());
        let folder = path.parent().unwrap();
        let mode = std::fs::metadata(folder).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
    }

    #[test]
    fn a_dead_workers_socket_file_is_removed_and_a_missing_one_is_no_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let path = socket_for(address).unwrap();
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        remove_socket_of(&address.to_string());
        assert!(!path.exists());
        remove_socket_of(&address.to_string());
        remove_socket_of("not an address");
    }

    #[test]
    fn the_sockets_a_process_listens_on_are_found_and_removed_and_no_others() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let socket = bind(address, "test calls").unwrap();
        let path = socket_for(address).unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let _outside = UnixListener::bind(elsewhere.path().join("outside.sock")).unwrap();
        let found = listening_sockets_of(std::process::id());
        assert!(found.contains(&path), "{found:?}");
        assert!(
            found.iter().all(|p| p.parent() == path.parent()),
            "only this user's folder: {found:?}"
        );
        remove_sockets_of_process(std::process::id());
        assert!(!path.exists());
        assert!(elsewhere.path().join("outside.sock").exists());
        drop(socket);
        assert!(listening_sockets_of(u32::MAX).is_empty(), "no such process");
    }

    #[test]
    fn a_sweep_removes_old_socket_files_nobody_is_bound_to_and_keeps_the_others() {
        let folder = socket_for("127.0.0.1:1".parse().unwrap()).unwrap();
        let folder = folder.parent().unwrap();
        let stale = folder.join("127.0.0.254_1.sock");
        drop(UnixListener::bind(&stale).unwrap());
        let live = folder.join("127.0.0.254_2.sock");
        let _listening = UnixListener::bind(&live).unwrap();
        let young = folder.join("127.0.0.254_3.sock");
        drop(UnixListener::bind(&young).unwrap());
        for old in [&stale, &live] {
            made_an_hour_ago(old);
        }
        assert!(remove_stale_sockets() >= 1);
        assert!(!stale.exists(), "nothing is bound to it");
        assert!(live.exists(), "a listener is bound to it");
        assert!(young.exists(), "it may be about to listen");
        std::fs::remove_file(&young).unwrap();
    }

    /// Sets the times of the socket file at `path` an hour back (a socket
    /// cannot be opened, so through its path).
    fn made_an_hour_ago(path: &Path) {
        let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        let then = libc::timespec {
            tv_sec: now.as_secs() as libc::time_t - 3600,
            tv_nsec: 0,
        };
        // SAFETY: a valid NUL-terminated path and two timespecs.
        let set = unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), [then, then].as_ptr(), 0) };
        assert_eq!(set, 0, "{}", io::Error::last_os_error());
    }

    #[test]
    fn a_folder_others_may_enter_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("shared");
        DirBuilder::new().mode(0o755).create(&folder).unwrap();
        std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o755)).unwrap();
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        let refused = check_private(&folder, uid).unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::PermissionDenied);
        assert!(refused.to_string().contains("mode 755"), "{refused}");
        std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o700)).unwrap();
        check_private(&folder, uid).unwrap();
        assert!(check_private(&folder, uid + 1).is_err());
    }
}
