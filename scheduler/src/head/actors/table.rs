//! The head's actor table: every actor's spec and record, the names of live
//! actors, and the owners they die with. Plain synchronous state; each
//! record is published on a watch channel that callers follow.

use std::collections::HashMap;
use std::sync::Arc;

use raylet_proto::v1::{ActorDeathKind, ActorRecord, ActorState, TaskArg, WorkerBinary};
use raylet_proto::{ActorId, Error, IdMap, NodeId, ResourceSet, Result, Scheduling};
use tokio::sync::watch;

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

/// Where an actor runs once it is constructed.
#[derive(Clone, Debug)]
pub struct Placement {
    pub address: String,
    pub node_id: NodeId,
    pub pid: u32,
}

struct ActorEntry {
    spec: Arc<ActorSpec>,
    record: watch::Sender<ActorRecord>,
    kill: watch::Sender<Option<KillOrder>>,
    created: u64,
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
}

impl ActorTable {
    /// Whether the actor is known: a creation that is asked for again (its
    /// caller lost the answer) is done already.
    pub fn contains(&self, id: ActorId) -> bool {
        self.actors.contains_key(&id)
    }

    /// Registers a new actor as pending. Fails when its id is known or its
    /// name is taken by a live actor of its namespace.
    pub fn create(&mut self, spec: ActorSpec) -> Result<(Arc<ActorSpec>, watch::Receiver<Option<KillOrder>>)> {
        if self.actors.contains_key(&spec.id) {
            return Err(Error::AlreadyExists(format!("actor {} exists already", spec.id)));
        }
        let key = (spec.namespace.clone(), spec.name.clone());
        if !spec.name.is_empty() && self.names.contains_key(&key) {
            return Err(Error::AlreadyExists(format!(
                "an actor named '{}' lives in namespace '{}' already",
                spec.name, spec.namespace
            )));
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
        };
        self.actors.insert(spec.id, entry);
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
            .ok_or_else(|| Error::NotFound(format!("no live actor named '{name}' in namespace '{namespace}'")))?;
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

    /// The actor runs at `placement` now.
    pub fn alive(&mut self, id: ActorId, placement: &Placement) {
        self.update(id, |record| {
            record.state = ActorState::Alive as i32;
            record.address = placement.address.clone();
            record.node_id = placement.node_id.as_bytes().to_vec();
            record.pid = placement.pid;
        });
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

    /// The actor is dead for good: its name is free again.
    pub fn dead(&mut self, id: ActorId, kind: ActorDeathKind, cause: &str) {
        let Ok(entry) = self.entry(id) else {
            return;
        };
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
        self.actors
            .get(&id)
            .ok_or_else(|| Error::NotFound(format!("no actor {id}")))
    }

    fn update(&mut self, id: ActorId, change: impl FnOnce(&mut ActorRecord)) {
        if let Some(entry) = self.actors.get(&id) {
            entry.record.send_modify(|record| {
                change(record);
                record.version += 1;
            });
        }
    }
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

    fn placement() -> Placement {
        Placement {
            address: "127.0.0.1:9".into(),
            node_id: NodeId::random(),
            pid: 42,
        }
    }

    #[test]
    fn a_name_is_taken_while_its_actor_lives_and_free_once_it_is_dead() {
        let mut table = ActorTable::default();
        let (first, _) = table.create(spec("counter", 0, false)).unwrap();
        let error = table.create(spec("counter", 0, false)).unwrap_err();
        assert!(error.to_string().contains("named 'counter'"), "{error}");
        assert_eq!(table.named("default", "counter").unwrap().actor_id, first.id.as_bytes());
        table.dead(first.id, ActorDeathKind::Killed, "killed");
        assert!(table.named("default", "counter").is_err());
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
