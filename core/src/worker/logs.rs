//! Forwards a worker's stdout and stderr to the owner of the running task,
//! line by line, tagged with the function's name. Before any task ran, lines
//! go where the process's output went.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::OwnedFd;
use std::sync::Mutex;

use raylet_proto::v1::{LogLine, WorkerEvents};

use super::executor::ResultSender;

struct Sink {
    function: String,
    results: ResultSender,
}

static SINK: Mutex<Option<Sink>> = Mutex::new(None);

/// Sends the lines that follow to `results`, tagged with `function`.
pub(crate) fn attach(function: &str, results: ResultSender) {
    let mut sink = SINK.lock().unwrap_or_else(|p| p.into_inner());
    *sink = Some(Sink {
        function: function.to_string(),
        results,
    });
}

/// Replaces fds 1 and 2 with pipes read by two forwarding threads.
pub(crate) fn capture() -> std::io::Result<()> {
    for stderr in [false, true] {
        let original = match stderr {
            false => nix::unistd::dup(std::io::stdout())?,
            true => nix::unistd::dup(std::io::stderr())?,
        };
        let (reader, writer) = nix::unistd::pipe()?;
        match stderr {
            false => nix::unistd::dup2_stdout(&writer)?,
            true => nix::unistd::dup2_stderr(&writer)?,
        }
        std::thread::Builder::new()
            .name("raylet-log-forwarder".into())
            .spawn(move || forward(reader, original, stderr))?;
    }
    Ok(())
}

fn forward(reader: OwnedFd, original: OwnedFd, stderr: bool) {
    let mut fallback = std::fs::File::from(original);
    for line in BufReader::new(std::fs::File::from(reader)).lines() {
        let Ok(line) = line else {
            return;
        };
        let sink = SINK.lock().unwrap_or_else(|p| p.into_inner());
        let sent = sink.as_ref().is_some_and(|sink| {
            let log = LogLine {
                function: sink.function.clone(),
                stderr,
                line: line.clone(),
            };
            sink.results
                .send(&WorkerEvents {
                    results: Vec::new(),
                    logs: vec![log],
                })
                .is_ok()
        });
        drop(sink);
        if !sent {
            let _ = writeln!(fallback, "{line}");
        }
    }
}
