//! The expansion of `#[raylet::remote]`.

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, FnArg, ItemFn, Lit, Meta, Token};

use crate::returns::{ReturnOptions, Returns, count};

/// Options given in the attribute; each becomes a builder call, except
/// those about what the function returns.
#[derive(Default)]
struct Options {
    calls: Vec<TokenStream>,
    returns: ReturnOptions,
}

impl Options {
    fn parse(attr: TokenStream) -> syn::Result<Self> {
        let metas = Punctuated::<Meta, Token![,]>::parse_terminated.parse2(attr)?;
        let mut options = Options::default();
        for meta in metas {
            options.add(meta)?;
        }
        Ok(options)
    }

    fn add(&mut self, meta: Meta) -> syn::Result<()> {
        let key = meta.path().get_ident().map(|i| i.to_string()).unwrap_or_default();
        match (key.as_str(), meta) {
            ("num_cpus" | "num_gpus" | "memory", Meta::NameValue(nv)) => {
                let method = format_ident!("{}", key);
                let value = number(&nv.value)?;
                self.calls.push(quote! { .#method(#value) });
            }
            ("max_retries", Meta::NameValue(nv)) => {
                let value = &nv.value;
                self.calls.push(quote! { .max_retries(#value) });
            }
            ("retry_exceptions", Meta::NameValue(nv)) => {
                let value = &nv.value;
                self.calls.push(quote! { .retry_exceptions(#value) });
            }
            ("num_returns", Meta::NameValue(nv)) => {
                self.returns.num_returns = Some((count(&nv.value)?, nv.span()));
            }
            ("streaming", Meta::Path(path)) => self.returns.streaming = Some(path.span()),
            ("generator_backpressure", Meta::NameValue(nv)) => {
                let value = &nv.value;
                self.calls.push(quote! { .generator_backpressure(#value) });
            }
            ("name", Meta::NameValue(nv)) => {
                let value = &nv.value;
                self.calls.push(quote! { .name(#value) });
            }
            ("scheduling_strategy", Meta::NameValue(nv)) => {
                let value = &nv.value;
                self.calls.push(quote! { .scheduling_strategy(#value) });
            }
            ("resources", Meta::List(list)) => {
                let pairs = list.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated)?;
                for pair in pairs {
                    let Meta::NameValue(nv) = pair else {
                        return Err(syn::Error::new(pair.span(), "expected NAME = amount"));
                    };
                    let name = nv.path.get_ident().map(|i| i.to_string()).unwrap_or_default();
                    let value = number(&nv.value)?;
                    self.calls.push(quote! { .resource(#name, #value) });
                }
            }
            (_, meta) => {
                return Err(syn::Error::new(
                    meta.span(),
                    "unknown option; expected num_cpus, num_gpus, memory, resources(..), \
                     max_retries, retry_exceptions, name, scheduling_strategy, num_returns, \
                     streaming or generator_backpressure",
                ));
            }
        }
        Ok(())
    }
}

/// A numeric literal as an `f64` expression.
fn number(expr: &Expr) -> syn::Result<TokenStream> {
    match expr {
        Expr::Lit(lit) => match &lit.lit {
            Lit::Int(int) => {
                let value: f64 = int.base10_parse::<u64>()? as f64;
                Ok(quote! { #value })
            }
            Lit::Float(float) => {
                let value: f64 = float.base10_parse()?;
                Ok(quote! { #value })
            }
            other => Err(syn::Error::new(other.span(), "expected a number")),
        },
        other => Ok(quote! { (#other) as f64 }),
    }
}

/// How `Options::remote` submits the call, given what it returns.
fn submit_call(returns: &Returns) -> TokenStream {
    if returns.is_stream() {
        return quote! { cluster.submit_generator(self.0, args) };
    }
    if returns.count().is_some() {
        let tuple = returns.typed_tuple(&quote! { refs });
        return quote! {
            let refs = cluster.submit_task_returns(self.0, args)?;
            ::std::result::Result::Ok(#tuple)
        };
    }
    quote! { cluster.submit_task(self.0, args) }
}

pub(crate) fn expand(attr: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let options = Options::parse(attr)?;
    let function: ItemFn = syn::parse2(item)?;
    let signature = &function.sig;
    if !signature.generics.params.is_empty() {
        return Err(syn::Error::new(
            signature.generics.span(),
            "remote functions cannot be generic",
        ));
    }
    let mut arg_names = Vec::new();
    let mut arg_types = Vec::new();
    for (index, input) in signature.inputs.iter().enumerate() {
        let FnArg::Typed(typed) = input else {
            return Err(syn::Error::new(input.span(), "remote functions cannot take self"));
        };
        arg_names.push(format_ident!("arg{}", index));
        arg_types.push(typed.ty.as_ref().clone());
    }
    let vis = &function.vis;
    let ident = &signature.ident;
    let returns = Returns::parse(&signature.output, &options.returns)?;
    let arity = arg_names.len();
    let indices = 0..arity;
    let call = if signature.asyncness.is_some() {
        quote! { super::#ident(#(#arg_names),*).await }
    } else {
        quote! { super::#ident(#(#arg_names),*) }
    };
    let finish = returns.finish(&quote! { NAME });
    let caller_type = returns.caller_type();
    let submit = submit_call(&returns);
    let stream_options = match returns.is_stream() {
        true => quote! {
            /// Items the generator may send ahead of the caller (default
            /// 64; 0 for no bound).
            pub fn generator_backpressure(self, items: u64) -> Self { Options(self.0.generator_backpressure(items)) }
        },
        false => TokenStream::new(),
    };
    let invoke_body = quote! {
        ::raylet::__private::check_arity(NAME, &args, #arity)?;
        #( let #arg_names: #arg_types = ::raylet::__private::decode_arg(NAME, #indices, &args[#indices])?; )*
        let output = #call;
        #finish
    };
    let invoke = if signature.asyncness.is_some() {
        quote! {
            fn invoke(args: ::std::vec::Vec<::raylet::__private::Bytes>) -> ::raylet::__private::TaskFuture {
                ::std::boxed::Box::pin(async move { #invoke_body })
            }
            const INVOKE: ::raylet::__private::Invoke = ::raylet::__private::Invoke::Async(invoke);
        }
    } else {
        quote! {
            fn invoke(args: ::std::vec::Vec<::raylet::__private::Bytes>) -> ::raylet::__private::TaskOutcome {
                #invoke_body
            }
            const INVOKE: ::raylet::__private::Invoke = ::raylet::__private::Invoke::Sync(invoke);
        }
    };
    let mut defaults = options.calls.clone();
    if let Some(count) = returns.count() {
        defaults.push(quote! { .num_returns(#count) });
    }
    let doc = format!("Remote calls of [`{ident}`](fn@{ident}).");
    Ok(quote! {
        #function

        #[doc = #doc]
        #[allow(non_snake_case, unused_imports, clippy::too_many_arguments)]
        #vis mod #ident {
            use super::*;

            /// The name this function is registered under.
            pub const NAME: &str = module_path!();

            /// Submits a call with the options given in the attribute.
            pub fn remote(
                cluster: &::raylet::Cluster,
                #( #arg_names: impl ::raylet::IntoArg<#arg_types> ),*
            ) -> ::raylet::Result<#caller_type> {
                options().remote(cluster, #(#arg_names),*)
            }

            /// Options for one call, starting from the attribute's.
            pub fn options() -> Options {
                Options(::raylet::TaskOptions::new(NAME) #(#defaults)*)
            }

            /// Per-call options of this remote function.
            #[must_use]
            pub struct Options(::raylet::TaskOptions);

            impl Options {
                pub fn num_cpus(self, amount: f64) -> Self { Options(self.0.num_cpus(amount)) }
                pub fn num_gpus(self, amount: f64) -> Self { Options(self.0.num_gpus(amount)) }
                pub fn memory(self, bytes: f64) -> Self { Options(self.0.memory(bytes)) }
                pub fn resource(self, name: &str, amount: f64) -> Self { Options(self.0.resource(name, amount)) }
                pub fn max_retries(self, retries: u32) -> Self { Options(self.0.max_retries(retries)) }
                pub fn retry_exceptions(self, retry: bool) -> Self { Options(self.0.retry_exceptions(retry)) }
                pub fn name(self, name: &str) -> Self { Options(self.0.name(name)) }
                pub fn scheduling_strategy(self, strategy: ::raylet::SchedulingStrategy) -> Self {
                    Options(self.0.scheduling_strategy(strategy))
                }
                pub fn label_selector(self, key: &str, expression: &str) -> Self {
                    Options(self.0.label_selector(key, expression))
                }
                pub fn placement_group(self, group: &::raylet::PlacementGroup, bundle: Option<u32>) -> Self {
                    Options(self.0.placement_group(group, bundle))
                }
                #stream_options

                /// Submits the call; arguments are values or `ObjectRef`s.
                pub fn remote(
                    self,
                    cluster: &::raylet::Cluster,
                    #( #arg_names: impl ::raylet::IntoArg<#arg_types> ),*
                ) -> ::raylet::Result<#caller_type> {
                    let args = ::std::vec![ #( ::raylet::IntoArg::into_arg(#arg_names)? ),* ];
                    #submit
                }
            }

            #invoke

            ::raylet::__register!(RemoteFunction, || NAME, &INVOKE);
        }
    })
}
