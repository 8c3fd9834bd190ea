//! Log files that rotate by size, as Ray's do: a file that would grow past
//! [`RotationSettings::max_bytes`] is renamed `NAME.1` (an older `NAME.1`
//! becoming `NAME.2`, and so on), the oldest beyond
//! [`RotationSettings::backup_count`] is removed, and writing goes on in a
//! new `NAME`. A log then takes at most `max_bytes * (backup_count + 1)`
//! bytes of disk, plus one line. Workers' output files and the daemons'
//! logs rotate this way; readers find the older parts by their numbers
//! ([`rotated_path`]).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The variable that sets [`RotationSettings::max_bytes`].
pub const MAX_BYTES_VARIABLE: &str = "RAYLET_ROTATION_MAX_BYTES";
/// The variable that sets [`RotationSettings::backup_count`].
pub const BACKUP_COUNT_VARIABLE: &str = "RAYLET_ROTATION_BACKUP_COUNT";
/// Ray's names for the same settings, read when raylet's are not set.
const RAY_VARIABLES: [(&str, &str); 2] = [
    (MAX_BYTES_VARIABLE, "RAY_ROTATION_MAX_BYTES"),
    (BACKUP_COUNT_VARIABLE, "RAY_ROTATION_BACKUP_COUNT"),
];

/// How large a log grows and how many older parts are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RotationSettings {
    /// The size at which a log rotates; 0 never rotates it.
    pub max_bytes: u64,
    /// The older parts kept; with 0, a full log starts over empty.
    pub backup_count: u32,
}

impl Default for RotationSettings {
    /// Ray's defaults: 512 MiB, 5 older parts.
    fn default() -> Self {
        RotationSettings {
            max_bytes: 512 << 20,
            backup_count: 5,
        }
    }
}

/// A rotation setting that is not a number.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{variable}={value:?} is not a whole number (the {what})")]
pub struct BadRotationSetting {
    pub variable: &'static str,
    pub value: String,
    pub what: &'static str,
}

impl RotationSettings {
    /// This process's settings: the defaults, changed by
    /// `RAYLET_ROTATION_MAX_BYTES` and `RAYLET_ROTATION_BACKUP_COUNT` (or
    /// Ray's `RAY_ROTATION_MAX_BYTES` and `RAY_ROTATION_BACKUP_COUNT`).
    pub fn process() -> Result<RotationSettings, BadRotationSetting> {
        static SETTINGS: OnceLock<Result<RotationSettings, BadRotationSetting>> = OnceLock::new();
        SETTINGS
            .get_or_init(|| Self::from_lookup(|name| std::env::var(name).ok()))
            .clone()
    }

    fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<RotationSettings, BadRotationSetting> {
        let defaults = RotationSettings::default();
        let setting = |variable: &'static str, what: &'static str| -> Result<Option<u64>, BadRotationSetting> {
            let ray_name = RAY_VARIABLES
                .iter()
                .find(|(ours, _)| *ours == variable)
                .map(|(_, ray)| *ray);
            let Some((name, value)) = [Some(variable), ray_name]
                .into_iter()
                .flatten()
                .find_map(|name| Some((name, lookup(name)?)))
            else {
                return Ok(None);
            };
            let bad = || BadRotationSetting {
                variable: name,
                value: value.clone(),
                what,
            };
            value.trim().parse::<u64>().map(Some).map_err(|_| bad())
        };
        let max_bytes = setting(MAX_BYTES_VARIABLE, "size at which a log rotates, in bytes")?;
        let backup_count = setting(BACKUP_COUNT_VARIABLE, "older parts of a log kept")?;
        Ok(RotationSettings {
            max_bytes: max_bytes.unwrap_or(defaults.max_bytes),
            backup_count: backup_count.map_or(defaults.backup_count, |count| count.min(u32::MAX as u64) as u32),
        })
    }
}

/// The `n`th older part of the log at `path`: `NAME.n` (`NAME` itself for 0).
pub fn rotated_path(path: &Path, n: u32) -> PathBuf {
    if n == 0 {
        return path.to_path_buf();
    }
    let mut name = path.as_os_str().to_os_string();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

/// A log file that rotates by size; whole lines are written at once, so a
/// line is never split between two parts.
pub struct RotatingFile {
    path: PathBuf,
    file: File,
    size: u64,
    settings: RotationSettings,
}

impl RotatingFile {
    /// Opens the log at `path` to append to it.
    pub fn open(path: &Path, settings: RotationSettings) -> io::Result<RotatingFile> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let size = file.metadata()?.len();
        Ok(RotatingFile {
            path: path.to_path_buf(),
            file,
            size,
            settings,
        })
    }

    /// Appends `bytes` (whole lines), rotating first if they would take
    /// the log past its size.
    pub fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        let max = self.settings.max_bytes;
        if max > 0 && self.size > 0 && self.size + bytes.len() as u64 > max {
            self.rotate()?;
        }
        self.file.write_all(bytes)?;
        self.size += bytes.len() as u64;
        Ok(())
    }

    /// Moves every kept part one number up, dropping the oldest, and starts
    /// an empty log; without kept parts, empties the log.
    fn rotate(&mut self) -> io::Result<()> {
        let kept = self.settings.backup_count;
        if kept == 0 {
            self.file.set_len(0)?;
            self.size = 0;
            return Ok(());
        }
        for n in (1..kept).rev() {
            match std::fs::rename(rotated_path(&self.path, n), rotated_path(&self.path, n + 1)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        std::fs::rename(&self.path, rotated_path(&self.path, 1))?;
        self.file = OpenOptions::new().create(true).append(true).open(&self.path)?;
        self.size = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(from: u32, to: u32) -> String {
        (from..to).map(|n| format!("line {n:05}\n")).collect()
    }

    fn read(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap_or_default()
    }

    #[test]
    fn a_log_past_its_size_keeps_the_newest_parts_within_the_bound_and_never_splits_a_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("head.log");
        let settings = RotationSettings {
            max_bytes: 1000,
            backup_count: 2,
        };
        let mut log = RotatingFile::open(&path, settings).unwrap();
        for n in 0..1000 {
            log.append(lines(n, n + 1).as_bytes()).unwrap();
        }
        let on_disk: u64 = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().metadata().unwrap().len())
            .sum();
        assert!(on_disk <= 3 * 1000, "{on_disk} bytes on disk");
        assert!(!rotated_path(&path, 3).exists());
        let text = format!(
            "{}{}{}",
            read(&rotated_path(&path, 2)),
            read(&rotated_path(&path, 1)),
            read(&path)
        );
        assert!(text.ends_with(&lines(999, 1000)));
        let numbers: Vec<u32> = text.lines().map(|line| line[5..].parse().unwrap()).collect();
        assert!(
            numbers.windows(2).all(|pair| pair[1] == pair[0] + 1),
            "the parts run on"
        );
        assert!(
            numbers.len() >= 2 * (1000 / 11),
            "two full parts kept: {} lines",
            numbers.len()
        );
    }

    #[test]
    fn without_kept_parts_a_full_log_starts_over_and_with_size_zero_it_never_rotates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("worker.out");
        let mut log = RotatingFile::open(
            &path,
            RotationSettings {
                max_bytes: 100,
                backup_count: 0,
            },
        )
        .unwrap();
        log.append(lines(0, 8).as_bytes()).unwrap();
        log.append(lines(8, 10).as_bytes()).unwrap();
        assert_eq!(read(&path), lines(8, 10));
        assert!(!rotated_path(&path, 1).exists());

        let unbounded = dir.path().join("unbounded.out");
        let mut log = RotatingFile::open(
            &unbounded,
            RotationSettings {
                max_bytes: 0,
                backup_count: 3,
            },
        )
        .unwrap();
        log.append(lines(0, 100).as_bytes()).unwrap();
        log.append(lines(100, 200).as_bytes()).unwrap();
        assert_eq!(read(&unbounded), lines(0, 200));
    }

    #[test]
    fn settings_come_from_raylets_variables_then_rays_and_a_bad_one_is_named() {
        let lookup = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string())
        };
        assert_eq!(
            RotationSettings::from_lookup(lookup(&[])).unwrap(),
            RotationSettings::default()
        );
        let settings = RotationSettings::from_lookup(lookup(&[
            ("RAY_ROTATION_MAX_BYTES", "4096"),
            ("RAYLET_ROTATION_BACKUP_COUNT", "1"),
            ("RAY_ROTATION_BACKUP_COUNT", "9"),
        ]))
        .unwrap();
        assert_eq!(
            settings,
            RotationSettings {
                max_bytes: 4096,
                backup_count: 1
            }
        );
        let bad = RotationSettings::from_lookup(lookup(&[("RAYLET_ROTATION_MAX_BYTES", "1GB")])).unwrap_err();
        assert_eq!(
            bad.to_string(),
            "RAYLET_ROTATION_MAX_BYTES=\"1GB\" is not a whole number (the size at which a log rotates, in bytes)"
        );
    }
}
