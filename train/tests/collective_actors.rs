//! The collective group as a training job uses it: each rank an actor on
//! its own worker process of an embedded cluster. A rank whose process is
//! killed with SIGKILL mid-allreduce makes every other rank's call fail
//! soon after, saying which peer is gone, well before the group's timeout:
//! over TCP and over shared-memory pipes, whose waits watch the TCP link.

use std::time::{Duration, Instant};

use raylet_train::collective::{CollectiveGroup, GroupOptions, ReduceOp};

/// One rank of a group, on a worker of its own.
#[raylet::actor]
#[derive(Default)]
pub struct Rank {
    group: Option<CollectiveGroup>,
}

#[raylet::actor]
impl Rank {
    pub fn new() -> Self {
        Rank::default()
    }

    /// Joins the group; returns this worker's pid and how many of its
    /// links are shared memory.
    pub fn join(
        &mut self,
        name: String,
        rank: usize,
        world: usize,
        shared_memory: bool,
    ) -> Result<(u32, usize), String> {
        let cluster = raylet::current().map_err(|e| e.to_string())?;
        let options = GroupOptions {
            timeout: Duration::from_secs(60),
            shared_memory,
            ..GroupOptions::default()
        };
        let group = CollectiveGroup::join(&cluster, &name, rank, world, options).map_err(|e| e.to_string())?;
        let pipes = group.shared_memory_links();
        self.group = Some(group);
        Ok((std::process::id(), pipes))
    }

    /// Sum-allreduces `len` elements of this rank's number; returns the
    /// first element of the result.
    pub fn allreduce(&mut self, len: usize) -> Result<f32, String> {
        let group = self.group.as_mut().ok_or("not joined")?;
        let mut values = vec![group.rank() as f32 + 1.0; len];
        group.allreduce(&mut values, ReduceOp::Sum).map_err(|e| e.to_string())?;
        Ok(values[0])
    }
}

#[test]
fn a_rank_killed_mid_allreduce_fails_every_other_rank_soon() {
    let cluster = raylet::init().unwrap();
    for shared_memory in [true, false] {
        a_killed_rank_fails_the_others(&cluster, shared_memory);
    }
    cluster.shutdown().unwrap();
}

fn a_killed_rank_fails_the_others(cluster: &raylet::Cluster, shared_memory: bool) {
    let world = 3;
    let ranks: Vec<RankHandle> = (0..world)
        .map(|_| Rank::remote(cluster).num_cpus(0.0).spawn().unwrap())
        .collect();
    let joins: Vec<_> = ranks
        .iter()
        .enumerate()
        .map(|(rank, actor)| actor.join(format!("killed-rank-{shared_memory}"), rank, world, shared_memory))
        .collect();
    let joined: Vec<(u32, usize)> = joins.iter().map(|join| join.get().unwrap()).collect();
    let expected_pipes = if shared_memory { world - 1 } else { 0 };
    assert!(joined.iter().all(|&(_, pipes)| pipes == expected_pipes), "{joined:?}");
    let pids: Vec<u32> = joined.iter().map(|&(pid, _)| pid).collect();
    let sums: Vec<_> = ranks.iter().map(|actor| actor.allreduce(1_000)).collect();
    let sums: Vec<f32> = sums.iter().map(|sum| sum.get().unwrap()).collect();
    assert_eq!(sums, [6.0; 3], "the ranks reduce together first");

    let started = Instant::now();
    let waiting: Vec<_> = ranks[..2].iter().map(|actor| actor.allreduce(4 << 20)).collect();
    std::thread::sleep(Duration::from_millis(300));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pids[2] as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    for (rank, call) in waiting.iter().enumerate() {
        let error = call.get().unwrap_err().to_string();
        // The killed rank, or a rank that failed on it and closed its links.
        assert!(error.contains("is gone"), "rank {rank}: {error}");
    }
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(20),
        "no rank waited out the 60 s timeout: {waited:?}"
    );
    println!(
        "shared memory {shared_memory}: both ranks failed {waited:?} after the call began (rank 2 killed at 300 ms)"
    );
    for actor in &ranks[..2] {
        cluster.kill(actor, true).unwrap();
    }
}
