//! The controller at work, with real HTTP under load: a SIGKILLed replica
//! is replaced and only requests it was running fail; a rolling update
//! drops nothing; a user config applies in place; an unhealthy replica is
//! replaced; autoscaling goes 1 -> 3 -> 1; a restarted controller takes
//! its replicas back; deleting an application's key tears it down.

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{Client, Sleeper, Versioned, VersionedAnswer, VersionedInit, init, runtime, small, steady_load};
use raylet::Cluster;
use raylet_serve::controller::ServeController;
use raylet_serve::status::{AppState, ReplicaState};
use raylet_serve::{Application, AutoscalingConfig, DeploymentConfig, HttpOptions, ServeInstance, ServeStatus};

fn versioned(label: &str, replicas: u32) -> DeploymentConfig {
    let init = VersionedInit {
        label: label.to_string(),
        delay_ms: 20,
        sick_dir: None,
    };
    small::<Versioned>("model", init)
        .num_replicas(replicas)
        .health_check(Duration::from_millis(300), Duration::from_secs(2))
        .graceful_shutdown_timeout(Duration::from_secs(10))
}

fn deploy(cluster: &Cluster, app: Application) -> ServeInstance {
    raylet_serve::run_with(cluster, app, HttpOptions::default().port(0)).expect("a running application")
}

/// Waits up to `seconds` for `ready` to hold of the status.
fn wait_until(cluster: &Cluster, seconds: u64, what: &str, ready: impl Fn(&ServeStatus) -> bool) -> ServeStatus {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        let status = raylet_serve::status(cluster).expect("the status");
        if ready(&status) {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "{what} within {seconds} s; last status: {status:#?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The running replicas of deployment `deployment` of `app`.
fn running(status: &ServeStatus, app: &str, deployment: &str) -> Vec<(String, u32)> {
    let Some(deployment) = status.app(app).and_then(|app| app.deployment(deployment)) else {
        return Vec::new();
    };
    deployment
        .replicas_in(ReplicaState::Running)
        .map(|replica| (replica.name.clone(), replica.pid))
        .collect()
}

fn answer(body: &[u8]) -> VersionedAnswer {
    serde_json::from_slice(body).expect("a versioned answer")
}

#[test]
fn a_sigkilled_replica_is_replaced_and_only_requests_it_was_running_fail() {
    let cluster = init();
    let instance = deploy(&cluster, Application::new("kill", "/").deployment(versioned("v1", 2)));
    let client = Client::new(instance.address(), Some(cluster.token()));
    let pids = wait_until(&cluster, 30, "both pids known", |status| {
        let replicas = running(status, "kill", "model");
        replicas.len() == 2 && replicas.iter().all(|(_, pid)| *pid != 0)
    });
    let (victim, victim_pid) = running(&pids, "kill", "model")[0].clone();

    let tally = runtime().block_on(async {
        let load = tokio::spawn({
            let client = client.clone();
            async move { steady_load(&client, "/", 200, Duration::from_secs(6)).await }
        });
        tokio::time::sleep(Duration::from_secs(2)).await;
        let killed = std::process::Command::new("kill")
            .args(["-9", &victim_pid.to_string()])
            .status()
            .expect("kill");
        assert!(killed.success());
        load.await.expect("the load")
    });

    let failures = tally.failures();
    println!(
        "{} requests at 200/s, replica {victim} SIGKILLed after 2 s: {} failed (in flight at the dead replica)",
        tally.answers.len(),
        failures.len()
    );
    for failure in &failures {
        assert_eq!(failure.status, 503, "{failure:?}");
        assert!(failure.text().contains("died while answering"), "{}", failure.text());
        assert!(failure.text().contains(&victim), "{}", failure.text());
    }
    assert!(
        failures.len() <= 5,
        "at most max_ongoing_requests (5) were running at the dead replica: {} failed",
        failures.len()
    );
    let replaced = wait_until(&cluster, 30, "a replacement running", |status| {
        let replicas = running(status, "kill", "model");
        replicas.len() == 2 && replicas.iter().all(|(name, _)| name != &victim)
    });
    assert!(
        running(&replaced, "kill", "model")
            .iter()
            .all(|(_, pid)| *pid != victim_pid)
    );
}

#[test]
fn a_rolling_update_under_load_drops_no_request() {
    let cluster = init();
    let instance = deploy(&cluster, Application::new("roll", "/").deployment(versioned("v1", 2)));
    let client = Client::new(instance.address(), Some(cluster.token()));
    let tally = runtime().block_on(async {
        let load = tokio::spawn({
            let client = client.clone();
            async move { steady_load(&client, "/", 100, Duration::from_secs(8)).await }
        });
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || {
            deploy(&cluster, Application::new("roll", "/").deployment(versioned("v2", 2)))
        })
        .await
        .expect("the update");
        load.await.expect("the load")
    });
    assert!(tally.failures().is_empty(), "no request failed: {:?}", tally.failures());
    let labels: Vec<String> = tally.answers.iter().map(|a| answer(&a.body).label).collect();
    assert_eq!(labels.first().map(String::as_str), Some("v1"));
    assert_eq!(
        labels.last().map(String::as_str),
        Some("v2"),
        "the new version took over"
    );
    let status = raylet_serve::status(&cluster).expect("the status");
    let deployment = status
        .app("roll")
        .and_then(|app| app.deployment("model"))
        .expect("the deployment");
    assert_eq!(
        deployment.replicas.len(),
        2,
        "the old replicas are gone: {deployment:#?}"
    );
    println!("{} requests during the update, all answered 200", tally.answers.len());
}

#[test]
fn a_new_user_config_applies_in_place_and_an_unhealthy_replica_is_replaced() {
    let cluster = init();
    let sick_dir = tempfile::tempdir().expect("a directory");
    let init = VersionedInit {
        label: "v1".into(),
        delay_ms: 0,
        sick_dir: Some(sick_dir.path().display().to_string()),
    };
    let config = |suffix: &str| {
        small::<Versioned>("model", init.clone())
            .num_replicas(2)
            .health_check(Duration::from_millis(300), Duration::from_secs(2))
            .user_config::<Versioned>(&suffix.to_string())
            .expect("a user config")
    };
    deploy(&cluster, Application::new("tune", "/").deployment(config("a")));
    let before = wait_until(&cluster, 30, "pids known", |s| {
        running(s, "tune", "model").iter().all(|r| r.1 != 0)
    });
    let instance = deploy(&cluster, Application::new("tune", "/").deployment(config("b")));
    let client = Client::new(instance.address(), Some(cluster.token()));
    let answers = runtime().block_on(async {
        let mut answers = Vec::new();
        for _ in 0..10 {
            answers.push(answer(
                &client.post("/", "application/octet-stream", Vec::new()).await.body,
            ));
        }
        answers
    });
    assert!(answers.iter().all(|a| a.suffix == "b"), "{answers:?}");
    let after = raylet_serve::status(&cluster).expect("the status");
    assert_eq!(
        running(&after, "tune", "model"),
        running(&before, "tune", "model"),
        "same replicas, same pids"
    );

    let (sick, _) = running(&after, "tune", "model")[0].clone();
    std::fs::write(sick_dir.path().join(&sick), b"").expect("the flag");
    wait_until(&cluster, 30, "the sick replica replaced", |status| {
        let replicas = running(status, "tune", "model");
        replicas.len() == 2 && replicas.iter().all(|(name, _)| name != &sick)
    });
}

#[test]
fn autoscaling_goes_from_one_to_three_replicas_under_load_and_back_to_one() {
    let cluster = init();
    let autoscaling = AutoscalingConfig {
        min_replicas: 1,
        max_replicas: 3,
        target_ongoing_requests: 2.0,
        upscale_delay: Duration::from_millis(500),
        downscale_delay: Duration::from_secs(2),
        metrics_interval: Duration::from_millis(200),
        look_back_period: Duration::from_secs(1),
        ..AutoscalingConfig::default()
    };
    let sleeper = small::<Sleeper>("sleepy", 100)
        .max_ongoing_requests(4)
        .autoscaling(autoscaling);
    let instance = deploy(&cluster, Application::new("scale", "/").deployment(sleeper));
    assert_eq!(
        running(&raylet_serve::status(&cluster).unwrap(), "scale", "sleepy").len(),
        1
    );
    let client = Client::new(instance.address(), Some(cluster.token()));
    let load = runtime();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..10)
        .map(|_| {
            let (client, stop) = (client.clone(), stop.clone());
            load.spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    client.post("/", "application/octet-stream", Vec::new()).await;
                }
            })
        })
        .collect();
    let scaled_up = wait_until(&cluster, 30, "3 replicas under load", |s| {
        running(s, "scale", "sleepy").len() == 3
    });
    let autoscaling = scaled_up.apps[0].deployments[0]
        .autoscaling
        .clone()
        .expect("autoscaling status");
    println!("under load: {autoscaling:?}");
    assert_eq!(autoscaling.current, 3);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    load.block_on(async {
        for worker in workers {
            worker.await.expect("a load worker");
        }
    });
    let scaled_down = wait_until(&cluster, 30, "1 replica when idle", |s| {
        let deployment = &s.apps[0].deployments[0];
        deployment.replicas.len() == 1 && deployment.replicas[0].state == ReplicaState::Running
    });
    println!("idle: {:?}", scaled_down.apps[0].deployments[0].autoscaling);
}

#[test]
fn a_restarted_controller_takes_its_replicas_back_and_a_deleted_key_tears_the_app_down() {
    let cluster = init();
    let instance = deploy(
        &cluster,
        Application::new("keep", "/keep").deployment(versioned("v1", 2)),
    );
    let before = wait_until(&cluster, 30, "pids known", |s| {
        running(s, "keep", "model").iter().all(|r| r.1 != 0)
    });
    let controller = cluster
        .get_actor_in::<ServeController>("serve", "controller")
        .expect("the controller");
    let old_pid = before.controller.pid;
    cluster
        .kill(&controller, false)
        .expect("the controller killed, to restart");
    let after = wait_until(&cluster, 60, "the restarted controller running the app", |status| {
        status.controller.pid != old_pid
            && status.app("keep").is_some_and(|app| app.state == AppState::Running)
            && running(status, "keep", "model").iter().all(|r| r.1 != 0)
    });
    let (kept, restarted): (BTreeSet<_>, BTreeSet<_>) = (
        running(&before, "keep", "model").into_iter().collect(),
        running(&after, "keep", "model").into_iter().collect(),
    );
    assert_eq!(kept, restarted, "the same replicas, not new ones");
    let client = Client::new(instance.address(), Some(cluster.token()));
    let answered = runtime().block_on(client.post("/keep", "application/octet-stream", Vec::new()));
    assert_eq!(answered.status, 200, "{}", answered.text());

    let kv = cluster.kv_namespace("_raylet_serve");
    assert!(kv.delete("apps/keep").expect("the key"), "the application is recorded");
    wait_until(&cluster, 30, "the application gone", |status| {
        status.app("keep").is_none()
    });
    let replicas = cluster.list_actors().expect("the actors");
    assert!(
        replicas
            .iter()
            .filter(|a| a.name.starts_with("replica:keep:"))
            .all(|a| a.state == raylet::ActorState::Dead)
    );
}
