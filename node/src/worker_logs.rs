//! The output files of a node's workers, `worker-<id>-<pid>.out|.err`,
//! which workers write themselves (see the worker's log capture) and which
//! rotate by size into `NAME.1`, `NAME.2` (see
//! [`raylet_common::log_rotation`]), and reading them for `raylet logs`:
//! the end of a log across its parts, or what came after a place a
//! follower reached, which a part keeps when it is renamed.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use raylet_common::log_rotation::rotated_path;
use raylet_proto::v1::{LogPosition, ReadWorkerLogRequest, WorkerLog};
use raylet_proto::{Error, Result, WorkerId};

/// What a read returns when the caller sets no bound.
const DEFAULT_BYTES: u64 = 1 << 20;
/// The most a read returns.
const MAX_BYTES: u64 = 16 << 20;

/// The log `request` names in `dir`, read as it asks; `found` is false
/// when no worker of this node matches.
pub(crate) fn read(dir: &Path, request: &ReadWorkerLogRequest) -> Result<WorkerLog> {
    let Some(name) = find(dir, request)? else {
        return Ok(WorkerLog::default());
    };
    let parts = list_parts(&dir.join(&name), request.follow_from.as_ref())?;
    let limit = match request.max_bytes {
        0 => DEFAULT_BYTES,
        bytes => bytes.min(MAX_BYTES),
    };
    let mut log = match &request.follow_from {
        Some(place) => read_after(&parts, place, limit)?,
        None => read_end(&parts, limit)?,
    };
    log.found = true;
    log.file = name;
    log.size = parts.iter().map(|part| part.len).sum();
    Ok(log)
}

/// The name of the current part of the log `request` names.
fn find(dir: &Path, request: &ReadWorkerLogRequest) -> Result<Option<String>> {
    let extension = if request.stderr { ".err" } else { ".out" };
    let matches: Box<dyn Fn(&str) -> bool> = match request.worker_id.is_empty() {
        false => {
            let prefix = raylet_proto::worker_logs::file_prefix(WorkerId::from_wire(&request.worker_id)?);
            Box::new(move |name: &str| name.starts_with(&prefix))
        }
        true if request.pid != 0 => {
            let suffix = format!("-{}{extension}", request.pid);
            Box::new(move |name: &str| name.ends_with(&suffix))
        }
        true => return Err(Error::InvalidArgument("name a worker by its id or its pid".into())),
    };
    let entries = std::fs::read_dir(dir).map_err(|e| io_error(dir, e))?;
    Ok(entries
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .find(|name| matches(name) && name.ends_with(extension)))
}

fn io_error(path: &Path, error: std::io::Error) -> Error {
    Error::Internal(format!("reading {}: {error}", path.display()))
}

/// How often a follower's part is looked for again before it counts as
/// removed: a listing that runs while the log rotates can miss a part
/// being renamed.
const LISTINGS: u32 = 3;

/// The kept parts of the log at `current`; listed again, briefly, while
/// they lack the part `place` is in.
fn list_parts(current: &Path, place: Option<&LogPosition>) -> Result<Vec<Part>> {
    let mut listing = 1;
    loop {
        let parts = Part::list(current).map_err(|e| io_error(current, e))?;
        let lacks_place = place.is_some_and(|place| parts.iter().all(|part| part.file_id != place.file_id));
        if !lacks_place || listing == LISTINGS {
            return Ok(parts);
        }
        listing += 1;
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A part's identity, which renaming keeps: its inode, mixed with its
/// creation time where the file system records one, as a removed part's
/// inode is soon given to a new part.
fn identity(meta: &std::fs::Metadata) -> u64 {
    let created = meta
        .created()
        .ok()
        .and_then(|time| time.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |since| since.as_nanos() as u64);
    meta.ino().wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ created
}

/// One part of a rotating log.
struct Part {
    path: PathBuf,
    /// Its [`identity`].
    file_id: u64,
    len: u64,
}

impl Part {
    /// The kept parts of the log whose current part is `current`, newest
    /// first: `NAME`, then `NAME.1`, `NAME.2`, as the directory lists them
    /// (a part missing for a moment while the log rotates leaves no gap).
    fn list(current: &Path) -> std::io::Result<Vec<Part>> {
        let (Some(dir), Some(name)) = (current.parent(), current.file_name().and_then(|name| name.to_str())) else {
            return Ok(Vec::new());
        };
        let mut numbered = Vec::new();
        for entry in std::fs::read_dir(dir)?.flatten() {
            let file_name = entry.file_name();
            let Some(rest) = file_name.to_str().and_then(|file| file.strip_prefix(name)) else {
                continue;
            };
            let number = match rest {
                "" => 0,
                _ => match rest.strip_prefix('.').and_then(|n| n.parse::<u32>().ok()) {
                    Some(number) => number,
                    None => continue,
                },
            };
            match entry.metadata() {
                Ok(meta) => numbered.push((number, identity(&meta), meta.len())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            }
        }
        numbered.sort_unstable();
        Ok(numbered
            .into_iter()
            .map(|(number, file_id, len)| Part {
                path: rotated_path(current, number),
                file_id,
                len,
            })
            .collect())
    }

    /// `len` bytes from `offset`, if the part is still the file it was.
    fn read(&self, offset: u64, len: u64) -> Result<Option<Vec<u8>>> {
        let io = |e| io_error(&self.path, e);
        let mut file = match File::open(&self.path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(e)),
        };
        if identity(&file.metadata().map_err(io)?) != self.file_id {
            return Ok(None);
        }
        file.seek(SeekFrom::Start(offset)).map_err(io)?;
        let mut data = Vec::new();
        file.take(len).read_to_end(&mut data).map_err(io)?;
        Ok(Some(data))
    }
}

/// The last `limit` bytes of the log, across its parts.
fn read_end(parts: &[Part], limit: u64) -> Result<WorkerLog> {
    let mut pieces = Vec::new();
    let mut left = limit;
    for part in parts {
        let take = part.len.min(left);
        if let Some(piece) = part.read(part.len - take, take)? {
            left -= piece.len() as u64;
            pieces.push(piece);
        }
        if left == 0 {
            break;
        }
    }
    pieces.reverse();
    Ok(WorkerLog {
        data: pieces.concat(),
        end: parts.first().map(|part| LogPosition {
            file_id: part.file_id,
            offset: part.len,
        }),
        ..WorkerLog::default()
    })
}

/// Up to `limit` bytes written after `place`: the rest of its part, or the
/// start of the next newer one once that part is read to its end.
fn read_after(parts: &[Part], place: &LogPosition, limit: u64) -> Result<WorkerLog> {
    // A place past its part's end is in a removed part whose identity a
    // new one took (where creation times are not recorded).
    let found = parts
        .iter()
        .position(|part| part.file_id == place.file_id && place.offset <= part.len);
    let (mut index, mut offset, lines_lost) = match found {
        Some(index) => (index, place.offset, false),
        None => (parts.len().saturating_sub(1), 0, true),
    };
    let Some(mut part) = parts.get(index) else {
        return Ok(WorkerLog {
            end: Some(*place),
            ..WorkerLog::default()
        });
    };
    while offset >= part.len && index > 0 {
        index -= 1;
        part = &parts[index];
        offset = 0;
    }
    let take = part.len.saturating_sub(offset).min(limit);
    let data = part.read(offset, take)?;
    let end = match &data {
        Some(data) => LogPosition {
            file_id: part.file_id,
            offset: offset + data.len() as u64,
        },
        None => *place,
    };
    Ok(WorkerLog {
        data: data.unwrap_or_default(),
        end: Some(end),
        lines_lost,
        ..WorkerLog::default()
    })
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
        assert_eq!(log.end.map(|end| end.offset), Some(8));
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

    #[test]
    fn the_end_spans_the_rotated_parts_and_a_follower_reads_on_across_rotations() {
        use raylet_common::log_rotation::{RotatingFile, RotationSettings};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("worker-w-7.out");
        let settings = RotationSettings {
            max_bytes: 100,
            backup_count: 2,
        };
        let mut log = RotatingFile::open(&path, settings).unwrap();
        let line = |n: u32| format!("line {n:04}\n");
        for n in 0..15 {
            log.append(line(n).as_bytes()).unwrap();
        }
        let request = |follow_from: Option<LogPosition>, max_bytes: u64| ReadWorkerLogRequest {
            pid: 7,
            max_bytes,
            follow_from,
            ..Default::default()
        };
        let end = read(dir.path(), &request(None, 40)).unwrap();
        assert_eq!(
            String::from_utf8(end.data).unwrap(),
            (11..15).map(line).collect::<String>()
        );
        assert_eq!(end.size, 150, "two parts of 100 and 50 bytes");

        let mut place = end.end.unwrap();
        let mut followed = String::new();
        for n in 15..40 {
            log.append(line(n).as_bytes()).unwrap();
            if n % 3 == 0 {
                let next = read(dir.path(), &request(Some(place), 40)).unwrap();
                assert!(!next.lines_lost);
                followed.push_str(std::str::from_utf8(&next.data).unwrap());
                place = next.end.unwrap();
            }
        }
        loop {
            let next = read(dir.path(), &request(Some(place), 25)).unwrap();
            if next.data.is_empty() {
                break;
            }
            followed.push_str(std::str::from_utf8(&next.data).unwrap());
            place = next.end.unwrap();
        }
        assert_eq!(followed, (15..40).map(line).collect::<String>());

        let gone = LogPosition {
            file_id: u64::MAX,
            offset: 3,
        };
        let after_loss = read(dir.path(), &request(Some(gone), 1 << 20)).unwrap();
        assert!(after_loss.lines_lost);
        assert!(after_loss.data.starts_with(b"line "), "starts at the oldest kept part");
    }
}
