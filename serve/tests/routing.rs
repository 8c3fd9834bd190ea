//! Routing: a deployment calling another through a `DeploymentHandle`
//! (model composition), over HTTP and from the driver, and the power of two
//! choices spreading requests over two replicas.

use crate::common;

use std::collections::BTreeMap;

use common::{Classifier, Client, Preprocess, Sleeper, deploy, init, runtime, small};
use raylet_serve::{Application, DeploymentConfig, Json, ServeError};

#[test]
fn a_preprocessing_deployment_calls_the_classifier_through_a_handle() {
    let cluster = init();
    let preprocess = DeploymentConfig::new::<Preprocess>("preprocess", ())
        .expect("a config")
        .user_config::<Preprocess>(&"n=".to_string())
        .expect("a user config")
        .num_cpus(0.5);
    let classifier = small::<Classifier>("classifier", ());
    let app = Application::new("digits", "/classify")
        .deployment(preprocess)
        .deployment(classifier);
    let instance = deploy(&cluster, app);
    let client = Client::new(instance.address(), Some(cluster.token()));
    runtime().block_on(async {
        let seven = client.post_json("/classify", r#"" n=7 ""#).await;
        assert_eq!(seven.status, 200, "{}", seven.text());
        assert_eq!(seven.json(), "7 is odd");
        let handle = instance.handle::<Preprocess>("preprocess").expect("a handle");
        let Json(answer) = handle.call(Json("n=42".to_string())).await.expect("an answer");
        assert_eq!(answer, "42 is even");
    });
    let wrong = instance.handle::<Classifier>("preprocess");
    assert!(
        matches!(wrong, Err(ServeError::WrongDeploymentType { .. })),
        "{wrong:?}"
    );
}

#[test]
fn two_replicas_both_receive_traffic() {
    let cluster = init();
    let spread = small::<Sleeper>("spread", 0).num_replicas(2);
    let app = Application::new("spread", "/").deployment(spread);
    let instance = deploy(&cluster, app);
    let client = Client::new(instance.address(), Some(cluster.token()));
    let served = runtime().block_on(async {
        let mut served = BTreeMap::<String, u32>::new();
        for _ in 0..40 {
            let answer = client.post("/", "application/octet-stream", Vec::new()).await;
            assert_eq!(answer.status, 200, "{}", answer.text());
            let replica = answer.json().as_str().expect("a replica name").to_string();
            *served.entry(replica).or_default() += 1;
        }
        served
    });
    let expected = ["replica:spread:spread:0", "replica:spread:spread:1"];
    assert_eq!(
        served.keys().map(String::as_str).collect::<Vec<_>>(),
        expected,
        "{served:?}"
    );
    assert!(
        served.values().all(|&count| count >= 5),
        "both replicas take a share: {served:?}"
    );
}
