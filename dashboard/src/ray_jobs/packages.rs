//! working_dir packages: the zip archives Ray's client uploads
//! (`PUT /api/packages/gcs/_ray_pkg_<hash>.zip`) before it submits a job
//! that names them. Each is checked to unpack safely (no path out of its
//! folder, no links, bounded in entries and bytes) and kept in a folder of
//! the dashboard's until the head stops, the least recently asked for
//! dropped once they hold more than [`KEPT_BYTES`]. Uploads in progress
//! are written beside it, in [`INCOMING`], so that dropping kept packages
//! never removes one. A submission unpacks its package into a scratch
//! folder whose files ship with the job.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::io::AsyncWriteExt;
use tokio_stream::StreamExt;

use super::super::Head;
use super::error::RayJobsError;

/// The largest package this head takes: within the quarter of the HTTP
/// body budget that one client may hold (see `raylet_common::http_listener`).
pub(crate) const MAX_PACKAGE_BYTES: u64 = 60 << 20;
/// How many bytes of packages the head keeps.
const KEPT_BYTES: u64 = 1 << 30;
/// The most a package may unpack to.
const MAX_UNPACKED_BYTES: u64 = 1 << 30;
/// The most entries a package may have (a job ships at most 100,000 files).
const MAX_ENTRIES: usize = 100_000;
/// The only scheme of uploaded packages, in Ray's URL form.
const PROTOCOL: &str = "gcs";
/// The subfolder of uploads still arriving or being checked.
const INCOMING: &str = "incoming";

/// The folder of uploaded packages.
#[derive(Clone)]
pub(crate) struct Packages {
    dir: Arc<tempfile::TempDir>,
}

impl Packages {
    pub(crate) fn new() -> std::io::Result<Packages> {
        let dir = tempfile::Builder::new().prefix("raylet-packages-").tempdir()?;
        std::fs::create_dir(dir.path().join(INCOMING))?;
        Ok(Packages { dir: Arc::new(dir) })
    }

    /// A file for an upload to arrive in, removed unless it is kept.
    fn incoming(&self) -> std::io::Result<tempfile::NamedTempFile> {
        tempfile::NamedTempFile::new_in(self.dir.path().join(INCOMING))
    }

    /// Where the package `name` is kept; refuses a name Ray's client would
    /// not make.
    fn path(&self, name: &str) -> Result<PathBuf, RayJobsError> {
        let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
        if name.starts_with('.') || !name.chars().all(allowed) || name.len() > 255 {
            return Err(RayJobsError::BadPackageName { name: name.to_string() });
        }
        if !name.ends_with(".zip") {
            return Err(RayJobsError::Unsupported {
                field: format!("the package {name}"),
                why: "raylet unpacks zip packages only: give working_dir as a directory or a .zip file",
            });
        }
        Ok(self.dir.path().join(name))
    }

    /// The package `name` if this head has it; marks it as just used.
    pub(crate) fn find(&self, name: &str) -> Result<Option<PathBuf>, RayJobsError> {
        let path = self.path(name)?;
        match File::options().append(true).open(&path) {
            Ok(file) => {
                let _ = file.set_modified(SystemTime::now());
                Ok(Some(path))
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(RayJobsError::io(format!("opening the package {name}"))(error)),
        }
    }

    /// Keeps at most `kept_bytes` of packages, dropping the least
    /// recently used first, but never `newest`.
    fn drop_oldest(&self, newest: &Path, kept_bytes: u64) -> std::io::Result<()> {
        let mut kept = Vec::new();
        for entry in std::fs::read_dir(self.dir.path())? {
            let entry = entry?;
            let metadata = entry.metadata()?;
            if metadata.is_file() && entry.path() != newest {
                kept.push((metadata.modified()?, metadata.len(), entry.path()));
            }
        }
        let mut total: u64 = std::fs::metadata(newest)?.len() + kept.iter().map(|(_, len, _)| len).sum::<u64>();
        kept.sort();
        for (_, len, path) in kept {
            if total <= kept_bytes {
                break;
            }
            std::fs::remove_file(&path)?;
            total -= len;
        }
        Ok(())
    }
}

/// `GET /api/packages/{protocol}/{name}`: 200 when the head has the
/// package, 404 when the client should upload it.
pub(crate) async fn exists(
    State(head): State<Head>,
    UrlPath((protocol, name)): UrlPath<(String, String)>,
) -> Result<Response, RayJobsError> {
    check_protocol(&protocol)?;
    Ok(match head.packages.find(&name)? {
        Some(_) => StatusCode::OK.into_response(),
        None => (StatusCode::NOT_FOUND, format!("this head has no package {name}")).into_response(),
    })
}

/// `PUT /api/packages/{protocol}/{name}`: the package's bytes, kept once
/// they are all in and unpack safely.
pub(crate) async fn upload(
    State(head): State<Head>,
    UrlPath((protocol, name)): UrlPath<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<StatusCode, RayJobsError> {
    check_protocol(&protocol)?;
    let path = head.packages.path(&name)?;
    let announced = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
    if announced.is_some_and(|bytes| bytes > MAX_PACKAGE_BYTES) {
        return Err(too_large());
    }
    let partial = head
        .packages
        .incoming()
        .map_err(RayJobsError::io("creating a file for the package"))?;
    receive(body, partial.reopen().map_err(RayJobsError::io("opening the package"))?).await?;
    let packages = head.packages.clone();
    let kept = tokio::task::spawn_blocking(move || {
        check_archive(partial.path(), &name)?;
        let kept = partial
            .persist(&path)
            .map_err(|e| RayJobsError::io("keeping the package")(e.error))?;
        drop(kept);
        packages
            .drop_oldest(&path, KEPT_BYTES)
            .map_err(RayJobsError::io("dropping the oldest packages"))
    });
    kept.await
        .map_err(|e| RayJobsError::io("checking the package")(std::io::Error::other(e)))??;
    Ok(StatusCode::OK)
}

fn check_protocol(protocol: &str) -> Result<(), RayJobsError> {
    match protocol == PROTOCOL {
        true => Ok(()),
        false => Err(RayJobsError::Unsupported {
            field: format!("packages under {protocol}://"),
            why: "the head keeps the packages its clients upload, under gcs://",
        }),
    }
}

fn too_large() -> RayJobsError {
    RayJobsError::PackageTooLarge {
        limit: MAX_PACKAGE_BYTES >> 20,
    }
}

/// Writes the body into `file`, refusing more than [`MAX_PACKAGE_BYTES`].
async fn receive(body: Body, file: File) -> Result<(), RayJobsError> {
    let mut file = tokio::fs::File::from_std(file);
    let mut chunks = body.into_data_stream();
    let mut received = 0u64;
    while let Some(chunk) = chunks.next().await {
        let chunk: Bytes = chunk.map_err(RayJobsError::Incomplete)?;
        received += chunk.len() as u64;
        if received > MAX_PACKAGE_BYTES {
            return Err(too_large());
        }
        file.write_all(&chunk)
            .await
            .map_err(RayJobsError::io("writing the package"))?;
    }
    file.flush().await.map_err(RayJobsError::io("writing the package"))
}

fn bad_package(name: &str, why: impl std::fmt::Display) -> RayJobsError {
    RayJobsError::BadPackage {
        name: name.to_string(),
        why: why.to_string(),
    }
}

/// Checks that the archive at `path` unpacks inside its folder, without
/// links, within [`MAX_ENTRIES`] and [`MAX_UNPACKED_BYTES`] as it says.
fn check_archive(path: &Path, name: &str) -> Result<(), RayJobsError> {
    let file = File::open(path).map_err(RayJobsError::io("opening the package"))?;
    let mut archive = zip::ZipArchive::new(file).map_err(|e| bad_package(name, e))?;
    if archive.len() > MAX_ENTRIES {
        let why = format!("it has {} entries, over the limit of {MAX_ENTRIES}", archive.len());
        return Err(bad_package(name, why));
    }
    let mut unpacked = 0u64;
    for index in 0..archive.len() {
        let entry = archive.by_index_raw(index).map_err(|e| bad_package(name, e))?;
        if entry.enclosed_name().is_none() {
            return Err(bad_package(
                name,
                format!("{:?} leads out of its folder", entry.name().unwrap_or_default()),
            ));
        }
        if entry.is_symlink() {
            return Err(bad_package(
                name,
                format!("{:?} is a link", entry.name().unwrap_or_default()),
            ));
        }
        unpacked += entry.size();
        if unpacked > MAX_UNPACKED_BYTES {
            let why = format!("it unpacks to over {} MiB", MAX_UNPACKED_BYTES >> 20);
            return Err(bad_package(name, why));
        }
    }
    Ok(())
}

/// Unpacks the package at `path` into `into`, each file executable when
/// the archive says so; holds to the limits [`check_archive`] checked
/// even where the archive's sizes lie.
pub(crate) fn unpack(path: &Path, into: &Path) -> Result<(), RayJobsError> {
    let name = path
        .file_name()
        .map_or_else(String::new, |name| name.to_string_lossy().into_owned());
    let file = File::open(path).map_err(RayJobsError::io("opening the package"))?;
    let mut archive = zip::ZipArchive::new(file).map_err(|e| bad_package(&name, e))?;
    let mut budget = MAX_UNPACKED_BYTES;
    for index in 0..archive.len() {
        let mut entry = archive.by_index(index).map_err(|e| bad_package(&name, e))?;
        let relative = entry.enclosed_name().ok_or_else(|| {
            bad_package(
                &name,
                format!("{:?} leads out of its folder", entry.name().unwrap_or_default()),
            )
        })?;
        let target = into.join(relative);
        let failed = RayJobsError::io(format!("unpacking {}", target.display()));
        if entry.is_dir() {
            std::fs::create_dir_all(&target).map_err(failed)?;
            continue;
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(RayJobsError::io(format!("creating {}", parent.display())))?;
        }
        let mut out = File::create(&target).map_err(failed)?;
        let copied = std::io::copy(&mut (&mut entry).take(budget + 1), &mut out)
            .map_err(|e| bad_package(&name, format!("{}: {e}", target.display())))?;
        if copied > budget {
            let why = format!("it unpacks to over {} MiB", MAX_UNPACKED_BYTES >> 20);
            return Err(bad_package(&name, why));
        }
        budget -= copied;
        out.flush()
            .map_err(RayJobsError::io(format!("writing {}", target.display())))?;
        if entry.unix_mode().is_some_and(|mode| mode & 0o111 != 0) {
            use std::os::unix::fs::PermissionsExt;
            let executable = std::fs::Permissions::from_mode(0o755);
            std::fs::set_permissions(&target, executable)
                .map_err(RayJobsError::io(format!("making {} executable", target.display())))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use zip::write::SimpleFileOptions;

    /// A zip archive of `entries` (name, bytes, unix mode).
    fn archive(dir: &Path, entries: &[(&str, &[u8], u32)]) -> PathBuf {
        let path = dir.join("package.zip");
        let mut writer = zip::ZipWriter::new(File::create(&path).unwrap());
        for (name, bytes, mode) in entries {
            let options = SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Deflated)
                .unix_permissions(*mode);
            writer.start_file(*name, options).unwrap();
            writer.write_all(bytes).unwrap();
        }
        writer.finish().unwrap();
        path
    }

    #[test]
    fn a_package_unpacks_with_its_folders_and_executable_files() {
        let dir = tempfile::tempdir().unwrap();
        let package = archive(
            dir.path(),
            &[
                ("run.sh", b"#!/bin/sh\necho hi\n", 0o755),
                ("data/rows.csv", b"a,b\n1,2\n", 0o644),
            ],
        );
        check_archive(&package, "package.zip").unwrap();
        let into = dir.path().join("job");
        unpack(&package, &into).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = |path: &str| std::fs::metadata(into.join(path)).unwrap().permissions().mode() & 0o777;
        assert_eq!(std::fs::read(into.join("data/rows.csv")).unwrap(), b"a,b\n1,2\n");
        assert_eq!(mode("run.sh"), 0o755);
        assert_eq!(mode("data/rows.csv") & 0o111, 0);
    }

    #[test]
    fn a_package_that_leads_out_of_its_folder_or_is_no_zip_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let climbing = archive(dir.path(), &[("../escaped", b"x", 0o644)]);
        let refused = check_archive(&climbing, "climbing.zip").unwrap_err().to_string();
        assert!(refused.contains("\"../escaped\" leads out of its folder"), "{refused}");
        let text = dir.path().join("text.zip");
        std::fs::write(&text, b"not an archive").unwrap();
        let refused = check_archive(&text, "text.zip").unwrap_err().to_string();
        assert!(
            refused.contains("text.zip is not a zip archive raylet can unpack"),
            "{refused}"
        );
    }

    #[test]
    fn dropping_the_oldest_packages_keeps_the_newest_and_every_upload_still_arriving() {
        let packages = Packages::new().unwrap();
        let old = packages.path("_ray_pkg_old.zip").unwrap();
        std::fs::write(&old, [0; 100]).unwrap();
        let mut arriving = packages.incoming().unwrap();
        arriving.write_all(&[0; 100]).unwrap();
        let newest = packages.path("_ray_pkg_new.zip").unwrap();
        std::fs::write(&newest, [0; 100]).unwrap();
        packages.drop_oldest(&newest, 100).unwrap();
        assert!(!old.exists(), "the least recently used package is dropped");
        assert!(
            newest.exists() && arriving.path().exists(),
            "the newest and the upload arriving stay"
        );
    }

    #[test]
    fn package_names_are_refused_unless_ray_would_make_them() {
        let packages = Packages::new().unwrap();
        assert!(packages.path("_ray_pkg_0123456789abcdef.zip").is_ok());
        for name in ["../x.zip", ".hidden.zip", "a/b.zip", "dir.tar.gz"] {
            assert!(packages.path(name).is_err(), "{name}");
        }
    }
}
