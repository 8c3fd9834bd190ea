//! A raylet job as Ray's job API describes it (Ray's `JobDetails`): the
//! fields Ray's client reads, with Ray's names, units and statuses.

use std::collections::BTreeMap;

use raylet::{JobInfo, JobStatus};
use serde::Serialize;

use super::ENTRYPOINT_SCRIPT;

/// One job, as `GET /api/jobs/` lists it and `GET /api/jobs/{id}` returns it.
#[derive(Serialize)]
pub(crate) struct JobDetails {
    /// Every raylet job is submitted, never a bare driver.
    #[serde(rename = "type")]
    kind: &'static str,
    job_id: String,
    submission_id: String,
    status: String,
    entrypoint: String,
    message: String,
    error_type: Option<&'static str>,
    /// Unix milliseconds, as Ray's.
    start_time: u64,
    end_time: Option<u64>,
    metadata: BTreeMap<String, String>,
    driver_node_id: Option<String>,
    driver_exit_code: Option<i32>,
}

impl JobDetails {
    pub(crate) fn of(info: JobInfo) -> JobDetails {
        let (submission_id, entrypoint) = match ray_entrypoint(&info) {
            Some(entrypoint) => (info.name.clone(), entrypoint.to_string()),
            None => (info.id.to_string(), shell_words(&info.entrypoint)),
        };
        JobDetails {
            kind: "SUBMISSION",
            job_id: info.id.to_string(),
            submission_id,
            status: info.status.to_string(),
            entrypoint,
            error_type: error_type(&info),
            message: info.message,
            start_time: info.submitted_unix_ms,
            end_time: info.ended_unix_ms,
            metadata: info.metadata,
            driver_node_id: info.node.map(|node| node.to_string()),
            driver_exit_code: info.exit_code,
        }
    }
}

/// The shell command of a job submitted through Ray's API, which runs it
/// as the argument of its entrypoint script.
fn ray_entrypoint(info: &JobInfo) -> Option<&str> {
    match info.entrypoint.as_slice() {
        [script, command] if script == ENTRYPOINT_SCRIPT => Some(command),
        _ => None,
    }
}

/// Ray's name for why a job failed.
fn error_type(info: &JobInfo) -> Option<&'static str> {
    match (info.status, info.exit_code.or(info.signal)) {
        (JobStatus::Failed, Some(_)) => Some("JOB_ENTRYPOINT_COMMAND_ERROR"),
        (JobStatus::Failed, None) => Some("JOB_ENTRYPOINT_COMMAND_START_ERROR"),
        _ => None,
    }
}

/// A raylet job's binary and arguments as one shell command line.
fn shell_words(words: &[String]) -> String {
    let quoted = words.iter().map(|word| {
        let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c);
        match !word.is_empty() && word.chars().all(plain) {
            true => word.clone(),
            false => format!("'{}'", word.replace('\'', r"'\''")),
        }
    });
    quoted.collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raylet_jobs_words_quote_as_the_shell_reads_them() {
        let words = ["./train", "--name", "it's here", ""].map(String::from);
        assert_eq!(shell_words(&words), r"./train --name 'it'\''s here' ''");
    }
}
