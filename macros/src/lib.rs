//! raylet's attribute macros. `#[raylet::remote]` turns a function into a
//! remote function: it stays callable as it is, and a module of the same
//! name gains `remote(&cluster, args..)` and `options()`; the function is
//! registered at compile time under its module path, for workers to find.
//! `#[raylet::actor]` on a struct and on its impl block makes the type an
//! actor, with a typed handle.

mod actor;
mod remote;

use proc_macro::TokenStream;

/// Makes a function remote. See the `raylet` crate's docs for the options:
/// `num_cpus`, `num_gpus`, `memory`, `resources(NAME = amount, ..)`,
/// `max_retries`, `retry_exceptions`, `name`.
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

#[proc_macro_attribute]
pub fn remote(attr: TokenStream, item: TokenStream) -> TokenStream {
    match remote::expand(attr.into(), item.into()) {
        Ok(tokens) => tokens.into(),
        Err(error) => error.to_compile_error().into(),
    }
}
