//! What goes wrong running a command that a provider drives (`ip`,
//! `sbatch`, `squeue`, `scancel`): each way a run fails, naming the
//! command, with what it wrote to stderr when it failed.

use std::process::{ExitStatus, Output};
use std::time::Duration;

/// A command that could not run, did not finish or failed.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("`{command}` cannot be run: {source}")]
    Spawn { command: String, source: std::io::Error },
    #[error("writing to `{command}`: {source}")]
    Stdin { command: String, source: std::io::Error },
    #[error("`{command}` did not finish within {timeout:?}")]
    Timeout { command: String, timeout: Duration },
    #[error("waiting for `{command}`: {source}")]
    Wait { command: String, source: std::io::Error },
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: ExitStatus,
        stderr: String,
    },
}

/// What `command` printed, or how it failed.
pub(crate) fn printed(command: &str, output: Output) -> Result<String, CommandError> {
    if !output.status.success() {
        return Err(CommandError::Failed {
            command: command.to_string(),
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    use super::*;

    #[test]
    fn a_failed_command_says_its_status_and_stderr() {
        let output = |code: i32| Output {
            status: ExitStatus::from_raw(code << 8),
            stdout: b"listed\n".to_vec(),
            stderr: b" no such device \n".to_vec(),
        };
        assert_eq!(printed("ip link", output(0)).ok().as_deref(), Some("listed\n"));
        let error = printed("ip link", output(1)).unwrap_err();
        assert!(matches!(error, CommandError::Failed { .. }), "{error}");
        assert_eq!(error.to_string(), "`ip link` failed (exit status: 1): no such device");
    }
}
