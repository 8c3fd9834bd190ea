//! The node manager of the head's machine: a daemon of its own that the head
//! starts beside itself (as Ray runs its GCS and the head's raylet apart).
//! A head that dies, even by SIGKILL, leaves that node's workers, actors,
//! Serve replicas and job drivers running; a head started again with
//! `--recover` finds the node alive and it goes on as the same incarnation.
//! A head that stops on a signal stops its node first.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use raylet::session::{ProcessRecord, ProcessRole, Session};
use raylet_common::auth::AuthToken;
use raylet_proto::NodeId;

use crate::args::StartArgs;
use crate::daemon::{self, TOKEN_VARIABLE};
use crate::stop::is_raylet_daemon;

/// The session log the head's node writes to.
const LOG_NAME: &str = "head_node";
/// How long a head that stops waits for its node to stop before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(30);
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// The node manager of the head's machine, started or found by the head.
pub(crate) struct HeadNode {
    pid: u32,
    /// Set when this head started it: reaped when it exits.
    child: Option<Child>,
}

/// What a recovering head finds of its machine's node manager.
enum Survivor {
    /// It outlived the dead head.
    Alive(ProcessRecord),
    /// It died too; a new one comes back as this node's next incarnation.
    Dead(NodeId),
    /// There was none.
    None,
}

impl HeadNode {
    /// Starts the head machine's node manager, joined to `head_address`; a
    /// recovering head first looks for the one that outlived it.
    pub(crate) async fn start_or_find(
        args: &StartArgs,
        session: &Session,
        head_address: &str,
        token: &AuthToken,
    ) -> anyhow::Result<HeadNode> {
        let survivor = match args.recover {
            true => find_survivor(session),
            false => Survivor::None,
        };
        let node_id = match survivor {
            Survivor::Alive(record) => {
                tracing::info!(pid = record.pid, node_id = %record.node_id, "the head's node outlived the old head");
                return Ok(HeadNode {
                    pid: record.pid,
                    child: None,
                });
            }
            Survivor::Dead(node_id) => Some(node_id),
            Survivor::None => None,
        };
        let command = node_command(args, head_address, token, node_id)?;
        let session = session.clone();
        let patience = args.connect_timeout + crate::start::READY_SLACK;
        let (started, child) =
            tokio::task::spawn_blocking(move || daemon::start_daemon(command, &session, LOG_NAME, patience))
                .await?
                .context("starting the node manager of the head's machine")?;
        tracing::info!(pid = started.pid, node_id = %started.node_id, address = %started.address, "the head's node started");
        Ok(HeadNode {
            pid: started.pid,
            child: Some(child),
        })
    }

    /// Stops the node (SIGTERM, then SIGKILL after a grace period) and waits
    /// until it exited.
    pub(crate) async fn stop(self) {
        let mut node = self;
        let _ = tokio::task::spawn_blocking(move || node.stop_blocking()).await;
    }

    fn stop_blocking(&mut self) {
        if !self.is_running() {
            return;
        }
        let pid = Pid::from_raw(self.pid as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let since = Instant::now();
        let mut killed = false;
        while self.is_running() {
            if !killed && since.elapsed() > STOP_GRACE {
                tracing::warn!(
                    pid = self.pid,
                    "the head's node did not stop in {STOP_GRACE:?}; killing it"
                );
                let _ = kill(pid, Signal::SIGKILL);
                killed = true;
            }
            std::thread::sleep(POLL_INTERVAL);
        }
        tracing::info!(pid = self.pid, "the head's node stopped");
    }

    /// Whether it still runs; reaps a child that exited.
    fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => is_raylet_daemon(self.pid),
        }
    }
}

/// `raylet start --address HEAD --head-node` with the head's node flags;
/// the token goes in the environment, never on the command line.
fn node_command(
    args: &StartArgs,
    head_address: &str,
    token: &AuthToken,
    node_id: Option<NodeId>,
) -> anyhow::Result<Command> {
    let mut command = Command::new(std::env::current_exe()?);
    command
        .args(["start", "--address", head_address, "--head-node"])
        .args(args.head_node_flags())
        .env(TOKEN_VARIABLE, token.expose())
        .envs(raylet_common::tls::child_env());
    if let Some(node_id) = node_id {
        command.arg("--node-id").arg(node_id.to_string());
    }
    Ok(command)
}

/// The head machine's node manager of the dead head, from the session's
/// records; the records of dead ones are removed.
fn find_survivor(session: &Session) -> Survivor {
    let (records, _) = session.processes();
    let mut survivor = Survivor::None;
    for record in records
        .into_iter()
        .filter(|record| record.role == ProcessRole::HeadNode)
    {
        if is_raylet_daemon(record.pid) {
            return Survivor::Alive(record);
        }
        session.remove_process(record.pid);
        if let Ok(node_id) = record.node_id.parse() {
            survivor = Survivor::Dead(node_id);
        }
    }
    survivor
}
