//! A job's directory on a node: the job's binary and files fetched from the
//! head (through the node's blob cache) and laid out in it, and the binary
//! checked to be one this machine can run before it is started.

use std::io::Read;
use std::path::{Path, PathBuf};

use raylet_proto::v1::JobSpec;
use raylet_proto::{Error, Result};

use super::blob_fetch::BlobFetch;

/// Fetches the binary and files and places them in `dir`; returns the
/// binary's path there and the cached blob it was placed from, which
/// outlives `dir`.
pub(crate) async fn lay_out(blobs: &BlobFetch, dir: &Path, spec: &JobSpec) -> Result<(PathBuf, PathBuf)> {
    let binary = spec
        .binary
        .as_ref()
        .ok_or_else(|| Error::InvalidArgument("the job names no binary".into()))?;
    let cached = blobs.get(binary).await?;
    let target = dir.join(&spec.binary_name);
    link_binary(&cached, &target)?;
    for file in &spec.files {
        let blob = file
            .blob
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument(format!("the file {} names no blob", file.path)))?;
        let cached = blobs.get(blob).await?;
        place(&cached, &dir.join(&file.path), file.executable)?;
    }
    Ok((target, cached))
}

/// Links the cached binary (executable, and never written) into the job's
/// directory; copies it where a link cannot be made.
fn link_binary(cached: &Path, target: &Path) -> Result<()> {
    let failed = |e: std::io::Error| Error::Internal(format!("placing {}: {e}", target.display()));
    std::fs::create_dir_all(target.parent().unwrap_or(Path::new("."))).map_err(failed)?;
    match std::fs::hard_link(cached, target) {
        Ok(()) => Ok(()),
        Err(_) => place(cached, target, true),
    }
}

/// Copies a cached blob to `target`, making its directories: the job may
/// change its copy without touching the cache.
fn place(cached: &Path, target: &Path, executable: bool) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let failed = |e: std::io::Error| Error::Internal(format!("placing {}: {e}", target.display()));
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(failed)?;
    }
    std::fs::copy(cached, target).map_err(failed)?;
    let mode = if executable { 0o755 } else { 0o644 };
    std::fs::set_permissions(target, std::fs::Permissions::from_mode(mode)).map_err(failed)
}

/// The ELF machine number of this build's architecture.
fn elf_machine() -> Option<u16> {
    match std::env::consts::ARCH {
        "x86_64" => Some(62),
        "aarch64" => Some(183),
        "riscv64" => Some(243),
        _ => None,
    }
}

/// Refuses a binary this machine cannot run, saying why, before trying.
pub(crate) fn check_runnable(binary: &Path) -> Result<()> {
    let mut head = [0u8; 20];
    let read = std::fs::File::open(binary)
        .and_then(|mut file| file.read(&mut head))
        .map_err(|e| Error::Internal(format!("reading {}: {e}", binary.display())))?;
    let head = &head[..read];
    if head.starts_with(b"#!") {
        return Ok(());
    }
    let here = format!("{} Linux", std::env::consts::ARCH);
    if !head.starts_with(b"\x7fELF") || head.len() < 20 {
        return Err(Error::FailedPrecondition(format!(
            "the job's binary is not an executable this node ({here}) can run: it is neither an ELF file nor a script"
        )));
    }
    let machine = u16::from_le_bytes([head[18], head[19]]);
    if head[4] != 2 || Some(machine) != elf_machine() {
        return Err(Error::FailedPrecondition(format!(
            "the job's binary is built for another machine (ELF class {}, machine {machine}); this node is {here}",
            head[4]
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binaries_for_other_machines_and_non_executables_are_refused_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("notes.txt");
        std::fs::write(&text, b"just some text").unwrap();
        let error = check_runnable(&text).unwrap_err().to_string();
        assert!(error.contains("neither an ELF file nor a script"), "{error}");
        let mut foreign = b"\x7fELF\x02\x01\x01\x00".to_vec();
        foreign.resize(18, 0);
        foreign.extend(20u16.to_le_bytes());
        let other = dir.path().join("ppc");
        std::fs::write(&other, &foreign).unwrap();
        let error = check_runnable(&other).unwrap_err().to_string();
        assert!(
            error.contains("built for another machine (ELF class 2, machine 20)"),
            "{error}"
        );
        assert!(check_runnable(&std::env::current_exe().unwrap()).is_ok());
    }
}
