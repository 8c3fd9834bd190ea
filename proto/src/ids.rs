//! Cluster-wide identifiers: random 16-byte ids shown as hex.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::str::FromStr;

use crate::{Error, Result};

/// Defines a 16-byte random id type with hex display and wire conversions.
macro_rules! define_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
        pub struct $name([u8; 16]);

        /// Hashes the first 8 bytes, which are random already.
        impl Hash for $name {
            fn hash<H: Hasher>(&self, state: &mut H) {
                let mut first = [0u8; 8];
                first.copy_from_slice(&self.0[..8]);
                state.write_u64(u64::from_le_bytes(first));
            }
        }

        impl $name {
            /// A new random id.
            pub fn random() -> Self {
                Self(rand::random())
            }

            /// The raw bytes, as sent on the wire.
            pub fn as_bytes(&self) -> &[u8; 16] {
                &self.0
            }

            /// Parses the wire form; any length other than 16 is an error.
            pub fn from_wire(bytes: &[u8]) -> Result<Self> {
                let array: [u8; 16] = bytes.try_into().map_err(|_| {
                    Error::InvalidArgument(format!(
                        concat!(stringify!($name), " must be 16 bytes, got {}"),
                        bytes.len()
                    ))
                })?;
                Ok(Self(array))
            }

            /// The first 8 hex digits, as shown in tables.
            pub fn short(&self) -> String {
                self.to_string()[..8].to_string()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                for byte in self.0 {
                    write!(f, "{byte:02x}")?;
                }
                Ok(())
            }
        }

        /// Serialized as its hex form, as shown everywhere else.
        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        /// Read from its hex form.
        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
                let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "({})"), self)
            }
        }

        impl FromStr for $name {
            type Err = Error;

            fn from_str(text: &str) -> Result<Self> {
                let invalid = || {
                    Error::InvalidArgument(format!(
                        concat!("'{}' is not a ", stringify!($name), ": expected 32 hex digits"),
                        text
                    ))
                };
                if text.len() != 32 || !text.is_ascii() {
                    return Err(invalid());
                }
                let mut bytes = [0u8; 16];
                for (i, byte) in bytes.iter_mut().enumerate() {
                    *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| invalid())?;
                }
                Ok(Self(bytes))
            }
        }
    };
}

/// A hasher for maps keyed by ids: an id hashes to 8 of its random bytes,
/// which need no further mixing.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, word: u64) {
        self.0 = self.0.rotate_left(29) ^ word;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map keyed by ids, hashed with [`IdHasher`].
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;
/// A set of ids, hashed with [`IdHasher`].
pub type IdSet<K> = HashSet<K, BuildHasherDefault<IdHasher>>;

define_id!(
    /// Identifies a node manager for its whole life; each registration of it
    /// gets a new incarnation number.
    NodeId,
    "NodeId"
);

define_id!(
    /// Identifies one task submission; its retries keep the id.
    TaskId,
    "TaskId"
);

define_id!(
    /// Identifies an object: a task's return value or a `put` value.
    ObjectId,
    "ObjectId"
);

impl TaskId {
    /// The object that holds the task's return value: it shares the task's
    /// bytes, so a result can be stored without a lookup.
    pub fn return_object(&self) -> ObjectId {
        ObjectId(self.0)
    }

    /// The task's object `index`: its return `index` when it returns
    /// several, its item `index - 1` when it is a generator. Object 0 is
    /// [`TaskId::return_object`]; the others differ from it in the first 8
    /// bytes, which spread them over hash tables and shards as random ids.
    pub fn object_at(&self, index: u64) -> ObjectId {
        let mut bytes = self.0;
        let mut first = [0u8; 8];
        first.copy_from_slice(&bytes[..8]);
        let mixed = u64::from_le_bytes(first) ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        bytes[..8].copy_from_slice(&mixed.to_le_bytes());
        ObjectId(bytes)
    }
}

define_id!(
    /// Identifies an actor for its whole life, across restarts.
    ActorId,
    "ActorId"
);

define_id!(
    /// Identifies a placement group.
    PlacementGroupId,
    "PlacementGroupId"
);

define_id!(
    /// Identifies a submitted job.
    JobId,
    "JobId"
);

define_id!(
    /// Identifies a worker process.
    WorkerId,
    "WorkerId"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_objects_are_distinct_and_object_zero_is_the_return_object() {
        let task = TaskId::random();
        assert_eq!(task.object_at(0), task.return_object());
        let ids: IdSet<ObjectId> = (0..10_000).map(|index| task.object_at(index)).collect();
        assert_eq!(ids.len(), 10_000);
        let shards: HashSet<u8> = (1..64).map(|index| task.object_at(index).as_bytes()[0]).collect();
        assert!(shards.len() > 16, "the first byte spreads: {shards:?}");
    }

    #[test]
    fn node_id_round_trips_through_hex_and_wire() {
        let id = NodeId::random();
        assert_eq!(id.to_string().parse::<NodeId>().unwrap(), id);
        assert_eq!(NodeId::from_wire(id.as_bytes()).unwrap(), id);
        assert_eq!(id.short().len(), 8);
    }

    #[test]
    fn malformed_ids_are_errors() {
        assert!(NodeId::from_wire(&[1, 2, 3]).is_err());
        assert!("xyz".parse::<NodeId>().is_err());
        assert!("zz".repeat(16).parse::<NodeId>().is_err());
        assert!("é".repeat(16).parse::<NodeId>().is_err());
    }
}
