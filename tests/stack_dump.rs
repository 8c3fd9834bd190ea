//! `raylet stack`: a dump of a busy worker shows the function it is in
//! and its threads' names, the worker runs on undisturbed, and a pid that
//! is not a worker's is refused with a clear error.

use std::process::Command;
use std::time::Duration;

use crate::common;
use common::{Daemons, head_address, raylet};
use raylet::Config;

/// Waits in a function whose name the dump must show.
#[inline(never)]
fn waiting_in_a_function_the_stack_dump_names(ms: u64) -> u64 {
    std::thread::sleep(Duration::from_millis(ms));
    std::hint::black_box(ms)
}

#[raylet::actor]
pub struct Waiter {}

#[raylet::actor]
impl Waiter {
    pub fn new() -> Self {
        Waiter {}
    }

    pub fn wait_then_answer(&self, ms: u64) -> u64 {
        waiting_in_a_function_the_stack_dump_names(ms) + 1
    }

    pub fn pid(&self) -> u32 {
        std::process::id()
    }
}

#[test]
fn raylet_stack_shows_where_a_busy_worker_waits_without_stopping_it() {
    let temp = tempfile::tempdir().unwrap();
    let _daemons = Daemons(temp.path());
    raylet(temp.path(), &["start", "--head", "--port", "0", "--num-cpus", "1"]);
    let head = head_address(temp.path());
    let cluster = raylet::init_with(Config::new().address(&head).temp_dir(temp.path())).unwrap();
    let waiter = Waiter::remote(&cluster).spawn().unwrap();
    let pid = waiter.pid().get().unwrap();
    let answer = waiter.wait_then_answer(4000);
    std::thread::sleep(Duration::from_millis(1500));

    let dump = raylet(temp.path(), &["stack", "--worker", &pid.to_string()]);
    assert!(dump.contains(&format!("pid {pid}")), "{dump}");
    assert!(dump.contains("waiting_in_a_function_the_stack_dump_names"), "{dump}");
    assert!(dump.contains("wait_then_answer"), "{dump}");
    assert!(dump.contains("raylet-output"), "the threads are named: {dump}");
    let everyone = raylet(temp.path(), &["stack"]);
    assert!(
        everyone.contains("waiting_in_a_function_the_stack_dump_names"),
        "{everyone}"
    );
    assert_eq!(answer.get().unwrap(), 4001, "the dumped worker ran on");

    let refused = Command::new(common::RAYLET)
        .args(["stack", "--worker", "1", "--temp-dir"])
        .arg(temp.path())
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        message.contains("process 1 is not a worker of any alive node"),
        "{message}"
    );
    assert_eq!(waiter.pid().get().unwrap(), pid, "the worker still serves");
    cluster.shutdown().unwrap();
}
