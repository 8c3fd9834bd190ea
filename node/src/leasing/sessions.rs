//! Lease sessions: an owner opens one for the build it runs, its workers
//! start from that binary, and closing it ends its workers and requests;
//! a session whose workers keep dying before they register is refused.

use std::path::PathBuf;
use std::sync::Arc;

use raylet_common::worker_env::WorkerBootstrap;
use raylet_proto::WorkerId;
use raylet_proto::v1::{LeaseRefusalKind, WorkerBinary};

use super::events::{EventSender, refused_event, send};
use super::{LeaseManager, LeaseState, PendingLease};
use crate::NodeManagerError;

/// Workers started at once for a new session, so its first tasks need not wait.
const PRESTARTED_WORKERS: usize = 2;
/// A session whose workers die this often before registering is refused.
const MAX_STARTUP_FAILURES: u32 = 3;

/// An owner's lease session.
pub(super) struct Session {
    pub(super) binary: PathBuf,
    binary_hash: String,
    namespace: String,
    pub(super) events: EventSender,
    pub(super) startup_failures: u32,
}

impl Session {
    /// A session whose workers run `binary`, which hashes to `binary_hash`.
    pub(super) fn new(binary: PathBuf, binary_hash: String, namespace: String, events: EventSender) -> Self {
        Session {
            binary,
            binary_hash,
            namespace,
            events,
            startup_failures: 0,
        }
    }
}

impl LeaseManager {
    /// Opens a session whose workers run `binary`, after checking that the
    /// file there is the build the owner runs. Pre-starts a few workers; a
    /// session whose workers cannot be started is not opened.
    pub(crate) fn open_session(
        self: &Arc<Self>,
        binary: WorkerBinary,
        events: EventSender,
    ) -> Result<u64, NodeManagerError> {
        let path = PathBuf::from(&binary.path);
        let actual = self.binaries.hash(&path)?;
        if actual != binary.hash {
            return Err(NodeManagerError::BinaryMismatch {
                path,
                actual,
                expected: binary.hash,
            });
        }
        let session = {
            let mut state = self.state();
            let session = state.next_session;
            state.next_session += 1;
            let entry = Session::new(path, actual, binary.namespace, events);
            state.sessions.insert(session, entry);
            session
        };
        for _ in 0..PRESTARTED_WORKERS {
            if let Err(error) = self.spawn_worker(WorkerId::random(), session, None, Vec::new()) {
                self.close_session(session);
                return Err(error);
            }
        }
        Ok(session)
    }

    /// Kills the session's workers (no exit of theirs is recorded after
    /// this, so their socket files go first), frees their resources and
    /// drops its requests; leases that outlive the session are held for
    /// adoption for the adoption grace instead.
    pub(crate) fn close_session(self: &Arc<Self>, session: u64) {
        let doomed: Vec<u32> = {
            let mut state = self.state();
            state.sessions.remove(&session);
            state.queue.retain(|p| p.session != session);
            state.backlogs.retain(|(owner, _, _), _| *owner != session);
            let orphaned = self.orphan_outliving_leases(&mut state, session);
            let ids: Vec<WorkerId> = state
                .workers
                .iter()
                .filter(|(_, w)| w.session == session)
                .map(|(id, _)| *id)
                .collect();
            if orphaned > 0 {
                tracing::info!(
                    session,
                    orphaned,
                    "lease session closed; holding its actors' workers for adoption"
                );
            }
            ids.iter()
                .filter_map(|id| {
                    state.ledger.release(*id);
                    let worker = state.workers.remove(id)?;
                    worker.remove_socket_files_before_kill();
                    Some(worker.pid)
                })
                .collect()
        };
        tracing::debug!(session, workers = ?doomed, "lease session closed; killing its workers");
        doomed.into_iter().for_each(|pid| self.launcher.kill(pid));
        self.pump();
    }

    /// The session's binary, and what tells a worker started from it who
    /// it is and where its node is.
    pub(super) fn bootstrap(
        &self,
        worker_id: WorkerId,
        session: u64,
        gpu_ids: Vec<u32>,
    ) -> Result<(PathBuf, WorkerBootstrap), NodeManagerError> {
        let state = self.state();
        let entry = state
            .sessions
            .get(&session)
            .ok_or(NodeManagerError::SessionClosed(session))?;
        let bootstrap = WorkerBootstrap {
            node_manager_address: self.context.node_manager_address.clone(),
            head_address: self.context.head_address.clone(),
            node_id: self.context.node_id.to_string(),
            worker_id: worker_id.to_string(),
            token: self.context.token.clone(),
            binary_hash: entry.binary_hash.clone(),
            bind_ip: self.context.bind_ip.clone(),
            gpu_ids,
            namespace: entry.namespace.clone(),
            log_dir: self.context.log_dir.to_string_lossy().into_owned(),
        };
        Ok((entry.binary.clone(), bootstrap))
    }

    /// A worker died before registering: retry its request, or refuse the
    /// session's requests when its workers keep dying.
    pub(super) fn startup_failed(
        &self,
        state: &mut LeaseState,
        session: u64,
        request: Option<PendingLease>,
        description: &str,
    ) {
        let Some(entry) = state.sessions.get_mut(&session) else {
            return;
        };
        entry.startup_failures += 1;
        tracing::warn!(binary = %entry.binary.display(), %description, "a worker died before it registered");
        if entry.startup_failures < MAX_STARTUP_FAILURES {
            if let Some(pending) = request {
                state.queue.push_front(pending);
            }
            return;
        }
        let reason = format!(
            "{} workers in a row started from {} ended before they registered; the last {description}",
            entry.startup_failures,
            entry.binary.display(),
        );
        let events = entry.events.clone();
        let refused: Vec<u64> = request
            .into_iter()
            .map(|p| p.request_id)
            .chain(
                state
                    .queue
                    .iter()
                    .filter(|p| p.session == session)
                    .map(|p| p.request_id),
            )
            .collect();
        state.queue.retain(|p| p.session != session);
        for request_id in refused {
            send(
                &events,
                refused_event(request_id, LeaseRefusalKind::WorkerStartFailed, &reason),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;

    use super::*;
    use crate::tests::harness::{WorkerPoolTest, cpus};
    use crate::tests::{assert_unknown, only_launched, only_refusal, permission_denied};
    use crate::worker_process::describe_exit;

    #[tokio::test(start_paused = true)]
    async fn closing_a_session_removes_the_socket_files_of_the_workers_it_kills() {
        let test = WorkerPoolTest::start(4);
        let owner = test.open_session().expect("the session opens");
        let ports: Vec<std::net::TcpListener> = (0..2)
            .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let addresses: Vec<String> = ports.iter().map(|p| p.local_addr().unwrap().to_string()).collect();
        let files: Vec<_> = ports
            .iter()
            .map(|p| raylet_proto::local_socket::socket_for(p.local_addr().unwrap()).unwrap())
            .collect();
        files
            .iter()
            .for_each(|file| drop(std::os::unix::net::UnixListener::bind(file).unwrap()));
        let worker = test.launched().remove(0);
        test.leases
            .register_worker(worker.worker, addresses[0].clone(), addresses[1].clone())
            .expect("a started worker registers");
        test.settle().await;
        test.leases.close_session(owner.id);
        assert!(test.killed().contains(&worker.pid));
        for file in &files {
            assert!(!file.exists(), "{} is left behind", file.display());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_whose_workers_cannot_be_started_is_not_opened_and_keeps_no_worker() {
        let test = WorkerPoolTest::start(4);
        test.refuse_launches_after(1, io::ErrorKind::PermissionDenied);
        let error = test.open_session().err().expect("the session is refused");
        assert_eq!(error.to_string(), permission_denied(&test));
        let started = only_launched(&test);
        test.settle().await;
        assert_eq!(test.killed(), [started.pid]);
        assert_unknown(&test, started);
    }

    #[tokio::test(start_paused = true)]
    async fn a_binary_that_is_not_the_owners_build_opens_no_session_and_starts_no_worker() {
        let test = WorkerPoolTest::start(4);
        let binary = WorkerBinary {
            path: test.binary().to_string_lossy().into_owned(),
            hash: "another build".into(),
            namespace: String::new(),
        };
        let (events, _) = raylet_proto::peer_stream::peer_stream("lease session events", "a test owner");
        let error = test.leases.open_session(binary, events).expect_err("the builds differ");
        assert!(
            matches!(&error, NodeManagerError::BinaryMismatch { expected, .. } if expected == "another build"),
            "{error}"
        );
        assert!(test.launched().is_empty(), "no worker starts for a refused session");
    }

    #[tokio::test(start_paused = true)]
    async fn closing_a_session_kills_its_workers_and_drops_its_waiting_requests() {
        let test = WorkerPoolTest::start(1);
        let mut owner = test.open_session_with_idle_workers().await;
        let mut other = test.open_session_with_idle_workers().await;
        test.leases.request(owner.lease_request(1));
        test.leases.request(owner.lease_request(2));
        test.settle().await;
        assert_eq!(owner.events().len(), 1, "one CPU: one grant, one request waits");
        test.leases.close_session(owner.id);
        test.settle().await;
        assert_eq!(test.killed().len(), 2, "the session's two workers are killed");
        assert_eq!(test.leases.reported().1, cpus(1), "its lease is freed");
        test.leases.request(other.lease_request(3));
        test.settle().await;
        assert_eq!(other.events().len(), 1, "the freed CPU goes to the other session");
        assert!(
            test.leases.demands().is_empty(),
            "the closed session's request is dropped"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_whose_workers_keep_dying_before_they_register_is_refused_saying_why() {
        let test = WorkerPoolTest::start(4);
        let mut owner = test.open_session_with_unregistered_workers();
        test.leases.request(owner.lease_request(1));
        test.settle().await;
        for _ in 0..MAX_STARTUP_FAILURES {
            assert!(
                owner.events().is_empty(),
                "refused before {MAX_STARTUP_FAILURES} failures"
            );
            let worker = only_launched(&test);
            test.exit(worker, describe_exit(ExitStatus::from_raw(1 << 8)));
            test.settle().await;
        }
        assert!(
            test.launched().is_empty(),
            "no worker is started after the last failure"
        );
        let reason = format!(
            "3 workers in a row started from {} ended before they registered; the last exited with code 1",
            test.binary().display()
        );
        assert_eq!(
            only_refusal(&mut owner, 1),
            (LeaseRefusalKind::WorkerStartFailed, reason)
        );
        assert_eq!(test.leases.reported().1, cpus(4), "the refused lease holds nothing");
    }
}
