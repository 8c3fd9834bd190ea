//! A submission to Ray's job API (`POST /api/jobs/`) read into what a
//! raylet job needs. Ray's fields and what raylet does with each:
//!
//! | field | raylet |
//! |---|---|
//! | `entrypoint` | honoured: runs as `/bin/sh -c ENTRYPOINT` in the job's directory, as Ray runs it |
//! | `submission_id` | honoured: the job's name; its id is the submission id's hash (or the id itself when it is 32 hex digits); without one, `raysubmit_` and 16 letters and digits, as Ray makes them |
//! | `metadata` | honoured: the job's metadata |
//! | `entrypoint_num_cpus`, `entrypoint_num_gpus`, `entrypoint_memory` (bytes), `entrypoint_resources` | honoured: what the driver holds on its node |
//! | `runtime_env.working_dir` | honoured for a package uploaded to this head (`gcs://...zip`): unpacked into the job's directory; a remote URI is refused |
//! | `runtime_env.env_vars` | honoured: the driver's environment |
//! | `runtime_env.excludes` | ignored: the client applied it when it made the package |
//! | `runtime_env.config` | ignored: raylet installs nothing for a job, so there is no setup to time out |
//! | `runtime_env.pip`, `conda`, `uv`, `py_modules`, `py_executable`, `java_jars`, `container`, `image_uri`, `worker_process_setup_hook` and plugins | refused: a raylet job is a program built beforehand and raylet installs nothing on its nodes |
//! | `entrypoint_label_selector` | refused unless empty: raylet places a driver by its resources only |
//! | `job_id` | refused unless null, as Ray's own server treats the deprecated field |
//! | anything else | refused |

use std::collections::BTreeMap;

use raylet_proto::JobId;
use serde::Deserialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::error::RayJobsError;

/// The longest submission id: it travels in URL paths.
const MAX_SUBMISSION_ID: usize = 128;
/// The scheme of packages uploaded to the head.
const PACKAGE_SCHEME: &str = "gcs://";

/// The request body, as Ray's client sends it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Submission {
    entrypoint: String,
    #[serde(default)]
    submission_id: Option<String>,
    #[serde(default)]
    job_id: Option<String>,
    #[serde(default)]
    runtime_env: Option<Map<String, Value>>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    entrypoint_num_cpus: Option<f64>,
    #[serde(default)]
    entrypoint_num_gpus: Option<f64>,
    #[serde(default)]
    entrypoint_memory: Option<u64>,
    #[serde(default)]
    entrypoint_resources: Option<BTreeMap<String, f64>>,
    #[serde(default)]
    entrypoint_label_selector: Option<BTreeMap<String, String>>,
}

/// A submission raylet can run.
#[derive(Debug)]
pub(crate) struct RayJob {
    pub submission_id: String,
    pub entrypoint: String,
    /// The uploaded package to unpack into the job's directory, by name.
    pub package: Option<String>,
    pub env: BTreeMap<String, String>,
    pub metadata: BTreeMap<String, String>,
    /// What the driver holds, by resource name.
    pub resources: BTreeMap<String, f64>,
}

/// Reads a submission's body; refuses what raylet cannot honour, saying why.
pub(crate) fn read(body: &[u8]) -> Result<RayJob, RayJobsError> {
    let submission: Submission = serde_json::from_slice(body).map_err(RayJobsError::Unreadable)?;
    if submission.job_id.is_some() {
        return Err(unsupported(
            "job_id",
            "it is deprecated: name the job with submission_id",
        ));
    }
    if submission
        .entrypoint_label_selector
        .is_some_and(|selector| !selector.is_empty())
    {
        return Err(unsupported(
            "entrypoint_label_selector",
            "raylet places a job's driver by the resources it asks for only",
        ));
    }
    if submission.entrypoint.trim().is_empty() {
        return Err(RayJobsError::EmptyEntrypoint);
    }
    let submission_id = match submission.submission_id {
        Some(id) => checked_submission_id(id)?,
        None => new_submission_id(),
    };
    let (package, env) = read_runtime_env(submission.runtime_env.unwrap_or_default())?;
    Ok(RayJob {
        submission_id,
        entrypoint: submission.entrypoint,
        package,
        env,
        metadata: submission.metadata.unwrap_or_default(),
        resources: resources(
            submission.entrypoint_num_cpus,
            submission.entrypoint_num_gpus,
            submission.entrypoint_memory,
            submission.entrypoint_resources.unwrap_or_default(),
        ),
    })
}

/// The raylet job that a submission id (or a raylet job id) names.
pub(crate) fn job_id_of(submission_id: &str) -> JobId {
    if let Ok(id) = submission_id.parse() {
        return id;
    }
    let digest = Sha256::new()
        .chain_update(b"ray submission id\0")
        .chain_update(submission_id.as_bytes())
        .finalize();
    JobId::from_wire(&digest[..16]).expect("16 bytes make a job id")
}

fn unsupported(field: &str, why: &'static str) -> RayJobsError {
    RayJobsError::Unsupported {
        field: field.to_string(),
        why,
    }
}

fn checked_submission_id(id: String) -> Result<String, RayJobsError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    if id.is_empty() || id.len() > MAX_SUBMISSION_ID || !id.chars().all(allowed) {
        return Err(RayJobsError::BadSubmissionId {
            id,
            max: MAX_SUBMISSION_ID,
        });
    }
    Ok(id)
}

/// A new submission id in Ray's form: `raysubmit_` and 16 letters and digits.
fn new_submission_id() -> String {
    use rand::Rng;
    use rand::distr::Alphanumeric;
    let suffix: String = rand::rng().sample_iter(Alphanumeric).take(16).map(char::from).collect();
    format!("raysubmit_{suffix}")
}

/// The package to unpack and the driver's environment, from a runtime env.
fn read_runtime_env(
    runtime_env: Map<String, Value>,
) -> Result<(Option<String>, BTreeMap<String, String>), RayJobsError> {
    let (mut package, mut env) = (None, BTreeMap::new());
    for (key, value) in runtime_env {
        match key.as_str() {
            "working_dir" => package = Some(package_of(value)?),
            "env_vars" => env = serde_json::from_value(value).map_err(RayJobsError::BadEnvVars)?,
            // The client applied the excludes; raylet has no setup for
            // `config` to time; `_ray_commit` comes only with pip or conda,
            // which are refused by name.
            "excludes" | "config" | "_ray_commit" => {}
            "pip" | "conda" | "uv" | "py_modules" | "py_executable" | "java_jars" => {
                return Err(unsupported(
                    &format!("runtime_env.{key}"),
                    "a raylet job is a program built beforehand and raylet installs nothing on its nodes: \
                     build what it needs into the program, or ship it in working_dir",
                ));
            }
            "container" | "image_uri" => {
                return Err(unsupported(
                    &format!("runtime_env.{key}"),
                    "raylet runs a job's driver as a process on a node, not in a container",
                ));
            }
            _ => {
                return Err(unsupported(
                    &format!("runtime_env.{key}"),
                    "raylet reads working_dir, env_vars, excludes and config from a runtime_env, nothing else",
                ));
            }
        }
    }
    Ok((package, env))
}

/// The package name of a `working_dir` URI uploaded to this head.
fn package_of(working_dir: Value) -> Result<String, RayJobsError> {
    let Value::String(uri) = working_dir else {
        return Err(RayJobsError::WorkingDirNotText);
    };
    match uri.strip_prefix(PACKAGE_SCHEME) {
        Some(name) => Ok(name.to_string()),
        None => Err(unsupported(
            "runtime_env.working_dir",
            "raylet takes a working directory that the client uploads to the head (a local directory), \
             not one at a remote URI",
        )),
    }
}

/// What the driver holds: Ray's entrypoint resources by raylet's names.
fn resources(
    cpus: Option<f64>,
    gpus: Option<f64>,
    memory: Option<u64>,
    custom: BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    let named = [
        (raylet::resource_names::CPU, cpus),
        (raylet::resource_names::GPU, gpus),
        (raylet::resource_names::MEMORY, memory.map(|bytes| bytes as f64)),
    ];
    let mut resources = custom;
    for (name, amount) in named {
        if let Some(amount) = amount.filter(|amount| *amount > 0.0) {
            resources.insert(name.to_string(), amount);
        }
    }
    resources
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(body: &str) -> String {
        read(body.as_bytes()).unwrap_err().to_string()
    }

    #[test]
    fn a_submission_from_rays_client_reads_into_a_job() {
        let body = r#"{"entrypoint": "./train --epochs 2", "submission_id": "nightly-7",
            "runtime_env": {"working_dir": "gcs://_ray_pkg_0123456789abcdef.zip",
                            "env_vars": {"MODE": "fast"}, "excludes": ["data/"]},
            "metadata": {"team": "ml"}, "entrypoint_num_cpus": 1.0, "entrypoint_memory": 1048576,
            "entrypoint_resources": {"accelerator": 2}}"#;
        let job = read(body.as_bytes()).unwrap();
        assert_eq!(job.submission_id, "nightly-7");
        assert_eq!(job.entrypoint, "./train --epochs 2");
        assert_eq!(job.package.as_deref(), Some("_ray_pkg_0123456789abcdef.zip"));
        assert_eq!(job.env, BTreeMap::from([("MODE".into(), "fast".into())]));
        assert_eq!(job.metadata, BTreeMap::from([("team".into(), "ml".into())]));
        let expected = [("CPU", 1.0), ("accelerator", 2.0), ("memory", 1048576.0)];
        assert_eq!(
            job.resources,
            expected.map(|(name, amount)| (name.to_string(), amount)).into()
        );
    }

    #[test]
    fn a_submission_without_an_id_gets_one_in_rays_form_and_ids_name_jobs_stably() {
        let job = read(br#"{"entrypoint": "true", "runtime_env": {}, "metadata": {}}"#).unwrap();
        let suffix = job.submission_id.strip_prefix("raysubmit_").unwrap();
        assert!(
            suffix.len() == 16 && suffix.chars().all(|c| c.is_ascii_alphanumeric()),
            "{suffix}"
        );
        assert_eq!(job_id_of("nightly-7"), job_id_of("nightly-7"));
        assert_ne!(job_id_of("nightly-7"), job_id_of("nightly-8"));
        let raylet_id = JobId::random();
        assert_eq!(
            job_id_of(&raylet_id.to_string()),
            raylet_id,
            "a raylet job id names itself"
        );
    }

    #[test]
    fn what_raylet_cannot_honour_is_refused_by_name_with_the_reason() {
        for (body, says) in [
            (
                r#"{"entrypoint": "x", "runtime_env": {"pip": {"packages": ["torch"]}, "_ray_commit": "abc"}}"#,
                "raylet cannot honour runtime_env.pip: a raylet job is a program built beforehand",
            ),
            (
                r#"{"entrypoint": "x", "runtime_env": {"image_uri": "repo/image"}}"#,
                "raylet cannot honour runtime_env.image_uri: raylet runs a job's driver as a process",
            ),
            (
                r#"{"entrypoint": "x", "runtime_env": {"my_plugin": {}}}"#,
                "raylet cannot honour runtime_env.my_plugin: raylet reads working_dir, env_vars",
            ),
            (
                r#"{"entrypoint": "x", "runtime_env": {"working_dir": "s3://bucket/dir.zip"}}"#,
                "raylet cannot honour runtime_env.working_dir: raylet takes a working directory",
            ),
            (
                r#"{"entrypoint": "x", "entrypoint_label_selector": {"zone": "a"}}"#,
                "raylet cannot honour entrypoint_label_selector",
            ),
            (
                r#"{"entrypoint": "x", "job_id": "02000000"}"#,
                "raylet cannot honour job_id",
            ),
            (
                r#"{"entrypoint": "x", "priority": 3}"#,
                "unknown field `priority`, expected one of",
            ),
            (r#"{"runtime_env": {}}"#, "missing field `entrypoint`"),
            (r#"{"entrypoint": "  "}"#, "the entrypoint is empty"),
            (
                r#"{"entrypoint": "x", "submission_id": "../../etc"}"#,
                "must be 1 to 128 letters",
            ),
            (
                r#"{"entrypoint": "x", "runtime_env": {"env_vars": {"N": 1}}}"#,
                "runtime_env.env_vars must map names to strings",
            ),
        ] {
            let refused = refusal(body);
            assert!(refused.contains(says), "{body}: {refused}");
        }
    }
}
