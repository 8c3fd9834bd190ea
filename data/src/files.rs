//! Input file sets: a glob, a directory (walked in name order), a list of
//! paths or an object storage prefix, each resolved to a sorted, de-duplicated [`FileList`] with sizes,
//! so that a rerun partitions the same files into the same blocks. The list
//! keeps every name in one buffer, relative to the set's root, so that the
//! driver holds a few bytes per file however many there are.

use std::path::{Component, Path, PathBuf};

use crate::DataError;
use raylet_storage::{self as storage, Storage, StorageOptions};

/// Which files a dataset reads.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub enum FileSet {
    /// Files matching a glob pattern (`data/**/*.pgm`).
    Glob(String),
    /// Every file under a directory, recursively, but for names starting
    /// with `_` or `.` (an output's manifest and error list).
    Dir(PathBuf),
    /// These files.
    List(Vec<PathBuf>),
    /// Every object under an object storage prefix (`s3://bucket/prefix`),
    /// or every file under a `file://` directory, but for names starting
    /// with `_` or `.`.
    Url(String),
}

/// A location as a set: a URL (`s3://…`, `file://…`), a glob pattern, a
/// directory, or one file.
impl From<&str> for FileSet {
    fn from(location: &str) -> Self {
        if storage::is_url(location) {
            FileSet::Url(location.to_string())
        } else if location.contains(['*', '?', '[', '{']) {
            FileSet::Glob(location.to_string())
        } else if Path::new(location).is_dir() {
            FileSet::Dir(location.into())
        } else {
            FileSet::List(vec![location.into()])
        }
    }
}

/// Resolved files: names relative to `root`, sorted, one after another in
/// `names`, with each one's end offset and size.
#[derive(Debug, Default)]
pub(crate) struct FileList {
    root: PathBuf,
    names: String,
    ends: Vec<u32>,
    sizes: Vec<u64>,
}

impl FileList {
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn size(&self, index: usize) -> u64 {
        self.sizes[index]
    }

    /// The name of file `index`, relative to the root.
    pub fn name(&self, index: usize) -> &str {
        let start = match index {
            0 => 0,
            _ => self.ends[index - 1] as usize,
        };
        &self.names[start..self.ends[index] as usize]
    }

    /// The path of file `index`.
    pub fn path(&self, index: usize) -> String {
        self.root.join(self.name(index)).to_string_lossy().into_owned()
    }

    /// A list of these names and sizes, as given.
    #[cfg(test)]
    pub fn of(files: impl IntoIterator<Item = (String, u64)>) -> Self {
        let mut list = FileList::default();
        for (name, size) in files {
            list.push(&name, size);
        }
        list
    }

    /// These files (names relative to `root`, and sizes), sorted: a Delta
    /// table's data files.
    #[cfg(feature = "parquet")]
    pub fn under(root: impl Into<PathBuf>, files: impl IntoIterator<Item = (String, u64)>) -> Self {
        let mut list = FileList {
            root: root.into(),
            ..FileList::default()
        };
        for (name, size) in files {
            list.push(&name, size);
        }
        list.sorted()
    }

    fn push(&mut self, name: &str, size: u64) {
        self.names.push_str(name);
        self.ends.push(self.names.len() as u32);
        self.sizes.push(size);
    }

    /// The same files but those whose names `keep` refuses.
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        let mut kept = FileList {
            root: self.root.clone(),
            ..FileList::default()
        };
        for index in 0..self.len() {
            if keep(self.name(index)) {
                kept.push(self.name(index), self.sizes[index]);
            }
        }
        *self = kept;
    }

    /// The same files sorted by name, each once.
    fn sorted(self) -> FileList {
        let mut order: Vec<usize> = (0..self.len()).collect();
        order.sort_by(|a, b| self.name(*a).cmp(self.name(*b)));
        order.dedup_by(|a, b| self.name(*a) == self.name(*b));
        let mut sorted = FileList {
            root: self.root.clone(),
            ..FileList::default()
        };
        for index in order {
            sorted.push(self.name(index), self.sizes[index]);
        }
        sorted
    }
}

impl FileSet {
    pub fn glob(pattern: &str) -> Self {
        FileSet::Glob(pattern.to_string())
    }

    pub fn dir(path: impl Into<PathBuf>) -> Self {
        FileSet::Dir(path.into())
    }

    pub fn list(paths: impl IntoIterator<Item = impl Into<PathBuf>>) -> Self {
        FileSet::List(paths.into_iter().map(Into::into).collect())
    }

    /// An object storage prefix (`s3://bucket/prefix`) or `file://` directory.
    pub fn url(url: &str) -> Self {
        FileSet::Url(url.to_string())
    }

    /// The files, sorted by path, each with its size in bytes; `storage`
    /// opens a URL's object storage.
    pub(crate) fn resolve(&self, storage: &StorageOptions) -> Result<FileList, DataError> {
        let mut list = FileList::default();
        match self {
            FileSet::Url(url) => {
                let store = Storage::open(url, storage)?;
                list.root = PathBuf::from(store.location_of(""));
                for (name, size) in store.list()? {
                    if !hidden(&name) {
                        list.push(&name, size);
                    }
                }
            }
            FileSet::Glob(pattern) => {
                list.root = literal_prefix(pattern);
                glob_files(pattern, &mut list)?;
            }
            FileSet::Dir(dir) => {
                list.root = dir.clone();
                walk(dir, &mut list)?;
            }
            FileSet::List(paths) => {
                for path in paths {
                    add(&mut list, path)?;
                }
            }
        }
        if list.len() == 0 {
            return Err(DataError::InvalidInput(format!("no files in {self:?}")));
        }
        Ok(list.sorted())
    }
}

/// Adds the file at `path` under its name relative to the list's root.
fn add(list: &mut FileList, path: &Path) -> Result<(), DataError> {
    let metadata = std::fs::metadata(path).map_err(|e| DataError::Read {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let name = path.strip_prefix(&list.root).unwrap_or(path).to_string_lossy();
    list.push(&name, metadata.len());
    Ok(())
}

/// Whether a listed name is left out of a directory's files: a part of it
/// starts with `_` or `.`, as an output's manifest and error list do (the
/// rule of pyarrow's and Ray's dataset discovery).
fn hidden(name: &str) -> bool {
    name.split('/').any(|part| part.starts_with(['_', '.']))
}

/// The directory part of a glob pattern before its first wildcard.
fn literal_prefix(pattern: &str) -> PathBuf {
    let wild = |part: &str| part.contains(['*', '?', '[', '{']);
    Path::new(pattern)
        .components()
        .take_while(|component| !wild(&component.as_os_str().to_string_lossy()))
        .filter(|component| !matches!(component, Component::CurDir))
        .collect()
}

fn glob_files(pattern: &str, list: &mut FileList) -> Result<(), DataError> {
    let entries = glob::glob(pattern).map_err(|e| DataError::InvalidInput(format!("glob `{pattern}`: {e}")))?;
    for entry in entries {
        let path = entry.map_err(|e| DataError::Read {
            path: e.path().to_path_buf(),
            message: e.error().to_string(),
        })?;
        if path.is_file() {
            add(list, &path)?;
        }
    }
    Ok(())
}

fn walk(dir: &Path, list: &mut FileList) -> Result<(), DataError> {
    let entries = std::fs::read_dir(dir).map_err(|e| DataError::Read {
        path: dir.to_path_buf(),
        message: e.to_string(),
    })?;
    for entry in entries {
        let entry = entry.map_err(|e| DataError::io(format!("listing {}", dir.display()), e))?;
        let path = entry.path();
        if hidden(&entry.file_name().to_string_lossy()) {
            continue;
        }
        match entry
            .file_type()
            .map_err(|e| DataError::io(format!("listing {}", dir.display()), e))?
            .is_dir()
        {
            true => walk(&path, list)?,
            false => add(list, &path)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_resolve_to_sorted_unique_files_under_their_root() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["b.txt", "a.txt", "sub/c.txt", "skip.bin"] {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, name).unwrap();
        }
        let names = |list: &FileList| (0..list.len()).map(|i| list.name(i).to_string()).collect::<Vec<_>>();
        let none = StorageOptions::new();
        let all = FileSet::dir(dir.path()).resolve(&none).unwrap();
        assert_eq!(names(&all), ["a.txt", "b.txt", "skip.bin", "sub/c.txt"]);
        assert_eq!(all.path(3), dir.path().join("sub/c.txt").to_string_lossy());
        assert_eq!(all.size(0), 5);
        let globbed = FileSet::glob(&format!("{}/**/*.txt", dir.path().display()))
            .resolve(&none)
            .unwrap();
        assert_eq!(names(&globbed), ["a.txt", "b.txt", "sub/c.txt"]);
        let listed = FileSet::list([
            dir.path().join("b.txt"),
            dir.path().join("a.txt"),
            dir.path().join("b.txt"),
        ])
        .resolve(&none)
        .unwrap();
        assert_eq!(listed.len(), 2, "sorted and de-duplicated");
        assert_eq!(listed.path(0), dir.path().join("a.txt").to_string_lossy());
        let error = FileSet::glob(&format!("{}/*.none", dir.path().display()))
            .resolve(&none)
            .unwrap_err();
        assert!(error.to_string().contains("no files"), "{error}");
    }
}
