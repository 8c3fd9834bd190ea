//! raylet's API on an embedded cluster, one test binary (each test still
//! runs in a process of its own under nextest): tasks, objects, actors and
//! streaming generators.

mod actors;
mod generators;
mod objects;
mod tasks;
