//! A storage's location: a local directory, or a prefix in object storage
//! (`s3://bucket/prefix`) through the `object_store` crate. Local files
//! keep the synced, renamed writes of `atomic_write`; an object is written
//! with one PUT, which a reader sees whole or not at all.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use futures_util::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};

use crate::atomic_write::write_atomically;
use crate::error::StorageError;
use crate::runtime::run;

/// Settings for object storage, such as `aws_endpoint`,
/// `aws_access_key_id`, `aws_secret_access_key`, `aws_region` or
/// `aws_allow_http` (the `object_store` crate's `AmazonS3ConfigKey` names).
/// The process's `AWS_*` variables are read first, on whichever node opens
/// the store; these, carried with the dataset, override them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StorageOptions(Vec<(String, String)>);

impl StorageOptions {
    pub fn new() -> Self {
        StorageOptions::default()
    }

    /// Sets `key` (e.g. `aws_endpoint`) to `value`.
    pub fn with(mut self, key: &str, value: impl Into<String>) -> Self {
        self.0.retain(|(existing, _)| existing != key);
        self.0.push((key.to_string(), value.into()));
        self
    }

    /// The settings set, as keys and values.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(key, value)| (key.as_str(), value.as_str()))
    }
}

/// A place files are read from or written to: a local directory or an
/// object storage prefix.
#[derive(Clone, Debug)]
pub enum Storage {
    Local(PathBuf),
    Remote {
        store: Arc<dyn ObjectStore>,
        prefix: ObjectPath,
        /// The URL the prefix was given as, for messages.
        url: String,
    },
}

/// Whether `location` names object storage (`s3://…`) rather than a local path.
pub fn is_url(location: &str) -> bool {
    location.contains("://")
}

impl Storage {
    /// The storage at `location`: `s3://bucket/prefix`, `file:///dir`, or a local path.
    pub fn open(location: &str, options: &StorageOptions) -> Result<Storage, StorageError> {
        if let Some(path) = location.strip_prefix("file://") {
            return Ok(Storage::Local(PathBuf::from(path)));
        }
        if !is_url(location) {
            return Ok(Storage::Local(PathBuf::from(location)));
        }
        let (scheme, rest) = location.split_once("://").expect("a URL has a scheme");
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if !matches!(scheme, "s3" | "s3a") {
            return Err(StorageError::InvalidLocation(format!(
                "{location}: unknown storage scheme {scheme}:// (s3:// and file:// are known)"
            )));
        }
        let store = s3_store_of(bucket, options).map_err(|e| storage_error(location, e))?;
        Ok(Storage::Remote {
            store,
            prefix: ObjectPath::from(prefix.trim_end_matches('/')),
            url: location.trim_end_matches('/').to_string(),
        })
    }

    /// The location of `name` under this storage, for messages and for
    /// opening it again elsewhere.
    pub fn location_of(&self, name: &str) -> String {
        match self {
            Storage::Local(dir) => dir.join(name).to_string_lossy().into_owned(),
            Storage::Remote { url, .. } => format!("{url}/{name}"),
        }
    }

    /// The storage of folder `name` under this one.
    pub fn child(&self, name: &str) -> Storage {
        match self {
            Storage::Local(dir) => Storage::Local(dir.join(name)),
            Storage::Remote { store, prefix, url } => Storage::Remote {
                store: store.clone(),
                prefix: child(prefix, name),
                url: format!("{url}/{name}"),
            },
        }
    }

    /// Every file under the storage (none where it does not exist), recursively: names relative to it and sizes.
    pub fn list(&self) -> Result<Vec<(String, u64)>, StorageError> {
        match self {
            Storage::Local(dir) => {
                let mut files = Vec::new();
                if dir.exists() {
                    list_local(dir, dir, &mut files)?;
                }
                Ok(files)
            }
            Storage::Remote { store, prefix, url } => {
                let (store, listed) = (store.clone(), prefix.clone());
                let listing = run(async move { store.list(Some(&listed)).try_collect::<Vec<_>>().await })
                    .map_err(|e| storage_error(url, e))?;
                let skip = match prefix.as_ref() {
                    "" => 0,
                    prefix => prefix.len() + 1,
                };
                Ok(listing
                    .into_iter()
                    .map(|object| (object.location.as_ref()[skip..].to_string(), object.size))
                    .collect())
            }
        }
    }

    /// The whole of file `name`.
    pub fn read(&self, name: &str) -> Result<Bytes, StorageError> {
        match self {
            Storage::Local(dir) => {
                let path = dir.join(name);
                std::fs::read(&path).map(Bytes::from).map_err(|e| StorageError::Read {
                    path,
                    message: e.to_string(),
                })
            }
            Storage::Remote { store, prefix, .. } => {
                let (store, path) = (store.clone(), child(prefix, name));
                run(async move { store.get(&path).await?.bytes().await }).map_err(|e| StorageError::Read {
                    path: self.location_of(name).into(),
                    message: e.to_string(),
                })
            }
        }
    }

    /// The first `limit` bytes of file `name` (all of a shorter one).
    pub fn read_head(&self, name: &str, limit: usize) -> Result<Bytes, StorageError> {
        let read_error = |message: String| StorageError::Read {
            path: self.location_of(name).into(),
            message,
        };
        match self {
            Storage::Local(dir) => {
                use std::io::Read;
                let mut head = Vec::new();
                std::fs::File::open(dir.join(name))
                    .and_then(|file| file.take(limit as u64).read_to_end(&mut head))
                    .map_err(|e| read_error(e.to_string()))?;
                Ok(Bytes::from(head))
            }
            Storage::Remote { store, prefix, .. } => {
                let (store, path) = (store.clone(), child(prefix, name));
                run(async move {
                    let size = store.head(&path).await?.size;
                    store.get_range(&path, 0..size.min(limit as u64)).await
                })
                .map_err(|e| read_error(e.to_string()))
            }
        }
    }

    /// File `name`, or `None` where there is none.
    pub fn read_if_present(&self, name: &str) -> Result<Option<Bytes>, StorageError> {
        match self {
            Storage::Local(dir) => match std::fs::read(dir.join(name)) {
                Ok(bytes) => Ok(Some(Bytes::from(bytes))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(StorageError::io(format!("reading {}", dir.join(name).display()), e)),
            },
            Storage::Remote { store, prefix, .. } => {
                let (store, path) = (store.clone(), child(prefix, name));
                match run(async move { store.get(&path).await?.bytes().await }) {
                    Ok(bytes) => Ok(Some(bytes)),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(storage_error(&self.location_of(name), e)),
                }
            }
        }
    }

    /// Writes file `name` whole: a reader sees the old file (or none) or
    /// all of the new one.
    pub fn write(&self, name: &str, bytes: Bytes) -> Result<(), StorageError> {
        match self {
            Storage::Local(dir) => {
                let path = dir.join(name);
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)
                        .map_err(|e| StorageError::io(format!("creating {}", parent.display()), e))?;
                }
                write_atomically(&path, &bytes)
            }
            Storage::Remote { store, prefix, .. } => {
                let (store, path) = (store.clone(), child(prefix, name));
                run(async move { store.put(&path, bytes.into()).await })
                    .map(drop)
                    .map_err(|e| storage_error(&self.location_of(name), e))
            }
        }
    }

    /// Whether file `name` exists.
    pub fn exists(&self, name: &str) -> Result<bool, StorageError> {
        match self {
            Storage::Local(dir) => Ok(dir.join(name).exists()),
            Storage::Remote { store, prefix, .. } => {
                let (store, path) = (store.clone(), child(prefix, name));
                match run(async move { store.head(&path).await }) {
                    Ok(_) => Ok(true),
                    Err(object_store::Error::NotFound { .. }) => Ok(false),
                    Err(e) => Err(storage_error(&self.location_of(name), e)),
                }
            }
        }
    }

    /// Deletes file `name`; nothing there is no error.
    pub fn delete(&self, name: &str) -> Result<(), StorageError> {
        match self {
            Storage::Local(dir) => match std::fs::remove_file(dir.join(name)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(StorageError::io(format!("removing {}", dir.join(name).display()), e))
                }
                _ => Ok(()),
            },
            Storage::Remote { store, prefix, .. } => {
                let (store, path) = (store.clone(), child(prefix, name));
                match run(async move { store.delete(&path).await }) {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                    Err(e) => Err(storage_error(&self.location_of(name), e)),
                }
            }
        }
    }

    /// Deletes every file under folder `name` (and the folder, locally);
    /// nothing there is no error.
    pub fn delete_folder(&self, name: &str) -> Result<(), StorageError> {
        match self {
            Storage::Local(dir) => match std::fs::remove_dir_all(dir.join(name)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(StorageError::io(format!("removing {}", dir.join(name).display()), e))
                }
                _ => Ok(()),
            },
            Storage::Remote { store, prefix, .. } => {
                let folder = self.child(name);
                for (file, _) in folder.list()? {
                    let (store, path) = (store.clone(), child(&child(prefix, name), &file));
                    run(async move { store.delete(&path).await })
                        .map_err(|e| storage_error(&folder.location_of(&file), e))?;
                }
                Ok(())
            }
        }
    }

    /// The object store and path of file `name`, for readers that fetch
    /// ranges of it (`None` for a local file).
    pub fn object(&self, name: &str) -> Option<(Arc<dyn ObjectStore>, ObjectPath)> {
        match self {
            Storage::Local(_) => None,
            Storage::Remote { store, prefix, .. } => Some((store.clone(), child(prefix, name))),
        }
    }
}

/// The storage holding the file at `location` and the file's name in it.
pub fn open_file(location: &str, options: &StorageOptions) -> Result<(Storage, String), StorageError> {
    match is_url(location) && !location.starts_with("file://") {
        true => {
            let (parent, name) = location.rsplit_once('/').expect("a URL has a slash");
            Ok((Storage::open(parent, options)?, name.to_string()))
        }
        false => {
            let path = Path::new(location.strip_prefix("file://").unwrap_or(location));
            let parent = path.parent().map(Path::to_path_buf).unwrap_or_default();
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            Ok((Storage::Local(parent), name))
        }
    }
}

fn child(prefix: &ObjectPath, name: &str) -> ObjectPath {
    match prefix.as_ref() {
        "" => ObjectPath::from(name),
        prefix => ObjectPath::from(format!("{prefix}/{name}")),
    }
}

fn list_local(root: &Path, dir: &Path, files: &mut Vec<(String, u64)>) -> Result<(), StorageError> {
    let read_error = |e: std::io::Error| StorageError::Read {
        path: dir.to_path_buf(),
        message: e.to_string(),
    };
    for entry in std::fs::read_dir(dir).map_err(read_error)? {
        let entry = entry.map_err(read_error)?;
        let path = entry.path();
        match entry.file_type().map_err(read_error)?.is_dir() {
            true => list_local(root, &path, files)?,
            false => {
                let size = entry.metadata().map_err(read_error)?.len();
                let name = path.strip_prefix(root).unwrap_or(&path).to_string_lossy().into_owned();
                files.push((name, size));
            }
        }
    }
    Ok(())
}

fn storage_error(location: &str, error: object_store::Error) -> StorageError {
    let message = match &error {
        object_store::Error::NotFound { .. } => format!("not found: {error}"),
        _ => error.to_string(),
    };
    StorageError::Remote {
        location: location.to_string(),
        message,
    }
}

/// The client of `bucket` with `options`: made once per process and
/// shared, so that a task reading many files of a bucket opens one client
/// (and keeps its connections) instead of one per file.
fn s3_store_of(bucket: &str, options: &StorageOptions) -> Result<Arc<dyn ObjectStore>, object_store::Error> {
    type Clients = HashMap<(String, StorageOptions), Arc<dyn ObjectStore>>;
    static CLIENTS: OnceLock<Mutex<Clients>> = OnceLock::new();
    let key = (bucket.to_string(), options.clone());
    let clients = CLIENTS.get_or_init(Mutex::default);
    if let Some(store) = clients.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Ok(store.clone());
    }
    let store = s3_store(bucket, options)?;
    clients
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, store.clone());
    Ok(store)
}

#[cfg(feature = "s3")]
fn s3_store(bucket: &str, options: &StorageOptions) -> Result<Arc<dyn ObjectStore>, object_store::Error> {
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
    // reqwest is built without a default TLS provider: raylet uses ring.
    let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
    let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
    for (key, value) in &options.0 {
        let key: AmazonS3ConfigKey = key.parse()?;
        builder = builder.with_config(key, value);
    }
    Ok(Arc::new(builder.build()?))
}

#[cfg(not(feature = "s3"))]
fn s3_store(_bucket: &str, _options: &StorageOptions) -> Result<Arc<dyn ObjectStore>, object_store::Error> {
    Err(object_store::Error::NotSupported {
        source: "s3:// needs raylet-data's `s3` feature".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_storage_lists_reads_and_writes_whole_files() {
        let dir = tempfile::tempdir().unwrap();
        let storage = Storage::open(dir.path().to_str().unwrap(), &StorageOptions::new()).unwrap();
        storage.write("a/b.txt", Bytes::from_static(b"hello")).unwrap();
        assert_eq!(storage.list().unwrap(), vec![("a/b.txt".to_string(), 5)]);
        assert_eq!(&storage.read("a/b.txt").unwrap()[..], b"hello");
        assert!(storage.read_if_present("none").unwrap().is_none());
        let error = storage.read("none").unwrap_err().to_string();
        assert!(error.contains("none"), "{error}");
        let error = Storage::open("gs://bucket", &StorageOptions::new())
            .unwrap_err()
            .to_string();
        assert!(error.contains("unknown storage scheme gs://"), "{error}");
    }
}
