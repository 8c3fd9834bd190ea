//! The last lines a node wrote (its log, its job's output), which a failed
//! instance's reason quotes so that the reason says what went wrong.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// How many of the last non-empty lines are quoted.
const TAIL_LINES: usize = 5;
/// How much of the end of the file is read to find them.
const TAIL_BYTES: u64 = 16 * 1024;

/// The last non-empty lines of the file at `path`, on one line joined by
/// ` | `; if it cannot be read, a sentence that says why.
pub(crate) fn output_tail(path: &Path) -> String {
    match read_end(path) {
        Ok(text) => last_lines(&text),
        Err(e) => format!("({} cannot be read: {e})", path.display()),
    }
}

fn read_end(path: &Path) -> std::io::Result<String> {
    let mut file = File::open(path)?;
    let length = file.metadata()?.len();
    file.seek(SeekFrom::Start(length.saturating_sub(TAIL_BYTES)))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

fn last_lines(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim_end)
        .filter(|line| !line.trim().is_empty())
        .collect();
    lines[lines.len().saturating_sub(TAIL_LINES)..].join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_the_last_non_empty_lines_on_one_line() {
        let text = "one\n\ntwo\nthree\nfour\n  \nfive\nsix\n\n";
        assert_eq!(last_lines(text), "two | three | four | five | six");
        assert_eq!(last_lines(""), "");
    }

    #[test]
    fn says_why_a_file_cannot_be_read() {
        let tail = output_tail(Path::new("/nonexistent/out.log"));
        assert!(tail.contains("/nonexistent/out.log cannot be read"), "{tail}");
    }
}
