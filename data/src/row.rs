//! `Row`: what a dataset's rows may be.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// What a dataset's rows may be: sent between processes with serde.
pub trait Row: Serialize + DeserializeOwned + Send + 'static {}
impl<T: Serialize + DeserializeOwned + Send + 'static> Row for T {}
