//! An actor as its worker holds it: the entry of an actor type that
//! `#[raylet::actor]` registers, the state behind the lock its methods take,
//! and the calls of its methods.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::registry::{EntryKind, RegistryError, TaskFuture, TaskOutcome, find_registered};
use crate::task_error::TaskError;

/// How one call of an actor method runs.
pub enum MethodCall {
    /// A sync method: it runs on a thread and takes the actor's lock there.
    Sync(Box<dyn FnOnce() -> TaskOutcome + Send>),
    /// An async method: it takes the actor's lock as it runs.
    Async(TaskFuture),
}

/// A constructed actor, as its worker calls it.
pub trait ActorInstance: Send + Sync {
    /// The call of `method` on encoded arguments; `None` for a method the
    /// actor does not have.
    fn call(&self, method: &str, args: Vec<Bytes>) -> Option<MethodCall>;
}

/// An actor's state behind a lock: `&self` methods share it, `&mut self`
/// methods take it alone.
pub struct ActorCell<T>(RwLock<T>);

impl<T> ActorCell<T> {
    pub async fn read(&self) -> RwLockReadGuard<'_, T> {
        self.0.read().await
    }

    pub async fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.0.write().await
    }

    /// For sync methods: at once when nothing else holds the lock (always,
    /// for an actor that runs one call at a time); otherwise on a thread
    /// that may block, which is where concurrent sync calls run.
    pub fn read_blocking(&self) -> RwLockReadGuard<'_, T> {
        self.0.try_read().unwrap_or_else(|_| self.0.blocking_read())
    }

    pub fn write_blocking(&self) -> RwLockWriteGuard<'_, T> {
        self.0.try_write().unwrap_or_else(|_| self.0.blocking_write())
    }
}

/// The method table `#[raylet::actor]` generates for a type.
pub type Dispatch<T> = fn(&Arc<ActorCell<T>>, &str, Vec<Bytes>) -> Option<MethodCall>;

struct Hosted<T> {
    cell: Arc<ActorCell<T>>,
    dispatch: Dispatch<T>,
}

impl<T: Send + Sync + 'static> ActorInstance for Hosted<T> {
    fn call(&self, method: &str, args: Vec<Bytes>) -> Option<MethodCall> {
        (self.dispatch)(&self.cell, method, args)
    }
}

/// Makes a constructed `state` callable through `dispatch`.
pub fn host<T: Send + Sync + 'static>(state: T, dispatch: Dispatch<T>) -> Arc<dyn ActorInstance> {
    Arc::new(Hosted {
        cell: Arc::new(ActorCell(RwLock::new(state))),
        dispatch,
    })
}

/// What constructing an actor produces.
pub type Constructed = Result<Arc<dyn ActorInstance>, TaskError>;

/// One actor type made with `#[raylet::actor]`, as the registry holds it.
pub struct ActorClass {
    pub construct: fn(Vec<Bytes>) -> Constructed,
}

/// The registered actor type called `name`.
pub(crate) fn lookup_class(name: &str) -> Result<&'static ActorClass, RegistryError> {
    find_registered(EntryKind::ActorClass, name)
}
