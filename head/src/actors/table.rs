//! The head's actor table: every actor's spec and record, the names of live
//! actors, and the owners they die with. Plain synchronous state; each
//! record is published on a watch channel that callers follow, and written
//! to the head's state store, from which a restarted head recovers it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use prost::Message;
use raylet_proto::v1::{
    ActorDeathKind, ActorRecord, ActorState, CreateActorRequest, StoredActor, TaskArg, WorkerBinary,
};
use raylet_proto::{ActorId, IdMap, NodeId, ResourceSet, Scheduling, WorkerId};
use tokio::sync::watch;

use super::error::ActorError;
use super::leases::Grant;
use crate::state_store::{Committed, StateError, StateStore, Table};
use crate::wire::bounded_text;

type Result<T, E = ActorError> = std::result::Result<T, E>;

/// How many dead actors are kept for `raylet list actors` and late watchers;
/// older ones are forgotten, on disk too.
const MAX_DEAD_ACTORS: usize = 10_000;

/// What an actor is made from, as its creator asked.
#[derive(Clone, Debug)]
pub struct ActorSpec {
    pub id: ActorId,
    pub class_name: String,
    pub args: Vec<TaskArg>,
    pub binary: WorkerBinary,
    pub placement: ResourceSet,
    pub running: ResourceSet,
    pub scheduling: Scheduling,
    pub name: String,
    pub namespace: String,
    pub detached: bool,
    /// Negative: restart without limit.
    pub max_restarts: i32,
    pub max_task_retries: u32,
    pub max_concurrency: u32,
    pub owner: String,
}

impl ActorSpec {
    /// Decodes and checks a creation request.
    pub fn from_request(request: CreateActorRequest) -> Result<Self> {
        let binary = request.binary.ok_or(ActorError::NoBinary)?;
        if request.max_concurrency == 0 {
            return Err(ActorError::NoConcurrency);
        }
        Ok(ActorSpec {
            id: ActorId::from_wire(&request.actor_id)?,
            class_name: bounded_text("class_name", request.class_name)?,
            args: request.args,
            binary,
            placement: ResourceSet::from_proto(&request.placement.unwrap_or_default())?,
            running: ResourceSet::from_proto(&request.running.unwrap_or_default())?,
            scheduling: Scheduling::from_proto(request.strategy.as_ref())?,
            name: bounded_text("name", request.name)?,
            namespace: bounded_text("namespace", request.namespace)?,
            detached: request.detached,
            max_restarts: request.max_restarts,
            max_task_retries: request.max_task_retries,
            max_concurrency: request.max_concurrency,
            owner: bounded_text("owner_address", request.owner_address)?,
        })
    }

    /// The creation request this spec was decoded from.
    pub fn to_request(&self) -> CreateActorRequest {
        CreateActorRequest {
            actor_id: self.id.as_bytes().to_vec(),
            class_name: self.class_name.clone(),
            args: self.args.clone(),
            binary: Some(self.binary.clone()),
            placement: Some(self.placement.to_proto()),
            running: Some(self.running.to_proto()),
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            detached: self.detached,
            max_restarts: self.max_restarts,
            max_concurrency: self.max_concurrency,
            owner_address: self.owner.clone(),
            max_task_retries: self.max_task_retries,
            strategy: Some(self.scheduling.to_proto()),
        }
    }

    fn may_restart(&self, restarts: u32) -> bool {
        self.max_restarts < 0 || restarts < self.max_restarts as u32
    }
}

/// Why an actor is to be ended, and whether it may come back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KillOrder {
    pub no_restart: bool,
    pub kind: ActorDeathKind,
    pub cause: String,
}

struct ActorEntry {
    spec: Arc<ActorSpec>,
    record: watch::Sender<ActorRecord>,
    kill: watch::Sender<Option<KillOrder>>,
    created: u64,
    /// The lease of the worker that hosts it, while it is alive.
    host: Option<Grant>,
}

/// An actor a restarted head found in its state store, to be run again.
pub struct RecoveredActor {
    pub spec: Arc<ActorSpec>,
    pub kill: watch::Receiver<Option<KillOrder>>,
    /// The lease of the worker that hosted it when the head went down, to
    /// be adopted; none when it was not alive.
    pub host: Option<Grant>,
}

/// Every actor of the cluster.
#[derive(Default)]
pub struct ActorTable {
    actors: IdMap<ActorId, ActorEntry>,
    /// Live actors by namespace and name.
    names: HashMap<(String, String), ActorId>,
    /// How many sessions each owner process holds open.
    owners: HashMap<String, u32>,
    created: u64,
    /// Dead actors, the first to die first.
    dead: VecDeque<ActorId>,
    store: StateStore,
}

impl ActorTable {
    /// The table as `store` holds it, and the actors that are not dead, to
    /// be run again (their kill orders, if any were sent, are lost: a kill
    /// is asked for again by its caller).
    pub fn recover(store: StateStore) -> Result<(Self, Vec<RecoveredActor>), StateError> {
        let mut table = ActorTable {
            store: store.clone(),
            ..ActorTable::default()
        };
        let mut recovered = Vec::new();
        let mut dead = Vec::new();
        for (key, value) in store.load(Table::Actors)? {
            let record = || format!("actor {key:02x?}");
            let stored = StoredActor::decode(value.as_slice()).map_err(StateError::corrupt(record()))?;
            let created = stored.created;
            match table.restore(stored).map_err(StateError::corrupt(record()))? {
                Some(actor) => recovered.push(actor),
                None => dead.push((created, key)),
            }
        }
        dead.sort();
        let dead = dead.into_iter().filter_map(|(_, key)| ActorId::from_wire(&key).ok());
        table.dead.extend(dead);
        Ok((table, recovered))
    }

    /// Puts a stored actor back; returns it when it is to be run again.
    fn restore(&mut self, stored: StoredActor) -> Result<Option<RecoveredActor>> {
        let spec = Arc::new(ActorSpec::from_request(stored.spec.unwrap_or_default())?);
        let record = stored.record.unwrap_or_default();
        let host = stored_host(
            &stored.worker_id,
            stored.node_manager_address,
            stored.node_incarnation,
            &record,
        );
        let live = record.state() != ActorState::Dead;
        if live && !spec.name.is_empty() {
            self.names.insert((spec.namespace.clone(), spec.name.clone()), spec.id);
        }
        let (kill, killed) = watch::channel(None);
        self.created = self.created.max(stored.created);
        let entry = ActorEntry {
            spec: spec.clone(),
            record: watch::channel(record).0,
            kill,
            created: stored.created,
            host: host.clone(),
        };
        self.actors.insert(spec.id, entry);
        Ok(live.then_some(RecoveredActor {
            spec,
            kill: killed,
            host,
        }))
    }

    /// Kills, for good, those of `actors` that are not detached and whose
    /// owner has no session open: owners that outlived a restart of the
    /// head have opened theirs again by now.
    pub fn kill_orphans(&mut self, actors: &[ActorId]) {
        let absent: HashSet<ActorId> = actors
            .iter()
            .filter_map(|id| self.actors.get(id))
            .filter(|entry| !entry.spec.detached && !self.owners.contains_key(&entry.spec.owner))
            .map(|entry| entry.spec.id)
            .collect();
        for id in absent {
            let Some(owner) = self.actors.get(&id).map(|entry| entry.spec.owner.clone()) else {
                continue;
            };
            let order = KillOrder {
                no_restart: true,
                kind: ActorDeathKind::OwnerDied,
                cause: format!("its owner {owner} did not come back after the head restarted, and it was not detached"),
            };
            let _ = self.kill(id, order);
        }
    }

    /// Whether the actor is known: a creation that is asked for again (its
    /// caller lost the answer) is done already.
    pub fn contains(&self, id: ActorId) -> bool {
        self.actors.contains_key(&id)
    }

    /// Registers a new actor as pending. Fails when its id is known or its
    /// name is taken by a live actor of its namespace.
    pub fn create(&mut self, spec: ActorSpec) -> Result<(Arc<ActorSpec>, watch::Receiver<Option<KillOrder>>)> {
        if self.actors.contains_key(&spec.id) {
            return Err(ActorError::Exists { actor_id: spec.id });
        }
        let key = (spec.namespace.clone(), spec.name.clone());
        if !spec.name.is_empty() && self.names.contains_key(&key) {
            return Err(ActorError::NameTaken {
                name: spec.name,
                namespace: spec.namespace,
            });
        }
        if !spec.name.is_empty() {
            self.names.insert(key, spec.id);
        }
        let record = ActorRecord {
            actor_id: spec.id.as_bytes().to_vec(),
            class_name: spec.class_name.clone(),
            name: spec.name.clone(),
            namespace: spec.namespace.clone(),
            state: ActorState::Pending as i32,
            owner_address: spec.owner.clone(),
            detached: spec.detached,
            max_concurrency: spec.max_concurrency,
            max_task_retries: spec.max_task_retries,
            ..ActorRecord::default()
        };
        let spec = Arc::new(spec);
        let (kill, killed) = watch::channel(None);
        self.created += 1;
        let entry = ActorEntry {
            spec: spec.clone(),
            record: watch::channel(record).0,
            kill,
            created: self.created,
            host: None,
        };
        self.actors.insert(spec.id, entry);
        self.persist(spec.id);
        Ok((spec, killed))
    }

    /// Follows an actor's record.
    pub fn watch(&self, id: ActorId) -> Result<watch::Receiver<ActorRecord>> {
        let entry = self.entry(id)?;
        Ok(entry.record.subscribe())
    }

    pub fn record(&self, id: ActorId) -> Result<ActorRecord> {
        Ok(self.entry(id)?.record.borrow().clone())
    }

    /// The live actor named `name` in `namespace`.
    pub fn named(&self, namespace: &str, name: &str) -> Result<ActorRecord> {
        let id = self
            .names
            .get(&(namespace.to_string(), name.to_string()))
            .ok_or_else(|| ActorError::NoLiveActorNamed {
                name: name.to_string(),
                namespace: namespace.to_string(),
            })?;
        self.record(*id)
    }

    /// Every actor, oldest first.
    pub fn list(&self) -> Vec<ActorRecord> {
        let mut entries: Vec<&ActorEntry> = self.actors.values().collect();
        entries.sort_by_key(|entry| entry.created);
        entries.iter().map(|entry| entry.record.borrow().clone()).collect()
    }

    /// Orders an actor to be ended; a dead actor stays dead.
    pub fn kill(&mut self, id: ActorId, order: KillOrder) -> Result<()> {
        let entry = self.entry(id)?;
        if entry.record.borrow().state() != ActorState::Dead {
            entry.kill.send_replace(Some(order));
        }
        Ok(())
    }

    /// The actor runs on the worker of `host` now. A worker adopted after a
    /// restart of the head leaves the record as it was: its callers keep
    /// their connections and calls.
    pub fn alive(&mut self, id: ActorId, host: &Grant) {
        let Some(entry) = self.actors.get_mut(&id) else {
            return;
        };
        entry.host = Some(host.clone());
        if is_alive_on(&entry.record.borrow(), host) {
            self.persist(id);
            return;
        }
        self.update(id, |record| mark_alive(record, host));
    }

    /// Writes that the actor runs on the worker of `host` to the store, and
    /// resolves once that is on disk; its watchers are told with
    /// [`ActorTable::alive`] after that, so that a head restarted at any
    /// time knows every worker its callers may reach, and adopts it instead
    /// of starting a second one.
    pub fn store_alive(&mut self, id: ActorId, host: &Grant) -> Committed {
        if let Some(entry) = self.actors.get_mut(&id) {
            entry.host = Some(host.clone());
            let mut record = entry.record.borrow().clone();
            if !is_alive_on(&record, host) {
                mark_alive(&mut record, host);
                record.version += 1;
            }
            self.write(id, record);
        }
        self.flushed()
    }

    /// The actor's process is gone. Unless a kill order forbids it or its
    /// restarts are used up, it restarts; returns whether it does.
    pub fn process_died(&mut self, id: ActorId, cause: &str) -> bool {
        let Ok(entry) = self.entry(id) else {
            return false;
        };
        let order = entry.kill.borrow().clone();
        let restarts = entry.record.borrow().restarts;
        let may_restart = entry.spec.may_restart(restarts);
        match order {
            Some(order) if order.no_restart => {
                self.dead(id, order.kind, &order.cause);
                false
            }
            _ if !may_restart => {
                let cause = format!("its process died and its {restarts} restarts are used up: {cause}");
                self.dead(id, ActorDeathKind::ProcessDied, &cause);
                false
            }
            _ => {
                if let Ok(entry) = self.entry(id) {
                    entry.kill.send_replace(None);
                }
                self.update(id, |record| {
                    record.state = ActorState::Restarting as i32;
                    record.restarts += 1;
                    record.address.clear();
                    record.pid = 0;
                    record.death_cause = cause.to_string();
                });
                true
            }
        }
    }

    /// The actor is dead for good: its name is free again. The oldest dead
    /// actor is forgotten past [`MAX_DEAD_ACTORS`].
    pub fn dead(&mut self, id: ActorId, kind: ActorDeathKind, cause: &str) {
        let Ok(entry) = self.entry(id) else {
            return;
        };
        let newly_dead = entry.record.borrow().state() != ActorState::Dead;
        let key = (entry.spec.namespace.clone(), entry.spec.name.clone());
        if self.names.get(&key) == Some(&id) {
            self.names.remove(&key);
        }
        self.update(id, |record| {
            record.state = ActorState::Dead as i32;
            record.address.clear();
            record.death_kind = kind as i32;
            record.death_cause = cause.to_string();
        });
        if newly_dead {
            self.dead.push_back(id);
        }
        if self.dead.len() > MAX_DEAD_ACTORS
            && let Some(oldest) = self.dead.pop_front()
        {
            self.actors.remove(&oldest);
            self.store.delete(Table::Actors, oldest.as_bytes());
        }
    }

    /// An owner opened a session.
    pub fn owner_joined(&mut self, owner: &str) {
        *self.owners.entry(owner.to_string()).or_default() += 1;
    }

    /// An owner's session ended; when it was its last, the owner is gone and
    /// so are the actors it owns that are not detached.
    pub fn owner_left(&mut self, owner: &str) {
        let Some(sessions) = self.owners.get_mut(owner) else {
            return;
        };
        *sessions -= 1;
        if *sessions > 0 {
            return;
        }
        self.owners.remove(owner);
        let orphans: Vec<ActorId> = self
            .actors
            .values()
            .filter(|entry| entry.spec.owner == owner && !entry.spec.detached)
            .map(|entry| entry.spec.id)
            .collect();
        for id in orphans {
            let order = KillOrder {
                no_restart: true,
                kind: ActorDeathKind::OwnerDied,
                cause: format!("its owner {owner} exited, and it was not detached"),
            };
            let _ = self.kill(id, order);
        }
    }

    fn entry(&self, id: ActorId) -> Result<&ActorEntry> {
        self.actors.get(&id).ok_or(ActorError::UnknownActor { actor_id: id })
    }

    /// Changes the actor's record; it has no host unless it is alive.
    fn update(&mut self, id: ActorId, change: impl FnOnce(&mut ActorRecord)) {
        if let Some(entry) = self.actors.get_mut(&id) {
            entry.record.send_modify(|record| {
                change(record);
                record.version += 1;
            });
            if entry.record.borrow().state() != ActorState::Alive {
                entry.host = None;
            }
        }
        self.persist(id);
    }

    /// Writes the actor to the state store, behind the caller.
    fn persist(&self, id: ActorId) {
        if let Some(entry) = self.actors.get(&id) {
            let record = entry.record.borrow().clone();
            self.write(id, record);
        }
    }

    /// Writes the actor with `record` to the state store, behind the caller.
    fn write(&self, id: ActorId, record: ActorRecord) {
        let Some(entry) = self.actors.get(&id) else {
            return;
        };
        let host = entry.host.as_ref();
        let stored = StoredActor {
            spec: Some(entry.spec.to_request()),
            record: Some(record),
            created: entry.created,
            worker_id: host.map(|h| h.worker_id.as_bytes().to_vec()).unwrap_or_default(),
            node_manager_address: host.map(|h| h.node.clone()).unwrap_or_default(),
            node_incarnation: host.map_or(0, |h| h.incarnation),
        };
        self.store.put(Table::Actors, id.as_bytes(), &stored);
    }

    /// Resolves once every change so far is on disk, or with the error
    /// that kept one off it.
    pub fn flushed(&self) -> Committed {
        self.store.flush()
    }
}

/// Whether the record says the actor runs on the worker of `host`.
fn is_alive_on(record: &ActorRecord, host: &Grant) -> bool {
    record.state() == ActorState::Alive && record.address == host.address && record.pid == host.pid
}

fn mark_alive(record: &mut ActorRecord, host: &Grant) {
    record.state = ActorState::Alive as i32;
    record.address = host.address.clone();
    record.node_id = host.node_id.as_bytes().to_vec();
    record.pid = host.pid;
}

/// The lease of a stored actor's worker, when it was alive.
fn stored_host(worker_id: &[u8], node: String, incarnation: u64, record: &ActorRecord) -> Option<Grant> {
    if record.state() != ActorState::Alive {
        return None;
    }
    Some(Grant {
        node,
        worker_id: WorkerId::from_wire(worker_id).ok()?,
        address: record.address.clone(),
        node_id: NodeId::from_wire(&record.node_id).ok()?,
        incarnation,
        pid: record.pid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, max_restarts: i32, detached: bool) -> ActorSpec {
        ActorSpec {
            id: ActorId::random(),
            class_name: "tests::Counter".into(),
            args: Vec::new(),
            binary: WorkerBinary::default(),
            placement: ResourceSet::new(),
            scheduling: Scheduling::default(),
            running: ResourceSet::new(),
            name: name.into(),
            namespace: "default".into(),
            detached,
            max_restarts,
            max_task_retries: 0,
            max_concurrency: 1,
            owner: "driver:1".into(),
        }
    }

    fn placement() -> Grant {
        Grant {
            node: "127.0.0.1:8".into(),
            worker_id: WorkerId::random(),
            address: "127.0.0.1:9".into(),
            node_id: NodeId::random(),
            incarnation: 1,
            pid: 42,
        }
    }

    #[test]
    fn a_name_is_taken_while_its_actor_lives_and_free_once_it_is_dead() {
        let mut table = ActorTable::default();
        let (first, _) = table.create(spec("counter", 0, false)).unwrap();
        let error = table.create(spec("counter", 0, false)).unwrap_err();
        assert!(
            matches!(&error, ActorError::NameTaken { name, namespace } if name == "counter" && namespace == "default"),
            "{error}"
        );
        assert_eq!(table.named("default", "counter").unwrap().actor_id, first.id.as_bytes());
        table.dead(first.id, ActorDeathKind::Killed, "killed");
        assert!(matches!(
            table.named("default", "counter"),
            Err(ActorError::NoLiveActorNamed { .. })
        ));
        table.create(spec("counter", 0, false)).unwrap();
    }

    #[test]
    fn a_dying_process_restarts_the_actor_until_its_restarts_are_used_up() {
        let mut table = ActorTable::default();
        let (actor, _) = table.create(spec("", 1, false)).unwrap();
        table.alive(actor.id, &placement());
        assert!(table.process_died(actor.id, "killed by signal 9"));
        let record = table.record(actor.id).unwrap();
        assert_eq!((record.state(), record.restarts), (ActorState::Restarting, 1));
        table.alive(actor.id, &placement());
        assert!(!table.process_died(actor.id, "killed by signal 9"));
        let record = table.record(actor.id).unwrap();
        assert_eq!(record.state(), ActorState::Dead);
        assert_eq!(record.death_kind(), ActorDeathKind::ProcessDied);
        assert!(
            record.death_cause.contains("1 restarts are used up"),
            "{}",
            record.death_cause
        );
    }

    #[test]
    fn an_owner_leaving_kills_its_actors_that_are_not_detached() {
        let mut table = ActorTable::default();
        let (owned, owned_kill) = table.create(spec("", -1, false)).unwrap();
        let (detached, detached_kill) = table.create(spec("", -1, true)).unwrap();
        table.owner_joined("driver:1");
        table.owner_joined("driver:1");
        table.owner_left("driver:1");
        assert!(owned_kill.borrow().is_none(), "one session of the owner is still open");
        table.owner_left("driver:1");
        let order = owned_kill.borrow().clone().unwrap();
        assert_eq!((order.no_restart, order.kind), (true, ActorDeathKind::OwnerDied));
        assert!(detached_kill.borrow().is_none());
        assert!(!table.process_died(owned.id, "killed"));
        assert_eq!(table.record(owned.id).unwrap().death_kind(), ActorDeathKind::OwnerDied);
        assert_eq!(table.record(detached.id).unwrap().state(), ActorState::Pending);
    }

    #[tokio::test]
    async fn a_recovered_table_has_every_actor_with_its_name_and_host_and_runs_the_live_ones_again() {
        let dir = tempfile::tempdir().unwrap();
        let host = placement();
        let (kept, waiting, gone) = {
            let (mut table, recovered) = ActorTable::recover(StateStore::open(dir.path()).unwrap()).unwrap();
            assert!(recovered.is_empty());
            let (kept, _) = table.create(spec("kept", -1, true)).unwrap();
            table.alive(kept.id, &host);
            let (waiting, _) = table.create(spec("", 0, false)).unwrap();
            let (gone, _) = table.create(spec("gone", 0, false)).unwrap();
            table.dead(gone.id, ActorDeathKind::Killed, "killed");
            table.flushed().await.unwrap();
            (kept.id, waiting.id, gone.id)
        };
        let store = crate::state_store::tests::reopen(dir.path()).await;
        let (table, recovered) = ActorTable::recover(store).unwrap();
        let mut live: Vec<(ActorId, Option<WorkerId>)> = recovered
            .iter()
            .map(|actor| (actor.spec.id, actor.host.as_ref().map(|h| h.worker_id)))
            .collect();
        live.sort();
        let mut expected = vec![(kept, Some(host.worker_id)), (waiting, None)];
        expected.sort();
        assert_eq!(
            live, expected,
            "the live actors run again; the alive one adopts its worker"
        );
        let adopted = recovered.iter().find_map(|actor| actor.host.clone()).unwrap();
        assert_eq!((adopted.node, adopted.incarnation), (host.node, host.incarnation));
        assert_eq!(table.named("default", "kept").unwrap().actor_id, kept.as_bytes());
        assert!(table.named("default", "gone").is_err(), "a dead actor's name is free");
        let listed: Vec<Vec<u8>> = table.list().into_iter().map(|r| r.actor_id).collect();
        assert_eq!(
            listed,
            [kept, waiting, gone].map(|id| id.as_bytes().to_vec()),
            "in creation order"
        );
        assert_eq!(table.record(gone).unwrap().death_kind(), ActorDeathKind::Killed);
    }

    #[test]
    fn after_a_restart_the_actors_of_owners_that_did_not_come_back_are_killed() {
        let mut table = ActorTable::default();
        let back = table.create(spec("", -1, false)).unwrap();
        let mut orphan_spec = spec("", -1, false);
        orphan_spec.owner = "driver:2".into();
        let orphan = table.create(orphan_spec.clone()).unwrap();
        orphan_spec.id = ActorId::random();
        orphan_spec.detached = true;
        let detached = table.create(orphan_spec).unwrap();
        table.owner_joined("driver:1");
        table.kill_orphans(&[back.0.id, orphan.0.id, detached.0.id]);
        assert!(back.1.borrow().is_none(), "its owner came back");
        assert_eq!(orphan.1.borrow().clone().unwrap().kind, ActorDeathKind::OwnerDied);
        assert!(detached.1.borrow().is_none(), "a detached actor outlives its owner");
    }

    #[test]
    fn the_first_dead_actors_are_forgotten_past_the_limit_and_the_live_ones_kept() {
        let mut table = ActorTable::default();
        let (live, _) = table.create(spec("", 0, false)).unwrap();
        let ids: Vec<ActorId> = (0..=MAX_DEAD_ACTORS)
            .map(|_| table.create(spec("", 0, false)).unwrap().0.id)
            .collect();
        for id in &ids {
            table.dead(*id, ActorDeathKind::Killed, "killed");
        }
        table.dead(ids[5], ActorDeathKind::Killed, "killed again");
        assert!(table.record(ids[0]).is_err(), "the first to die is forgotten");
        assert!(table.record(ids[1]).is_ok());
        assert!(table.record(live.id).is_ok());
        assert_eq!(table.list().len(), MAX_DEAD_ACTORS + 1);
    }

    #[test]
    fn watchers_see_every_change_in_order() {
        let mut table = ActorTable::default();
        let (actor, _) = table.create(spec("", 0, false)).unwrap();
        let mut watcher = table.watch(actor.id).unwrap();
        table.alive(actor.id, &placement());
        assert_eq!(watcher.borrow_and_update().state(), ActorState::Alive);
        table.process_died(actor.id, "gone");
        let record = watcher.borrow_and_update().clone();
        assert_eq!((record.state(), record.version), (ActorState::Dead, 2));
        assert_eq!(table.list().len(), 1);
    }
}
