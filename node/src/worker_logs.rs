//! The output files of a node's workers, `worker-<id>-<pid>.out|.err`,
//! which workers write themselves (see the worker's log capture), and
//! reading their ends for `raylet logs`.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use raylet_proto::v1::{ReadWorkerLogRequest, WorkerLog};
use raylet_proto::{Error, Result, WorkerId};

/// What a read returns when the caller sets no bound.
const DEFAULT_BYTES: u64 = 1 << 20;
/// The most a read returns.
const MAX_BYTES: u64 = 16 << 20;

/// The end of the file `request` names in `dir`; `found` is false when no
/// worker of this node matches.
pub(crate) fn read(dir: &Path, request: &ReadWorkerLogRequest) -> Result<WorkerLog> {
    let extension = if request.stderr { "err" } else { "out" };
    let matches: Box<dyn Fn(&str) -> bool> = match request.worker_id.is_empty() {
        false => {
            let prefix = raylet_proto::worker_logs::file_prefix(WorkerId::from_wire(&request.worker_id)?);
            Box::new(move |name: &str| name.starts_with(&prefix))
        }
        true if request.pid != 0 => {
            let suffix = format!("-{}.{extension}", request.pid);
            Box::new(move |name: &str| name.ends_with(&suffix))
        }
        true => return Err(Error::InvalidArgument("name a worker by its id or its pid".into())),
    };
    let entries = std::fs::read_dir(dir).map_err(|e| Error::Internal(format!("reading {}: {e}", dir.display())))?;
    let found = entries
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .find(|name| matches(name) && name.ends_with(extension));
    let Some(name) = found else {
        return Ok(WorkerLog::default());
    };
    let limit = match request.max_bytes {
        0 => DEFAULT_BYTES,
        bytes => bytes.min(MAX_BYTES),
    };
    let (data, size) = tail(&dir.join(&name), limit)?;
    Ok(WorkerLog {
        found: true,
        data,
        file: name,
        size,
    })
}

/// The last `limit` bytes of the file at `path`, and its size.
fn tail(path: &Path, limit: u64) -> Result<(Vec<u8>, u64)> {
    let io = |e: std::io::Error| Error::Internal(format!("reading {}: {e}", path.display()));
    let mut file = std::fs::File::open(path).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    file.seek(SeekFrom::Start(size.saturating_sub(limit))).map_err(io)?;
    let mut data = Vec::new();
    file.take(limit).read_to_end(&mut data).map_err(io)?;
    Ok((data, size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_is_found_by_id_or_pid_and_only_the_end_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let worker = WorkerId::random();
        std::fs::write(dir.path().join(format!("worker-{worker}-4242.out")), "one\ntwo\n").unwrap();
        std::fs::write(dir.path().join(format!("worker-{worker}-4242.err")), "oops\n").unwrap();
        let by_id = ReadWorkerLogRequest {
            worker_id: worker.as_bytes().to_vec(),
            max_bytes: 4,
            ..Default::default()
        };
        let log = read(dir.path(), &by_id).unwrap();
        assert!(log.found);
        assert_eq!((log.data.as_slice(), log.size), (&b"two\n"[..], 8));
        let by_pid = ReadWorkerLogRequest {
            pid: 4242,
            stderr: true,
            ..Default::default()
        };
        assert_eq!(read(dir.path(), &by_pid).unwrap().data, b"oops\n");
        let missing = ReadWorkerLogRequest {
            pid: 1,
            ..Default::default()
        };
        assert!(!read(dir.path(), &missing).unwrap().found);
        assert!(read(dir.path(), &ReadWorkerLogRequest::default()).is_err());
    }
}
