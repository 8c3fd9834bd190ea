//! The temp directory is trusted only when it is this user's: a temp root
//! that another user made, or that others can write in, or a
//! `session_latest` link of another user, is refused by the CLI with what
//! is wrong and how to fix it, before it connects anywhere; so another
//! local user cannot send `raylet job submit` (and the token) to a
//! listener of theirs.

use std::net::TcpListener;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::RAYLET;

/// The uid of `nobody`, who plays the other local user.
const OTHER_USER: u32 = 65534;

/// Runs `raylet ARGS --temp-dir ROOT [-- ENTRYPOINT]`; whether it succeeded,
/// and its stderr.
fn run(root: &Path, args: &[&str], entrypoint: &[&str]) -> (bool, String) {
    let mut command = Command::new(RAYLET);
    command.args(args).arg("--temp-dir").arg(root);
    if !entrypoint.is_empty() {
        command.arg("--").args(entrypoint);
    }
    let output = command.output().unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A temp root laid out by the other user: a session of theirs whose
/// `head_address` is `listener`'s, linked as `session_latest`.
fn plant_session(root: &Path, listener: &TcpListener) {
    let session = root.join("session_planted");
    std::fs::create_dir_all(session.join("processes")).unwrap();
    let address = listener.local_addr().unwrap().to_string();
    std::fs::write(session.join("head_address"), address).unwrap();
    std::fs::write(session.join("token"), "f".repeat(64)).unwrap();
    std::os::unix::fs::symlink("session_planted", root.join("session_latest")).unwrap();
}

/// The planted head: a listener that counts connections and hangs up.
fn planted_head() -> (TcpListener, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let (accepting, counted) = (listener.try_clone().unwrap(), calls.clone());
    std::thread::spawn(move || {
        while let Ok((socket, _)) = accepting.accept() {
            counted.fetch_add(1, Ordering::SeqCst);
            drop(socket);
        }
    });
    (listener, calls)
}

#[test]
fn a_temp_dir_another_user_controls_is_refused_before_connecting() {
    let temp = tempfile::tempdir().unwrap();
    if std::fs::metadata(temp.path()).unwrap().uid() != 0 {
        println!("skipped: only root can give a directory to another user");
        return;
    }
    let (listener, calls) = planted_head();
    let submit = ["job", "submit", "--no-wait"];

    // The other user made the temp root.
    let theirs = temp.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    plant_session(&theirs, &listener);
    std::os::unix::fs::chown(&theirs, Some(OTHER_USER), None).unwrap();
    let (ok, error) = run(&theirs, &submit, &["/bin/true"]);
    println!("a temp root of another user: {error}");
    assert!(!ok && error.contains("belongs to another user (uid 65534"), "{error}");
    assert!(error.contains("--temp-dir"), "the error says how to fix it: {error}");

    // A temp root of ours that everyone may write in.
    let open = temp.path().join("open");
    std::fs::create_dir(&open).unwrap();
    plant_session(&open, &listener);
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (ok, error) = run(&open, &submit, &["/bin/true"]);
    println!("a temp root writable by others: {error}");
    assert!(!ok && error.contains("writable by other users (mode 0777)"), "{error}");
    assert!(error.contains(&format!("chmod go-w {}", open.display())), "{error}");
    let (ok, error) = run(&open, &["start", "--head", "--port", "0"], &[]);
    assert!(
        !ok && error.contains("writable by other users"),
        "no head starts there: {error}"
    );

    // A private temp root with the other user's link in it.
    let linked = temp.path().join("linked");
    std::fs::create_dir(&linked).unwrap();
    plant_session(&linked, &listener);
    std::fs::set_permissions(&linked, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::lchown(linked.join("session_latest"), Some(OTHER_USER), None).unwrap();
    let (ok, error) = run(&linked, &submit, &["/bin/true"]);
    println!("another user's session_latest: {error}");
    assert!(
        !ok && error.contains("session_latest belongs to another user"),
        "{error}"
    );
    assert!(error.contains("rm "), "the error says how to fix it: {error}");

    assert_eq!(calls.load(Ordering::SeqCst), 0, "the planted head was never called");
}

#[test]
fn stop_with_a_temp_dir_leaves_clusters_in_directories_that_merely_start_with_its_name() {
    let temp = tempfile::tempdir().unwrap();
    let ours = temp.path().join("raylet");
    let neighbour = temp.path().join("raylet-other");
    let _ours = crate::common::Daemons(&ours);
    let _neighbour = crate::common::Daemons(&neighbour);
    for root in [&ours, &neighbour] {
        crate::common::raylet(root, &["start", "--head", "--port", "0", "--num-cpus", "0"]);
    }
    let neighbour_head = crate::common::daemon_pids(&neighbour, "head")[0];
    let stopped = crate::common::raylet(&ours, &["stop"]);
    println!("raylet stop --temp-dir {}: {}", ours.display(), stopped.trim());
    assert!(stopped.contains("Stopped all 2 raylet processes"), "{stopped}");
    assert!(
        std::path::Path::new(&format!("/proc/{neighbour_head}")).exists(),
        "the head under {} still runs",
        neighbour.display()
    );
    let status = crate::common::raylet(&neighbour, &["status", "--format", "json"]);
    assert!(status.contains("\"alive_nodes\": 1"), "{status}");
}
