//! raylet's attribute macros. `#[raylet::remote]` turns a function into a
//! remote function: it stays callable as it is, and a module of the same
//! name gains `remote(&cluster, args..)` and `options()`; the function is
//! registered at compile time under its module path, for workers to find.
//! `#[raylet::actor]` on a struct and on its impl block makes the type an
//! actor, with a typed handle.

mod actor;
mod remote;
mod returns;

use proc_macro::TokenStream;

/// Makes a type an actor: put it on the struct (which gains a typed
/// `<Name>Handle`) and on its impl block, whose `fn new(..)` is the
/// constructor and whose `&self` / `&mut self` methods, sync or async,
/// become the handle's methods. `<Name>::remote(&cluster, args..)` returns
/// a builder with the actor's options; `spawn()` creates it.
#[proc_macro_attribute]
pub fn actor(attr: TokenStream, item: TokenStream) -> TokenStream {
    match actor::expand(attr.into(), item.into()) {
        Ok(tokens) => tokens.into(),
        Err(error) => error.to_compile_error().into(),
    }
}

/// Makes a function remote. See the `raylet` crate's docs for the options:
/// `num_cpus`, `num_gpus`, `memory`, `resources(NAME = amount, ..)`,
/// `max_retries`, `retry_exceptions`, `name`, `scheduling_strategy`;
/// `num_returns = N` for a function that returns an N-tuple, one object
/// each; `streaming` for a generator, a function that returns
/// `impl Iterator<Item = T>` or `impl Stream<Item = T>`, whose items stream
/// back, with `generator_backpressure = N`.
#[proc_macro_attribute]
pub fn remote(attr: TokenStream, item: TokenStream) -> TokenStream {
    match remote::expand(attr.into(), item.into()) {
        Ok(tokens) => tokens.into(),
        Err(error) => error.to_compile_error().into(),
    }
}
