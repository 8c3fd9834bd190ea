//! Encoded values: their bytes inline or their place in a node's shared
//! object store, their format (postcard for `get`, rkyv for
//! `get_archived`), and the references serialized inside them.

use std::cell::RefCell;
use std::collections::HashSet;
use std::ops::Deref;
use std::sync::{Arc, LazyLock};

use bytes::Bytes;
use raylet_proto::ObjectId;
use raylet_proto::v1;
use serde::Serialize;

use crate::interner::Interner;
use crate::objects::object_ref::handle::{AnyObjectRef, RawRef};
use crate::task_error::TaskError;
use crate::{Error, Result};

/// How a value's bytes are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Postcard,
    Archive,
}

/// Where a large value lives: the object store of the node manager at
/// `node`, and the stores of the nodes that pulled a copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredAt {
    pub node: Arc<str>,
    pub size: u64,
    pub copies: Vec<Arc<str>>,
}

impl StoredAt {
    pub(crate) fn new(node: &str, size: u64) -> Self {
        StoredAt {
            node: node.into(),
            size,
            copies: Vec::new(),
        }
    }

    /// Every node manager whose store holds the object.
    pub(crate) fn holders(&self) -> impl Iterator<Item = &Arc<str>> {
        std::iter::once(&self.node).chain(&self.copies)
    }

    pub(crate) fn from_proto(stored: v1::StoredValue) -> Self {
        StoredAt {
            node: stored.node_address.into(),
            size: stored.size,
            copies: stored.copies.into_iter().map(Arc::from).collect(),
        }
    }

    pub(crate) fn to_proto(&self) -> v1::StoredValue {
        v1::StoredValue {
            node_address: self.node.to_string(),
            size: self.size,
            copies: self.copies.iter().map(|c| c.to_string()).collect(),
        }
    }
}

/// A value's bytes, or where to map them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    Inline(Bytes),
    Stored(StoredAt),
}

/// The name of a value's type: the compiler's own for values made in this
/// process; for values received, one shared copy of each name, so that a
/// million results of one type cost no name each.
#[derive(Clone, Debug)]
pub enum TypeName {
    Local(&'static str),
    Received(Arc<str>),
}

impl TypeName {
    fn received(name: &str) -> Self {
        static NAMES: LazyLock<Interner<str>> = LazyLock::new(Interner::default);
        TypeName::Received(NAMES.intern(name, |name| name.into()))
    }
}

impl Deref for TypeName {
    type Target = str;

    fn deref(&self) -> &str {
        match self {
            TypeName::Local(name) => name,
            TypeName::Received(name) => name,
        }
    }
}

impl PartialEq for TypeName {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

/// No references, shared by the values that contain none.
fn no_references() -> Arc<[AnyObjectRef]> {
    static NONE: LazyLock<Arc<[AnyObjectRef]>> = LazyLock::new(|| Arc::from([]));
    NONE.clone()
}

/// An encoded value with the name of its type, so that getting it as
/// another type is a clear error rather than garbage.
#[derive(Clone, Debug)]
pub struct EncodedValue {
    pub type_name: TypeName,
    pub format: Format,
    pub body: Body,
    /// References serialized inside the value: their objects live at least
    /// as long as this value does.
    pub contained: Arc<[AnyObjectRef]>,
}

impl PartialEq for EncodedValue {
    fn eq(&self, other: &Self) -> bool {
        self.type_name == other.type_name && self.format == other.format && self.body == other.body
    }
}

impl EncodedValue {
    /// Encodes a value inline, keeping the references it contains.
    pub fn encode<T: Serialize>(value: &T) -> Result<Self> {
        let (data, contained) = collecting_refs(|| raylet_common::codec::encode(value));
        Ok(EncodedValue::new::<T>(
            Format::Postcard,
            Body::Inline(data?.into()),
            contained,
        ))
    }

    /// A value of type `T`.
    pub(crate) fn new<T>(format: Format, body: Body, contained: Vec<AnyObjectRef>) -> Self {
        EncodedValue {
            type_name: TypeName::Local(std::any::type_name::<T>()),
            format,
            body,
            contained: match contained.is_empty() {
                true => no_references(),
                false => contained.into(),
            },
        }
    }

    /// Checks that the value is of the expected type and format.
    pub(crate) fn check(&self, object: ObjectId, expected: Expected) -> Result<()> {
        if *self.type_name != *expected.type_name {
            return Err(Error::WrongType {
                object,
                expected: expected.type_name.to_string(),
                actual: self.type_name.to_string(),
            });
        }
        if self.format != expected.format {
            let how = match self.format {
                Format::Postcard => "with serde: read it with get()",
                Format::Archive => "as an rkyv archive: read it with get_archived()",
            };
            return Err(Error::WrongFormat {
                object,
                message: format!("it was stored {how}"),
            });
        }
        Ok(())
    }

    pub(crate) fn from_proto(value: v1::EncodedValue) -> Self {
        let format = match value.format() {
            v1::ValueFormat::Postcard => Format::Postcard,
            v1::ValueFormat::Archive => Format::Archive,
        };
        let body = match value.stored {
            Some(stored) => Body::Stored(StoredAt::from_proto(stored)),
            None => Body::Inline(value.data),
        };
        EncodedValue {
            type_name: TypeName::received(&value.type_name),
            format,
            body,
            contained: no_references(),
        }
    }

    /// The wire form; `with_contained` adds the references inside it.
    pub(crate) fn to_proto(&self, with_contained: bool) -> v1::EncodedValue {
        let (data, stored) = match &self.body {
            Body::Inline(data) => (data.clone(), None),
            Body::Stored(at) => (Bytes::new(), Some(at.to_proto())),
        };
        let format = match self.format {
            Format::Postcard => v1::ValueFormat::Postcard,
            Format::Archive => v1::ValueFormat::Archive,
        };
        let contained = match with_contained {
            true => self.contained.iter().map(|r| r.raw().to_proto()).collect(),
            false => Vec::new(),
        };
        v1::EncodedValue {
            type_name: self.type_name.to_string(),
            data,
            format: format as i32,
            stored,
            contained,
        }
    }
}

/// The type and format a reader asks for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Expected {
    type_name: &'static str,
    format: Format,
}

impl Expected {
    pub(crate) fn of<T>(format: Format) -> Self {
        Expected {
            type_name: std::any::type_name::<T>(),
            format,
        }
    }
}

/// A finished object: its value or why it has none.
pub type Outcome = std::result::Result<EncodedValue, TaskError>;

pub(crate) fn outcome_to_proto(outcome: &Outcome, with_contained: bool) -> v1::ObjectOutcome {
    use v1::object_outcome::Outcome as Proto;
    let outcome = match outcome {
        Ok(value) => Proto::Value(value.to_proto(with_contained)),
        Err(error) => Proto::Failure(error.to_proto()),
    };
    v1::ObjectOutcome { outcome: Some(outcome) }
}

/// The outcome, and the references its value contains as a task result.
pub(crate) fn outcome_from_proto(outcome: v1::ObjectOutcome) -> (Outcome, Vec<RawRef>) {
    use v1::object_outcome::Outcome as Proto;
    match outcome.outcome {
        Some(Proto::Value(mut value)) => {
            let contained = std::mem::take(&mut value.contained)
                .iter()
                .filter_map(|r| RawRef::from_proto(r).ok())
                .collect();
            (Ok(EncodedValue::from_proto(value)), contained)
        }
        Some(Proto::Failure(failure)) => (Err(TaskError::from_proto(failure)), Vec::new()),
        None => (
            Err(TaskError::new(
                crate::TaskErrorKind::Argument,
                "",
                "an empty object outcome",
            )),
            Vec::new(),
        ),
    }
}

thread_local! {
    /// While a value is encoded on this thread: the references serialized so far.
    static SERIALIZED_REFS: RefCell<Option<Vec<AnyObjectRef>>> = const { RefCell::new(None) };
}

/// Runs `encode`, returning the distinct references it serialized.
pub(crate) fn collecting_refs<R>(encode: impl FnOnce() -> R) -> (R, Vec<AnyObjectRef>) {
    let outer = SERIALIZED_REFS.with(|refs| refs.borrow_mut().replace(Vec::new()));
    let result = encode();
    let collected = SERIALIZED_REFS.with(|refs| std::mem::replace(&mut *refs.borrow_mut(), outer));
    let mut seen = HashSet::new();
    let distinct = collected
        .unwrap_or_default()
        .into_iter()
        .filter(|r| seen.insert(r.id()))
        .collect();
    (result, distinct)
}

/// Called when a reference is serialized: an encoding in progress keeps it.
pub(crate) fn note_serialized(object: &AnyObjectRef) {
    SERIALIZED_REFS.with(|refs| {
        if let Some(refs) = refs.borrow_mut().as_mut() {
            refs.push(object.clone());
        }
    });
}
