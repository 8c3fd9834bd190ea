//! The store's bookkeeping: which objects it holds, in memory or spilled,
//! who pins them, and making room by spilling the least recently used.
//! Plain synchronous code; the service serializes calls with a lock.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use raylet_proto::{IdMap, ObjectId};

use crate::error::{Result, StoreError};
use crate::segment::Segment;
use crate::spill::SpillTarget;

/// Bytes this process's stores wrote to disk and read back from it.
static SPILL_BYTES: std::sync::LazyLock<prometheus::IntCounterVec> = std::sync::LazyLock::new(|| {
    raylet_common::metrics::counter(
        "raylet_object_store_disk_bytes_total",
        "Bytes of objects spilled to disk, and restored from it, by this node's store",
        &["direction"],
    )
});

/// Settings of one node's store.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Bytes of shared memory that objects may use.
    pub capacity: u64,
    /// Where objects go when memory is short.
    pub spill_to: Arc<dyn SpillTarget>,
    /// Bytes that spilled objects may take there.
    pub spill_limit: u64,
}

impl StoreConfig {
    /// Above this share of the capacity, new objects first spill old ones.
    const HIGH_WATER_PERCENT: u64 = 80;

    fn high_water(&self) -> u64 {
        self.capacity / 100 * Self::HIGH_WATER_PERCENT
    }
}

/// Where a client maps an object: a descriptor of the store's process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location {
    pub pid: u32,
    pub fd: i32,
    pub size: u64,
    /// The segment's number, for a writer that still maps it.
    pub segment: u64,
}

enum State {
    Writing {
        segment: Segment,
        session: u64,
    },
    InMemory(Segment),
    /// In the spill target, as a file named by the object's id.
    Spilled,
}

struct Entry {
    size: u64,
    owner: Arc<str>,
    state: State,
    /// The session that wrote the segment and may still map it.
    writer: Option<u64>,
    pins: u32,
    last_used: u64,
}

/// One object as `raylet memory` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    pub id: ObjectId,
    pub size: u64,
    pub owner: String,
    pub spilled: bool,
    pub sealed: bool,
    pub pins: u32,
}

/// Usage of the store.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreUsage {
    pub capacity: u64,
    pub used: u64,
    pub spilled: u64,
    pub spill_limit: u64,
    pub objects: Vec<ObjectInfo>,
    /// Bytes sent to peer stores that pulled objects from this one.
    pub served: u64,
    /// Bytes received from peer stores while pulling objects.
    pub pulled: u64,
}

/// Tells a session's client to unmap a segment it wrote.
pub type ForgetSegment = Box<dyn Fn(u64) + Send>;

struct Session {
    owner: Arc<str>,
    pins: IdMap<ObjectId, u32>,
    forget: Option<ForgetSegment>,
}

/// A freed object's segment kept for a new object of its size, and the
/// session that wrote it, which may still map it.
struct Kept {
    segment: Segment,
    writer: Option<u64>,
}

/// A node's objects and sessions.
pub struct ObjectStore {
    config: StoreConfig,
    pid: u32,
    objects: IdMap<ObjectId, Entry>,
    /// Sealed in-memory objects by last use, oldest first.
    lru: BTreeMap<u64, ObjectId>,
    clock: u64,
    used: u64,
    spilled: u64,
    sessions: HashMap<u64, Session>,
    next_session: u64,
    /// Sealed segments of freed objects that no reader maps, kept for new
    /// objects of the same size: their pages exist already, so writing
    /// them skips the kernel's allocating, zeroing and freeing of pages,
    /// and a writer that still maps one skips mapping it too.
    reusable: Vec<Kept>,
    reusable_bytes: u64,
}

impl ObjectStore {
    pub fn new(config: StoreConfig) -> Self {
        ObjectStore {
            config,
            pid: std::process::id(),
            objects: IdMap::default(),
            lru: BTreeMap::new(),
            clock: 0,
            used: 0,
            spilled: 0,
            sessions: HashMap::new(),
            next_session: 1,
            reusable: Vec::new(),
            reusable_bytes: 0,
        }
    }

    /// Starts a client's session; `owner` is the address of its process.
    /// A client that keeps the segments it wrote mapped gives `forget`,
    /// which the store calls when it no longer keeps one of them.
    pub fn open_session(&mut self, owner: &str, forget: Option<ForgetSegment>) -> u64 {
        let id = self.next_session;
        self.next_session += 1;
        let session = Session {
            owner: owner.into(),
            pins: IdMap::default(),
            forget,
        };
        self.sessions.insert(id, session);
        id
    }

    /// Ends a session: its pins go, its unfinished objects are dropped, and
    /// so are the objects its process owned, since their owner is gone.
    pub fn close_session(&mut self, session: u64) {
        let Some(closed) = self.sessions.remove(&session) else {
            return;
        };
        for (id, count) in closed.pins {
            if let Some(entry) = self.objects.get_mut(&id) {
                entry.pins = entry.pins.saturating_sub(count);
            }
        }
        let orphaned: Vec<ObjectId> = self
            .objects
            .iter()
            .filter(|(_, e)| matches!(e.state, State::Writing { session: s, .. } if s == session))
            .chain(
                self.objects
                    .iter()
                    .filter(|(_, e)| !closed.owner.is_empty() && e.owner == closed.owner),
            )
            .map(|(id, _)| *id)
            .collect();
        self.delete(&orphaned);
    }

    /// Reserves memory for a new object and returns the segment to write.
    pub fn create(&mut self, session: u64, id: ObjectId, size: u64, owner: &str) -> Result<Location> {
        self.check_session(session)?;
        if size == 0 {
            return Err(StoreError::Invalid(format!("object {id} has no bytes")));
        }
        if self.objects.contains_key(&id) {
            return Err(StoreError::AlreadyExists(id));
        }
        if size > self.config.capacity {
            return Err(StoreError::TooLarge(format!(
                "object {id} of {} does not fit in an object store of {}",
                bytes(size),
                bytes(self.config.capacity)
            )));
        }
        let segment = match self.take_reusable(size, session) {
            Some(segment) => segment,
            None => {
                self.make_room(size, None)?;
                Segment::create(&format!("raylet-{id}"), size).map_err(StoreError::io("creating a segment"))?
            }
        };
        let location = self.location(&segment);
        self.used += size;
        let entry = Entry {
            size,
            owner: owner.into(),
            state: State::Writing { segment, session },
            writer: Some(session),
            pins: 0,
            last_used: 0,
        };
        self.objects.insert(id, entry);
        Ok(location)
    }

    /// Makes a written object immutable, `size` bytes long, and spillable.
    pub fn seal(&mut self, session: u64, id: ObjectId, size: u64) -> Result<()> {
        let entry = self.objects.get_mut(&id).ok_or(StoreError::NotFound(id))?;
        let segment = match &mut entry.state {
            State::Writing {
                segment,
                session: writer,
            } if *writer == session => segment,
            State::Writing { .. } => {
                return Err(StoreError::Invalid(format!(
                    "object {id} is written by another session"
                )));
            }
            _ => return Err(StoreError::Invalid(format!("object {id} is sealed already"))),
        };
        segment
            .seal_at(size)
            .map_err(StoreError::io(format!("sealing object {id}")))?;
        self.used -= entry.size - size;
        entry.size = size;
        entry.state = match std::mem::replace(&mut entry.state, State::Spilled) {
            State::Writing { segment, .. } => State::InMemory(segment),
            other => other,
        };
        self.touch(id);
        Ok(())
    }

    /// [`Self::create`] when it writes nothing to disk: `None` when making
    /// room for `size` bytes would spill objects.
    pub fn create_in_memory(&mut self, session: u64, id: ObjectId, size: u64, owner: &str) -> Result<Option<Location>> {
        let reusable = self.reusable.iter().any(|kept| kept.segment.size() == size);
        match reusable || self.used + size <= self.config.high_water() {
            true => self.create(session, id, size, owner).map(Some),
            false => Ok(None),
        }
    }

    /// [`Self::get`] when it reads nothing from disk: `None` when the
    /// object was spilled.
    pub fn get_in_memory(&mut self, session: u64, id: ObjectId) -> Result<Option<Location>> {
        match self.objects.get(&id).map(|entry| &entry.state) {
            Some(State::Spilled) => Ok(None),
            _ => self.get(session, id).map(Some),
        }
    }

    /// Pins a sealed object for the session, restoring it if it was spilled.
    pub fn get(&mut self, session: u64, id: ObjectId) -> Result<Location> {
        self.check_session(session)?;
        let pid = self.pid;
        let segment = self.pin(id)?;
        let location = Location {
            pid,
            fd: segment.raw_fd(),
            size: segment.size(),
            segment: segment.id(),
        };
        if let Some(session) = self.sessions.get_mut(&session) {
            *session.pins.entry(id).or_default() += 1;
        }
        Ok(location)
    }

    /// Pins a sealed object outside any session, e.g. while a peer store
    /// reads it, restoring it if it was spilled. [`Self::unpin`] ends it.
    pub fn pin(&mut self, id: ObjectId) -> Result<&Segment> {
        let entry = self.objects.get(&id).ok_or(StoreError::NotFound(id))?;
        match &entry.state {
            State::Writing { .. } => return Err(StoreError::NotSealed(id)),
            State::Spilled => self.restore(id)?,
            State::InMemory(_) => {}
        }
        self.touch(id);
        let entry = self.objects.get_mut(&id).ok_or(StoreError::NotFound(id))?;
        entry.pins += 1;
        let State::InMemory(segment) = &entry.state else {
            unreachable!("restored above")
        };
        Ok(segment)
    }

    /// Ends a pin taken with [`Self::pin`].
    pub fn unpin(&mut self, id: ObjectId) {
        if let Some(entry) = self.objects.get_mut(&id) {
            entry.pins = entry.pins.saturating_sub(1);
        }
    }

    /// Whether the store holds the object sealed; `None` when it does not
    /// hold it at all.
    pub fn sealed(&self, id: ObjectId) -> Option<bool> {
        self.objects
            .get(&id)
            .map(|entry| !matches!(entry.state, State::Writing { .. }))
    }

    /// The session stopped reading the object.
    pub fn release(&mut self, session: u64, id: ObjectId) {
        let Some(pins) = self.sessions.get_mut(&session).map(|s| &mut s.pins) else {
            return;
        };
        let Some(count) = pins.get_mut(&id) else {
            return;
        };
        *count -= 1;
        if *count == 0 {
            pins.remove(&id);
        }
        if let Some(entry) = self.objects.get_mut(&id) {
            entry.pins = entry.pins.saturating_sub(1);
        }
    }

    /// Frees objects from memory and disk. Readers that mapped one keep
    /// their mapping; unknown ids are ignored.
    pub fn delete(&mut self, ids: &[ObjectId]) {
        for id in ids {
            let Some(entry) = self.objects.remove(id) else {
                continue;
            };
            self.lru.remove(&entry.last_used);
            match entry.state {
                State::InMemory(segment) if entry.pins == 0 && segment.reusable() => {
                    self.used -= entry.size;
                    self.keep_for_reuse(Kept {
                        segment,
                        writer: entry.writer,
                    });
                }
                State::Writing { segment, .. } | State::InMemory(segment) => {
                    self.used -= entry.size;
                    self.forget(entry.writer, &segment);
                }
                State::Spilled => {
                    self.spilled -= entry.size;
                    let name = id.to_string();
                    if let Err(error) = self.config.spill_to.remove(&name) {
                        let place = self.config.spill_to.location_of(&name);
                        tracing::warn!(%place, %error, "cannot delete a spilled object");
                    }
                }
            }
        }
    }

    /// The owners of stored objects that no open session speaks for:
    /// processes elsewhere, whose end this store would not hear of.
    pub fn remote_owners(&self) -> HashSet<Arc<str>> {
        let local: HashSet<&str> = self.sessions.values().map(|s| &*s.owner).collect();
        self.objects
            .values()
            .map(|entry| &entry.owner)
            .filter(|owner| !owner.is_empty() && !local.contains(&***owner))
            .cloned()
            .collect()
    }

    /// Frees the objects that `owner` owns; returns how many there were.
    pub fn delete_owned_by(&mut self, owner: &str) -> usize {
        let owned: Vec<ObjectId> = self
            .objects
            .iter()
            .filter(|(_, entry)| &*entry.owner == owner)
            .map(|(id, _)| *id)
            .collect();
        self.delete(&owned);
        owned.len()
    }

    pub fn usage(&self) -> StoreUsage {
        let mut objects: Vec<ObjectInfo> = self
            .objects
            .iter()
            .map(|(id, entry)| ObjectInfo {
                id: *id,
                size: entry.size,
                owner: entry.owner.to_string(),
                spilled: matches!(entry.state, State::Spilled),
                sealed: !matches!(entry.state, State::Writing { .. }),
                pins: entry.pins,
            })
            .collect();
        objects.sort_by(|a, b| b.size.cmp(&a.size).then(a.id.as_bytes().cmp(b.id.as_bytes())));
        StoreUsage {
            capacity: self.config.capacity,
            used: self.used,
            spilled: self.spilled,
            spill_limit: self.config.spill_limit,
            objects,
            ..StoreUsage::default()
        }
    }

    fn check_session(&self, session: u64) -> Result<()> {
        match self.sessions.contains_key(&session) {
            true => Ok(()),
            false => Err(StoreError::Invalid(format!("no store session {session}"))),
        }
    }

    fn location(&self, segment: &Segment) -> Location {
        Location {
            pid: self.pid,
            fd: segment.raw_fd(),
            size: segment.size(),
            segment: segment.id(),
        }
    }

    /// Tells the session that wrote `segment` to unmap it, since the store
    /// drops it or hands it to another session.
    fn forget(&self, writer: Option<u64>, segment: &Segment) {
        let forget = writer.and_then(|writer| self.sessions.get(&writer)?.forget.as_ref());
        if let Some(forget) = forget {
            forget(segment.id());
        }
    }

    fn touch(&mut self, id: ObjectId) {
        self.clock += 1;
        let clock = self.clock;
        if let Some(entry) = self.objects.get_mut(&id) {
            self.lru.remove(&entry.last_used);
            entry.last_used = clock;
            if matches!(entry.state, State::InMemory(_)) {
                self.lru.insert(clock, id);
            }
        }
    }

    /// Keeps a freed segment for a new object of its size, within a quarter
    /// of the capacity.
    fn keep_for_reuse(&mut self, kept: Kept) {
        match self.reusable_bytes + kept.segment.size() <= self.config.capacity / 4 {
            true => {
                self.reusable_bytes += kept.segment.size();
                self.reusable.push(kept);
            }
            false => self.forget(kept.writer, &kept.segment),
        }
    }

    /// A kept segment of `size` bytes, preferably one that `session` wrote.
    fn take_reusable(&mut self, size: u64, session: u64) -> Option<Segment> {
        let fits = |kept: &Kept| kept.segment.size() == size;
        let index = self
            .reusable
            .iter()
            .position(|kept| fits(kept) && kept.writer == Some(session))
            .or_else(|| self.reusable.iter().position(fits))?;
        let kept = self.reusable.swap_remove(index);
        self.reusable_bytes -= size;
        if kept.writer != Some(session) {
            self.forget(kept.writer, &kept.segment);
        }
        Some(kept.segment)
    }

    /// Frees kept segments, then spills least recently used unpinned
    /// objects, until `size` more bytes stay under the high-water mark, or
    /// at least under the capacity.
    fn make_room(&mut self, size: u64, keep: Option<ObjectId>) -> Result<()> {
        while self.used + self.reusable_bytes + size > self.config.high_water()
            && let Some(kept) = self.reusable.pop()
        {
            self.reusable_bytes -= kept.segment.size();
            self.forget(kept.writer, &kept.segment);
        }
        while self.used + size > self.config.high_water() {
            let Some(victim) = self.spill_candidate(keep) else {
                break;
            };
            if let Err(error) = self.spill(victim) {
                tracing::warn!(object = %victim, %error, "cannot spill an object");
                break;
            }
        }
        match self.used + size <= self.config.capacity {
            true => Ok(()),
            false => Err(StoreError::Full(self.full_message(size))),
        }
    }

    fn spill_candidate(&self, keep: Option<ObjectId>) -> Option<ObjectId> {
        let disk_left = self.config.spill_limit - self.spilled.min(self.config.spill_limit);
        self.lru.values().copied().find(|id| {
            let entry = &self.objects[id];
            Some(*id) != keep && entry.pins == 0 && entry.size <= disk_left
        })
    }

    fn spill(&mut self, id: ObjectId) -> Result<()> {
        let entry = self.objects.get_mut(&id).ok_or(StoreError::NotFound(id))?;
        let State::InMemory(segment) = &entry.state else {
            return Err(StoreError::Invalid(format!("object {id} is not in memory")));
        };
        let name = id.to_string();
        self.config
            .spill_to
            .write(&name, segment)
            .map_err(StoreError::io(format!(
                "spilling object {id} to {}",
                self.config.spill_to.location_of(&name)
            )))?;
        let writer = entry.writer.take();
        if let State::InMemory(segment) = std::mem::replace(&mut entry.state, State::Spilled) {
            self.forget(writer, &segment);
        }
        let entry = self.objects.get_mut(&id).ok_or(StoreError::NotFound(id))?;
        self.lru.remove(&entry.last_used);
        self.used -= entry.size;
        self.spilled += entry.size;
        SPILL_BYTES.with_label_values(&["spilled"]).inc_by(entry.size);
        tracing::debug!(object = %id, size = entry.size, "spilled");
        Ok(())
    }

    fn restore(&mut self, id: ObjectId) -> Result<()> {
        let size = self.objects.get(&id).ok_or(StoreError::NotFound(id))?.size;
        self.make_room(size, Some(id))?;
        let entry = self.objects.get_mut(&id).ok_or(StoreError::NotFound(id))?;
        let State::Spilled = &entry.state else {
            return Ok(());
        };
        let (target, name) = (&self.config.spill_to, id.to_string());
        let segment = target
            .restore(&name, &format!("raylet-{id}"))
            .map_err(StoreError::io(format!(
                "restoring object {id} from {}",
                target.location_of(&name)
            )))?;
        if let Err(error) = target.remove(&name) {
            let place = target.location_of(&name);
            tracing::warn!(%place, %error, "cannot delete a restored spilled object");
        }
        entry.state = State::InMemory(segment);
        self.spilled -= size;
        self.used += size;
        SPILL_BYTES.with_label_values(&["restored"]).inc_by(size);
        Ok(())
    }

    /// Why an object of `size` bytes does not fit, naming the largest
    /// objects and the processes that own them.
    fn full_message(&self, size: u64) -> String {
        let pinned: u64 = self.objects.values().filter(|e| e.pins > 0).map(|e| e.size).sum();
        let mut text = format!(
            "the object store is full: {} more do not fit; {} of {} in memory ({} pinned by readers), \
             {} of {} spilled to disk",
            bytes(size),
            bytes(self.used),
            bytes(self.config.capacity),
            bytes(pinned),
            bytes(self.spilled),
            bytes(self.config.spill_limit),
        );
        let usage = self.usage();
        text.push_str(". The largest objects:");
        for object in usage.objects.iter().take(5) {
            let state = if object.spilled { "spilled" } else { "in memory" };
            text.push_str(&format!(
                " {} ({}, {state}, {} readers, owned by {});",
                object.id,
                bytes(object.size),
                object.pins,
                object.owner
            ));
        }
        text.push_str(" drop references to objects you no longer need, or raise --object-store-memory");
        text
    }
}

/// A byte count for people: "12.5 MiB".
pub fn bytes(count: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = count as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    match unit {
        0 => format!("{count} B"),
        _ => format!("{value:.1} {}", UNITS[unit]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::{map_readonly, map_writable, proc_path};

    const MIB: u64 = 1 << 20;

    fn store(capacity: u64, spill_limit: u64) -> (ObjectStore, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let config = StoreConfig {
            capacity,
            spill_to: Arc::new(crate::spill::SpillDirectory(dir.path().join("spill"))),
            spill_limit,
        };
        (ObjectStore::new(config), dir)
    }

    fn put(store: &mut ObjectStore, session: u64, fill: u8, size: u64) -> Result<ObjectId> {
        let id = ObjectId::random();
        let location = store.create(session, id, size, "owner:1")?;
        map_writable(&proc_path(location.pid, location.fd), size)
            .unwrap()
            .fill(fill);
        store.seal(session, id, size)?;
        Ok(id)
    }

    fn read(store: &mut ObjectStore, session: u64, id: ObjectId) -> Vec<u8> {
        let location = store.get(session, id).unwrap();
        let bytes = map_readonly(&proc_path(location.pid, location.fd), location.size)
            .unwrap()
            .to_vec();
        store.release(session, id);
        bytes
    }

    #[test]
    fn owners_without_a_session_here_are_remote_and_their_objects_can_be_dropped() {
        let (mut store, _dir) = store(10 * MIB, 0);
        let local = store.open_session("owner:1", None);
        let pulls = store.open_session("", None);
        let mine = put(&mut store, local, 1, MIB).unwrap();
        let theirs = ObjectId::random();
        store.create(pulls, theirs, MIB, "elsewhere:2").unwrap();
        store.seal(pulls, theirs, MIB).unwrap();
        let remote: Vec<String> = store.remote_owners().iter().map(|o| o.to_string()).collect();
        assert_eq!(remote, ["elsewhere:2"]);
        assert_eq!(store.delete_owned_by("elsewhere:2"), 1);
        assert!(store.remote_owners().is_empty());
        let left: Vec<ObjectId> = store.usage().objects.iter().map(|o| o.id).collect();
        assert_eq!(left, [mine]);
    }

    #[test]
    fn objects_past_the_high_water_mark_spill_and_restore_on_get() {
        let (mut store, dir) = store(10 * MIB, 100 * MIB);
        let disk_bytes = |direction: &str| SPILL_BYTES.with_label_values(&[direction]).get();
        let (spilled_before, restored_before) = (disk_bytes("spilled"), disk_bytes("restored"));
        let session = store.open_session("owner:1", None);
        let ids: Vec<ObjectId> = (0..20).map(|i| put(&mut store, session, i, MIB).unwrap()).collect();
        let usage = store.usage();
        assert!(
            usage.used <= 8 * MIB,
            "used {} stays under the high-water mark",
            usage.used
        );
        assert_eq!(usage.used + usage.spilled, 20 * MIB);
        for (i, id) in ids.iter().enumerate() {
            assert!(read(&mut store, session, *id).iter().all(|b| *b == i as u8));
        }
        assert!(
            disk_bytes("spilled") - spilled_before >= 12 * MIB,
            "the metric counts spills"
        );
        assert!(
            disk_bytes("restored") - restored_before >= 12 * MIB,
            "the metric counts restores"
        );
        store.delete(&ids);
        assert_eq!((store.usage().used, store.usage().spilled), (0, 0));
        assert_eq!(std::fs::read_dir(dir.path().join("spill")).unwrap().count(), 0);
    }

    #[test]
    fn the_in_memory_calls_decline_what_would_touch_the_disk() {
        let (mut store, _dir) = store(10 * MIB, 100 * MIB);
        let session = store.open_session("owner:1", None);
        let ids: Vec<ObjectId> = (0..7).map(|i| put(&mut store, session, i, MIB).unwrap()).collect();
        let declined = store.create_in_memory(session, ObjectId::random(), MIB, "owner:1");
        assert!(declined.unwrap().is_none(), "an eighth MiB passes the high-water mark");
        assert_eq!(store.usage().spilled, 0, "and nothing was spilled for it");
        put(&mut store, session, 7, MIB).unwrap();
        assert_eq!(store.usage().spilled, MIB, "the blocking create spills");
        assert!(
            store.get_in_memory(session, ids[0]).unwrap().is_none(),
            "a spilled object is declined"
        );
        let location = store
            .get_in_memory(session, ids[6])
            .unwrap()
            .expect("one in memory is pinned");
        assert_eq!(location.size, MIB);
        store.release(session, ids[6]);

        store.delete(&ids[1..2]);
        let reused = store.create_in_memory(session, ObjectId::random(), MIB, "owner:1");
        assert!(reused.unwrap().is_some(), "a kept segment of the size needs no room");
        let missing = store.get_in_memory(session, ObjectId::random()).unwrap_err();
        assert!(matches!(missing, StoreError::NotFound(_)), "{missing}");
    }

    #[test]
    fn pinned_objects_are_never_spilled() {
        let (mut store, _dir) = store(4 * MIB, 100 * MIB);
        let session = store.open_session("owner:1", None);
        let pinned = put(&mut store, session, 1, 2 * MIB).unwrap();
        store.get(session, pinned).unwrap();
        let error = put(&mut store, session, 2, 3 * MIB).unwrap_err();
        assert!(matches!(error, StoreError::Full(_)), "{error}");
        assert!(!store.usage().objects[0].spilled);
        store.release(session, pinned);
        put(&mut store, session, 2, 3 * MIB).unwrap();
        assert!(store.usage().objects.iter().any(|o| o.id == pinned && o.spilled));
    }

    #[test]
    fn a_full_spill_disk_makes_a_clear_error_naming_the_largest_objects() {
        let (mut store, _dir) = store(4 * MIB, 2 * MIB);
        let session = store.open_session("driver:7", None);
        let big = put(&mut store, session, 1, 3 * MIB).unwrap();
        let error = put(&mut store, session, 2, 3 * MIB).unwrap_err();
        let StoreError::Full(message) = error else {
            panic!("expected Full, got {error}")
        };
        assert!(message.contains(&big.to_string()), "{message}");
        assert!(message.contains("owner:1"), "{message}");
        assert!(
            message.contains("2.0 MiB spilled") || message.contains("of 2.0 MiB"),
            "{message}"
        );
    }

    #[test]
    fn an_object_larger_than_the_store_is_refused_at_once() {
        let (mut store, _dir) = store(MIB, MIB);
        let session = store.open_session("", None);
        let error = store.create(session, ObjectId::random(), 2 * MIB, "").unwrap_err();
        assert!(matches!(error, StoreError::TooLarge(_)), "{error}");
    }

    #[test]
    fn closing_a_session_frees_its_unsealed_and_owned_objects() {
        let (mut store, _dir) = store(10 * MIB, 10 * MIB);
        let writer = store.open_session("owner:1", None);
        let other = store.open_session("owner:2", None);
        let owned = put(&mut store, writer, 1, MIB).unwrap();
        let unsealed = ObjectId::random();
        store.create(writer, unsealed, MIB, "owner:2").unwrap();
        let kept = ObjectId::random();
        store.create(other, kept, MIB, "owner:2").unwrap();
        store.seal(other, kept, MIB).unwrap();
        store.close_session(writer);
        let left: Vec<ObjectId> = store.usage().objects.iter().map(|o| o.id).collect();
        assert_eq!(left, vec![kept], "owned {owned} and unsealed {unsealed} are gone");
        assert_eq!(store.usage().used, MIB);
    }

    #[test]
    fn a_freed_object_that_nobody_maps_lends_its_memory_to_the_next_of_its_size() {
        let (mut store, _dir) = store(10 * MIB, 10 * MIB);
        let session = store.open_session("", None);
        let first = put(&mut store, session, 1, MIB).unwrap();
        store.delete(&[first]);
        assert_eq!(store.reusable_bytes, MIB, "the freed segment is kept");
        let second = put(&mut store, session, 2, MIB).unwrap();
        assert_eq!(store.reusable_bytes, 0, "and taken by the next object of its size");
        assert!(read(&mut store, session, second).iter().all(|b| *b == 2));

        let location = store.get(session, second).unwrap();
        let reader = map_readonly(&proc_path(location.pid, location.fd), location.size).unwrap();
        store.delete(&[second]);
        assert_eq!(store.reusable_bytes, 0, "a segment someone maps is never kept");
        put(&mut store, session, 3, MIB).unwrap();
        assert!(reader.iter().all(|b| *b == 2), "the reader's bytes never change");
        assert_eq!(store.usage().used, MIB);
    }

    #[test]
    fn a_writer_is_told_to_unmap_each_segment_the_store_stops_keeping_for_it() {
        let (mut store, _dir) = store(10 * MIB, 100 * MIB);
        let (told, forgotten) = std::sync::mpsc::channel();
        let forget: ForgetSegment = Box::new(move |segment| told.send(segment).unwrap());
        let writer = store.open_session("owner:1", Some(forget));
        let other = store.open_session("owner:2", None);
        let create = |store: &mut ObjectStore, session| {
            let id = ObjectId::random();
            let segment = store.create(session, id, MIB, "owner:1").unwrap().segment;
            store.seal(session, id, MIB).unwrap();
            (id, segment)
        };
        let (first, segment) = create(&mut store, writer);
        store.delete(&[first]);
        let (second, again) = create(&mut store, writer);
        assert_eq!(again, segment, "the writer gets back the segment it maps");
        assert!(forgotten.try_recv().is_err());

        store.delete(&[second]);
        let (_, taken) = create(&mut store, other);
        assert_eq!(taken, segment);
        assert_eq!(forgotten.try_recv().unwrap(), segment, "another session took it");

        let (_, spilled) = create(&mut store, writer);
        for _ in 0..9 {
            create(&mut store, other);
        }
        assert_eq!(forgotten.try_recv().unwrap(), spilled, "spilling dropped it");
    }

    #[test]
    fn sealing_shrinks_to_the_written_length() {
        let (mut store, _dir) = store(10 * MIB, 10 * MIB);
        let session = store.open_session("", None);
        let id = ObjectId::random();
        store.create(session, id, 2 * MIB, "").unwrap();
        store.seal(session, id, MIB).unwrap();
        assert_eq!(store.usage().used, MIB);
        assert_eq!(store.get(session, id).unwrap().size, MIB);
    }
}
