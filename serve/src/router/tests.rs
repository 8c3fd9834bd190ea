//! The router without a cluster: replicas are handles to actors that do
//! not exist, and each attempt is answered with a reply the test makes, as
//! `Router::send` answers with the replica's.

use std::cell::RefCell;

use raylet::ActorId;

use super::*;

/// A handle to a replica actor that does not exist.
fn replica_handle() -> ReplicaHandle {
    let wire = serde_json::json!({
        "id": ActorId::random().as_bytes(),
        "class": "raylet_serve::replica::Replica",
        "max_task_retries": 0,
    });
    serde_json::from_value(wire).expect("a handle decodes from its fields")
}

fn routes(replicas: &[&str], awaits_replicas: bool) -> DeploymentRoutes {
    DeploymentRoutes {
        app: "app".into(),
        deployment: "echo".into(),
        class: "demo::Echo".into(),
        max_ongoing_requests: 2,
        max_queued_requests: 1,
        awaits_replicas,
        replicas: (replicas.iter())
            .map(|name| (name.to_string(), replica_handle()))
            .collect(),
    }
}

fn router(replicas: &[&str]) -> Arc<Router> {
    Arc::new(Router::new(&routes(replicas, true)))
}

/// Counts `calls` calls in flight at replica `name`, as calls sent earlier.
fn load(router: &Router, name: &str, calls: u32) {
    let mut state = router.lock();
    let estimate = state.load_of(name).expect("a routed replica");
    for _ in 0..calls {
        estimate.count_call();
    }
}

/// The replica a request would go to; the call is dropped at once.
fn chosen(router: &Arc<Router>) -> Option<String> {
    match router.choose() {
        Choice::Replica(call) => Some(call.name.clone()),
        Choice::Wait | Choice::NoReplicas => None,
    }
}

fn reply(outcome: Outcome) -> ServeReply {
    ServeReply {
        ongoing: 0,
        fullness: None,
        outcome,
    }
}

fn answered(body: &str) -> Outcome {
    Outcome::Ok {
        body: body.as_bytes().to_vec(),
        encoding: Encoding::Bytes,
    }
}

/// A replica's death as a call to it fails.
fn died(kind: TaskErrorKind) -> raylet::Error {
    raylet::Error::Task(TaskError {
        kind,
        function: "raylet_serve::replica::Replica::handle".into(),
        message: "its node was lost".into(),
        node_id: None,
        pid: 0,
        attempt: 0,
    })
}

#[test]
fn the_less_loaded_of_two_replicas_gets_the_request() {
    let router = router(&["a", "b"]);
    load(&router, "a", 1);
    for _ in 0..20 {
        assert_eq!(chosen(&router).as_deref(), Some("b"));
    }
}

#[test]
fn the_most_loaded_of_three_replicas_is_never_chosen() {
    let router = Arc::new(Router::new(&DeploymentRoutes {
        max_ongoing_requests: 10,
        ..routes(&["a", "b", "c"], true)
    }));
    load(&router, "a", 3);
    load(&router, "b", 1);
    let choices: Vec<Option<String>> = (0..50).map(|_| chosen(&router)).collect();
    assert!(!choices.contains(&Some("a".into())), "{choices:?}");
    assert!(choices.contains(&Some("c".into())), "{choices:?}");
}

#[test]
fn a_replica_at_max_ongoing_requests_is_avoided_and_all_full_means_wait() {
    let router = router(&["a", "b"]);
    load(&router, "a", 2);
    assert_eq!(chosen(&router).as_deref(), Some("b"));
    load(&router, "b", 2);
    assert!(matches!(router.choose(), Choice::Wait));
}

#[test]
fn a_replica_that_reports_itself_full_is_avoided() {
    let router = router(&["a", "b"]);
    let now = Instant::now();
    router
        .lock()
        .load_of("a")
        .expect("routed")
        .take_fullness(Some(1.0), 0, now);
    router
        .lock()
        .load_of("b")
        .expect("routed")
        .take_fullness(Some(0.9), 0, now);
    for _ in 0..10 {
        assert_eq!(chosen(&router).as_deref(), Some("b"));
    }
}

#[tokio::test]
async fn a_rejected_request_is_routed_again_to_another_replica() {
    let router = router(&["a", "b"]);
    load(&router, "b", 1);
    let tried = RefCell::new(Vec::new());
    let answer = router
        .route(|call| {
            tried.borrow_mut().push(call.name.clone());
            let outcome = match call.name.as_str() {
                "a" => Outcome::Rejected,
                _ => answered("from b"),
            };
            std::future::ready(router.answer(call, reply(outcome)))
        })
        .await
        .expect("b answers");
    assert_eq!(answer.0, b"from b");
    assert_eq!(tried.into_inner(), ["a", "b"]);
}

#[tokio::test]
async fn a_deployment_no_replica_will_come_to_fails_at_once() {
    let router = Arc::new(Router::new(&routes(&[], false)));
    let sent = RefCell::new(0);
    let result = router
        .route(|call| {
            *sent.borrow_mut() += 1;
            std::future::ready(router.answer(call, reply(answered(""))))
        })
        .await;
    assert!(
        matches!(&result, Err(ServeError::NoReplicas { deployment }) if deployment == "echo"),
        "{result:?}"
    );
    assert_eq!(sent.into_inner(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_request_waits_for_a_replica_and_a_full_queue_refuses_the_next() {
    let router = router(&[]);
    let send = |call: InFlight| std::future::ready(router.answer(call, reply(answered("late"))));
    let waiting = router.route(send);
    tokio::pin!(waiting);
    let still_waiting = tokio::time::timeout(Duration::from_secs(1), &mut waiting).await;
    assert!(still_waiting.is_err(), "it waits while no replica runs");
    assert_eq!(router.waiting(), 1);
    let refused = router.route(send).await;
    assert!(
        matches!(&refused, Err(ServeError::BackPressure { .. })),
        "the queue holds one: {refused:?}"
    );
    router.set_replicas(&routes(&["a"], true));
    let answer = waiting.await.expect("the new replica answers");
    assert_eq!(answer.0, b"late");
    assert_eq!(router.waiting(), 0, "its place in the queue is given back");
}

#[test]
fn removed_replicas_leave_the_router_and_kept_ones_keep_their_estimates() {
    let router = router(&["a", "b"]);
    load(&router, "b", 1);
    router.set_replicas(&routes(&["b", "c"], true));
    assert!(router.lock().load_of("a").is_none());
    for _ in 0..10 {
        assert_eq!(chosen(&router).as_deref(), Some("c"), "b still has a call in flight");
    }
    router.set_replicas(&routes(&[], true));
    assert!(matches!(router.choose(), Choice::Wait));
}

#[test]
fn a_replica_gone_before_the_call_is_dropped_and_the_request_routed_again() {
    let router = router(&["a", "b"]);
    let again = router.failed::<()>("a", died(TaskErrorKind::ActorDiedBeforeSend));
    assert!(matches!(again, Ok(None)), "{again:?}");
    for _ in 0..10 {
        assert_eq!(chosen(&router).as_deref(), Some("b"));
    }
}

#[test]
fn a_replica_that_died_during_the_call_fails_the_request() {
    let router = router(&["a", "b"]);
    let failed = router.failed::<()>("a", died(TaskErrorKind::ActorDied));
    assert!(
        matches!(&failed, Err(ServeError::ReplicaDied { replica, .. }) if replica == "a"),
        "{failed:?}"
    );
    assert!(router.lock().load_of("a").is_none(), "it is dropped");
}

#[test]
fn a_failure_of_user_code_keeps_the_replica() {
    let router = router(&["a"]);
    let error = died(TaskErrorKind::Application);
    let failed = router.failed::<()>("a", error);
    assert!(matches!(failed, Err(ServeError::Cluster(_))), "{failed:?}");
    assert!(router.lock().load_of("a").is_some());
}
