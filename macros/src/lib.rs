//! raylet's attribute macros. `#[raylet::remote]` turns a function into a
//! remote function: it stays callable as it is, and a module of the same
//! name gains `remote(&cluster, args..)` and `options()`; the function is
//! registered at compile time under its module path, for workers to find.

mod remote;

use proc_macro::TokenStream;

/// Makes a function remote. See the `raylet` crate's docs for the options:
/// `num_cpus`, `num_gpus`, `memory`, `resources(NAME = amount, ..)`,
/// `max_retries`, `retry_exceptions`, `name`.
#[proc_macro_attribute]
pub fn remote(attr: TokenStream, item: TokenStream) -> TokenStream {
    match remote::expand(attr.into(), item.into()) {
        Ok(tokens) => tokens.into(),
        Err(error) => error.to_compile_error().into(),
    }
}
