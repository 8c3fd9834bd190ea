//! Deploying and losing replicas: a constructor's error or an unregistered
//! class fails `run` clearly and leaves nothing running, and a replica that
//! dies is dropped from routing while the other one keeps serving, and a
//! request it never got is sent to the other; shutdown stops everything.

use crate::common;

use common::{Client, Reverser, Sleeper, Unbuildable, Unregistered, deploy, init, runtime, small};
use raylet::ActorState;
use raylet_serve::replica::Replica;
use raylet_serve::{Application, DeploymentConfig, HttpOptions, ServeError};

#[test]
fn a_replica_that_cannot_be_built_fails_the_deploy_and_nothing_stays() {
    let cluster = init();
    let front = small::<Reverser>("front", ());
    let broken = small::<Unbuildable>("model", ());
    let app = Application::new("broken", "/").deployment(front).deployment(broken);
    let failed = raylet_serve::run_with(&cluster, app, HttpOptions::default().port(0));
    let Err(ServeError::DeployFailed { app, message }) = failed else {
        panic!("expected DeployFailed, got {:?}", failed.err());
    };
    assert_eq!(app, "broken");
    assert!(
        message.contains("replica:broken:model:"),
        "names the replica: {message}"
    );
    assert!(message.contains("no checkpoint at /models/missing"), "{message}");
    let actors = cluster.list_actors().expect("the actors");
    let replicas: Vec<_> = actors
        .iter()
        .filter(|a| a.state != ActorState::Dead && a.name.starts_with("replica:"))
        .collect();
    assert!(
        replicas.is_empty(),
        "no replica of the failed deploy runs, not even the good one: {replicas:?}"
    );
    let status = raylet_serve::status(&cluster).expect("the status");
    assert!(status.app("broken").is_none(), "the failed application was deleted");

    let unregistered = DeploymentConfig::new::<Unregistered>("echo", ()).expect("a config");
    let app = Application::new("unregistered", "/").deployment(unregistered);
    let refused = raylet_serve::run_with(&cluster, app, HttpOptions::default().port(0));
    assert!(matches!(refused, Err(ServeError::NotRegistered(ref error)) if error.name().ends_with("Unregistered")));
}

#[test]
fn a_dead_replica_leaves_routing_and_the_other_serves() {
    let cluster = init();
    let pair = small::<Sleeper>("pair", 0).num_replicas(2);
    let app = Application::new("pair", "/").deployment(pair);
    let instance = deploy(&cluster, app);
    let doomed = cluster
        .get_actor_in::<Replica>("serve", "replica:pair:pair:0")
        .expect("replica 0");
    cluster.kill(&doomed, true).expect("replica 0 killed");
    let answers = runtime().block_on(async {
        let client = Client::new(instance.address(), Some(cluster.token()));
        let mut answers = Vec::new();
        for _ in 0..20 {
            answers.push(client.post("/", "application/octet-stream", Vec::new()).await);
        }
        answers
    });
    // Replica 0 was dead before any request: none reached it, so each one
    // that was routed there went to replica 1 instead.
    assert!(answers.iter().all(|a| a.status == 200), "{answers:?}");
    assert!(answers.iter().all(|a| a.json() == "replica:pair:pair:1"), "{answers:?}");
}

#[test]
fn shutdown_stops_every_application_proxy_and_the_controller() {
    let cluster = init();
    deploy(
        &cluster,
        Application::new("one", "/one").deployment(small::<Reverser>("front", ())),
    );
    deploy(
        &cluster,
        Application::new("two", "/two").deployment(small::<Reverser>("front", ())),
    );
    let status = raylet_serve::status(&cluster).expect("the status");
    assert_eq!(status.apps.len(), 2);
    assert_eq!(status.proxies.len(), 1, "one proxy per node serves both");
    raylet_serve::shutdown(&cluster).expect("a shutdown");
    let actors = cluster.list_actors().expect("the actors");
    let left: Vec<_> = actors
        .iter()
        .filter(|a| a.namespace == "serve" && a.state != ActorState::Dead)
        .collect();
    assert!(left.is_empty(), "nothing of Serve runs: {left:?}");
    assert!(raylet_serve::status(&cluster).is_err(), "no controller answers");
}
