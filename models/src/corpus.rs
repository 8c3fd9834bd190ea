//! The Python standard library's `.py` files as a text corpus, with a
//! train/validation split that depends on nothing but each file's path.
//!
//! [`stdlib_dir`] asks `python3` where its standard library is, and
//! [`Corpus::scan`] reads every `.py` file under a directory, in path order.
//! Directories of installed packages (`site-packages`, `dist-packages`),
//! bytecode caches (`__pycache__`) and the standard library's own test
//! suites (`test`, `tests`, `idle_test`: mostly fixtures, and more than half
//! of the bytes) are not read, which leaves about 12 MB of library code from
//! CPython 3.11. Symbolic links are not followed. A file that is not UTF-8
//! is skipped and listed in [`Corpus::skipped`].
//!
//! [`Split::of`] puts a file in the validation split when the XXH3 hash of
//! its relative path falls in the lowest 5% of hashes: the same file is on
//! the same side in every run, on every machine, whatever else the
//! directory holds.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use thiserror::Error;
use xxhash_rust::xxh3::xxh3_64;

/// Directories whose files are not part of the corpus.
const SKIPPED_DIRECTORIES: [&str; 6] = [
    "site-packages",
    "dist-packages",
    "__pycache__",
    "test",
    "tests",
    "idle_test",
];

/// The share of files in the validation split, in percent.
const VALIDATION_PERCENT: u64 = 5;

/// Why the corpus cannot be read.
#[derive(Debug, Error)]
pub enum CorpusError {
    #[error("python3 could not be started to find the standard library: {0}")]
    PythonMissing(#[source] io::Error),
    #[error("python3 could not print its standard library's path: {0}")]
    PythonFailed(String),
    #[error("the corpus directory {path} cannot be read: {source}")]
    Unreadable { path: PathBuf, source: io::Error },
    #[error("the corpus directory {0} is not a directory")]
    NotADirectory(PathBuf),
    #[error("the corpus directory {0} holds no .py file")]
    NoPythonFiles(PathBuf),
}

/// One `.py` file of the corpus.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceFile {
    /// The path under the scanned directory, `/`-separated.
    pub relative_path: String,
    pub text: String,
}

/// Every `.py` file under a directory, in path order.
#[derive(Clone, Debug)]
pub struct Corpus {
    files: Vec<SourceFile>,
    skipped: Vec<String>,
}

/// Which side of the train/validation split a file is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    Train,
    Validation,
}

impl Split {
    /// The side of the file at `relative_path` (`/`-separated, as in
    /// [`SourceFile::relative_path`]).
    pub fn of(relative_path: &str) -> Split {
        if xxh3_64(relative_path.as_bytes()) % 100 < VALIDATION_PERCENT {
            Split::Validation
        } else {
            Split::Train
        }
    }
}

/// The standard library directory of the `python3` on the `PATH`.
pub fn stdlib_dir() -> Result<PathBuf, CorpusError> {
    let output = Command::new("python3")
        .args(["-c", "import sysconfig; print(sysconfig.get_paths()['stdlib'])"])
        .output()
        .map_err(CorpusError::PythonMissing)?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(CorpusError::PythonFailed(format!(
            "{}: {}",
            output.status,
            stderr.trim()
        )));
    }
    let path = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if path.is_empty() {
        return Err(CorpusError::PythonFailed("it printed an empty path".to_owned()));
    }
    Ok(PathBuf::from(path))
}

impl Corpus {
    /// Reads every `.py` file under `dir` (see the [module](self) doc for
    /// what is left out).
    pub fn scan(dir: &Path) -> Result<Corpus, CorpusError> {
        let metadata = std::fs::metadata(dir).map_err(|source| unreadable(dir, source))?;
        if !metadata.is_dir() {
            return Err(CorpusError::NotADirectory(dir.to_owned()));
        }
        let mut paths = Vec::new();
        collect_python_files(dir, &mut paths)?;
        if paths.is_empty() {
            return Err(CorpusError::NoPythonFiles(dir.to_owned()));
        }
        paths.sort();
        let mut corpus = Corpus {
            files: Vec::with_capacity(paths.len()),
            skipped: Vec::new(),
        };
        for path in paths {
            corpus.read(dir, &path)?;
        }
        Ok(corpus)
    }

    /// Every file read, in path order.
    pub fn files(&self) -> &[SourceFile] {
        &self.files
    }

    /// The relative paths of the files that are not UTF-8.
    pub fn skipped(&self) -> &[String] {
        &self.skipped
    }

    /// The texts of the files on `split`'s side, in path order.
    pub fn texts(&self, split: Split) -> impl Iterator<Item = &str> {
        self.files
            .iter()
            .filter(move |file| Split::of(&file.relative_path) == split)
            .map(|file| file.text.as_str())
    }

    /// The texts to train on.
    pub fn train_texts(&self) -> impl Iterator<Item = &str> {
        self.texts(Split::Train)
    }

    /// The texts to measure on.
    pub fn validation_texts(&self) -> impl Iterator<Item = &str> {
        self.texts(Split::Validation)
    }

    /// The bytes of all the files read.
    pub fn total_bytes(&self) -> usize {
        self.files.iter().map(|file| file.text.len()).sum()
    }

    fn read(&mut self, dir: &Path, path: &Path) -> Result<(), CorpusError> {
        let relative_path = relative_path(dir, path);
        let bytes = std::fs::read(path).map_err(|source| unreadable(path, source))?;
        match String::from_utf8(bytes) {
            Ok(text) => self.files.push(SourceFile { relative_path, text }),
            Err(_) => self.skipped.push(relative_path),
        }
        Ok(())
    }
}

/// Adds the `.py` files under `dir` to `paths`, leaving out the
/// [`SKIPPED_DIRECTORIES`] and symbolic links.
fn collect_python_files(dir: &Path, paths: &mut Vec<PathBuf>) -> Result<(), CorpusError> {
    let entries = std::fs::read_dir(dir).map_err(|source| unreadable(dir, source))?;
    for entry in entries {
        let entry = entry.map_err(|source| unreadable(dir, source))?;
        let path = entry.path();
        let file_type = entry.file_type().map_err(|source| unreadable(&path, source))?;
        let name = entry.file_name();
        if file_type.is_dir() && !SKIPPED_DIRECTORIES.iter().any(|skipped| name == *skipped) {
            collect_python_files(&path, paths)?;
        } else if file_type.is_file() && path.extension().is_some_and(|extension| extension == "py") {
            paths.push(path);
        }
    }
    Ok(())
}

/// `path` under `dir`, with `/` between its components on every platform.
fn relative_path(dir: &Path, path: &Path) -> String {
    let relative = path
        .strip_prefix(dir)
        .expect("a scanned path is under the scanned directory");
    relative
        .components()
        .map(|component| component.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

fn unreadable(path: &Path, source: io::Error) -> CorpusError {
    CorpusError::Unreadable {
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, relative_path: &str, contents: &[u8]) {
        let path = root.join(relative_path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, contents).unwrap();
    }

    #[test]
    fn scanning_reads_python_files_and_lists_those_that_are_not_utf8() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "json/decoder.py", b"import re\n");
        write(
            dir.path(),
            "abc.py",
            "\"\"\"Abstract Base Classes \u{2014} PEP 3119\"\"\"\n".as_bytes(),
        );
        write(dir.path(), "latin1.py", b"# -*- coding: latin-1 -*-\nname = '\xe9'\n");
        write(dir.path(), "__pycache__/abc.cpython-311.py", b"cached = True\n");
        write(dir.path(), "site-packages/numpy/core.py", b"installed = True\n");
        write(dir.path(), "test/test_abc.py", b"tested = True\n");
        write(dir.path(), "README.txt", b"not python\n");

        let corpus = Corpus::scan(dir.path()).unwrap();

        let paths: Vec<&str> = corpus.files().iter().map(|file| file.relative_path.as_str()).collect();
        assert_eq!(paths, ["abc.py", "json/decoder.py"]);
        assert_eq!(corpus.files()[1].text, "import re\n");
        assert_eq!(corpus.skipped(), ["latin1.py"]);
        assert_eq!(corpus.total_bytes(), corpus.files()[0].text.len() + "import re\n".len());
    }

    #[test]
    fn a_missing_directory_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-stdlib");
        let error = Corpus::scan(&missing).unwrap_err();
        assert!(matches!(error, CorpusError::Unreadable { .. }), "{error:?}");
        assert!(error.to_string().contains(&missing.display().to_string()), "{error}");
    }

    #[test]
    fn a_directory_without_python_files_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "__pycache__/only_cached.py", b"x = 1\n");
        let error = Corpus::scan(dir.path()).unwrap_err();
        assert!(matches!(error, CorpusError::NoPythonFiles(_)), "{error:?}");
        assert!(error.to_string().contains(&dir.path().display().to_string()), "{error}");
    }

    #[test]
    fn a_file_is_not_a_corpus_directory() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "abc.py", b"x = 1\n");
        let error = Corpus::scan(&dir.path().join("abc.py")).unwrap_err();
        assert!(matches!(error, CorpusError::NotADirectory(_)), "{error:?}");
    }

    #[test]
    fn the_split_of_a_path_is_fixed_by_the_path_alone() {
        // Fixed by XXH3 alone: these sides hold on every machine, in every run.
        let sides = ["abc.py", "difflib.py", "json/decoder.py", "string.py", "typing.py"].map(Split::of);
        assert_eq!(
            sides,
            [
                Split::Train,
                Split::Validation,
                Split::Train,
                Split::Validation,
                Split::Train
            ]
        );
        let validation = (0..2000)
            .filter(|index| Split::of(&format!("module_{index}.py")) == Split::Validation)
            .count();
        assert!(
            (60..140).contains(&validation),
            "{validation} of 2000 paths in validation"
        );
    }

    #[test]
    fn the_real_standard_library_has_both_sides_and_its_stated_size() {
        let corpus = Corpus::scan(&stdlib_dir().unwrap()).unwrap();
        let validation_files = corpus.validation_texts().count();
        let train_files = corpus.train_texts().count();
        assert!(validation_files > 10, "{validation_files} validation files");
        assert!(train_files > 10 * validation_files, "{train_files} train files");
        let megabytes = corpus.total_bytes() as f64 / 1e6;
        assert!((5.0..30.0).contains(&megabytes), "{megabytes} MB");
    }
}
