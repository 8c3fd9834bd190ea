//! The expansion of `#[raylet::actor]`. On a struct it adds the typed
//! handle `<Name>Handle`. On the struct's impl block it adds
//! `<Name>::remote(&cluster, args..)`, a handle method per method that takes
//! `&self` or `&mut self`, the method table the worker calls through, and
//! the registration under the type's module path.

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::spanned::Spanned;
use syn::{FnArg, ImplItem, ImplItemFn, Item, ItemImpl, ItemStruct, Type};

use crate::returns::{ReturnOptions, Returns, count, value_type};

pub(crate) fn expand(attr: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    if !attr.is_empty() {
        return Err(syn::Error::new(
            attr.span(),
            "#[raylet::actor] takes no options; set them on the builder that remote() returns",
        ));
    }
    match syn::parse2::<Item>(item)? {
        Item::Struct(item) => Ok(expand_struct(item)),
        Item::Impl(item) => expand_impl(item),
        other => Err(syn::Error::new(
            other.span(),
            "#[raylet::actor] goes on a struct and on its impl block",
        )),
    }
}

/// The struct, and its typed handle.
fn expand_struct(item: ItemStruct) -> TokenStream {
    let vis = &item.vis;
    let ident = &item.ident;
    let handle = format_ident!("{}Handle", ident);
    let doc = format!("A handle to a [`{ident}`] actor: its methods call the actor.");
    quote! {
        #item

        #[doc = #doc]
        #[derive(Clone, Debug, PartialEq, Eq)]
        #vis struct #handle(::raylet::ActorHandle);

        impl ::std::convert::From<::raylet::ActorHandle> for #handle {
            fn from(handle: ::raylet::ActorHandle) -> Self {
                #handle(handle)
            }
        }

        impl ::std::convert::AsRef<::raylet::ActorHandle> for #handle {
            fn as_ref(&self) -> &::raylet::ActorHandle {
                &self.0
            }
        }

        impl ::std::ops::Deref for #handle {
            type Target = ::raylet::ActorHandle;
            fn deref(&self) -> &::raylet::ActorHandle {
                &self.0
            }
        }

        impl ::raylet::__private::serde::Serialize for #handle {
            fn serialize<S: ::raylet::__private::serde::Serializer>(&self, serializer: S) -> ::std::result::Result<S::Ok, S::Error> {
                ::raylet::__private::serde::Serialize::serialize(&self.0, serializer)
            }
        }

        impl<'de> ::raylet::__private::serde::Deserialize<'de> for #handle {
            fn deserialize<D: ::raylet::__private::serde::Deserializer<'de>>(deserializer: D) -> ::std::result::Result<Self, D::Error> {
                ::raylet::__private::serde::Deserialize::deserialize(deserializer).map(#handle)
            }
        }
    }
}

/// A method of the actor as its handle and its method table see it.
struct Method {
    ident: syn::Ident,
    arg_names: Vec<syn::Ident>,
    arg_types: Vec<Type>,
    returns: Returns,
    /// A generator's bound on items sent ahead, when the method sets one.
    backpressure: Option<syn::Expr>,
    mutable: bool,
    asynchronous: bool,
}

impl Method {
    /// The method, if `function` is one (it takes `&self` or `&mut self`);
    /// its `#[raylet::method(..)]` attribute is taken off.
    fn parse(function: &mut ImplItemFn) -> syn::Result<Option<Self>> {
        let options = take_method_options(&mut function.attrs)?;
        let signature = &function.sig;
        let Some(FnArg::Receiver(receiver)) = signature.inputs.first() else {
            return Ok(None);
        };
        if receiver.reference.is_none() {
            return Err(syn::Error::new(
                receiver.span(),
                "actor methods take &self or &mut self",
            ));
        }
        if !signature.generics.params.is_empty() {
            return Err(syn::Error::new(
                signature.generics.span(),
                "actor methods cannot be generic",
            ));
        }
        let (arg_names, arg_types) = typed_args(signature.inputs.iter().skip(1))?;
        let returns = Returns::parse(&signature.output, &options)?;
        Ok(Some(Method {
            ident: signature.ident.clone(),
            arg_names,
            arg_types,
            returns,
            backpressure: options.backpressure,
            mutable: receiver.mutability.is_some(),
            asynchronous: signature.asyncness.is_some(),
        }))
    }

    /// The handle's method: encodes the arguments and submits the call.
    fn handle_method(&self) -> TokenStream {
        let Method {
            ident,
            arg_names,
            arg_types,
            returns,
            backpressure,
            ..
        } = self;
        let name = ident.to_string();
        let doc = format!("Calls `{name}` on the actor.");
        let backpressure = match backpressure {
            Some(items) => quote! { ::std::option::Option::Some(#items) },
            None => quote! { ::std::option::Option::None },
        };
        let caller_type = returns.caller_type();
        let (output, call) = match returns.count() {
            Some(count) => {
                let tuple = returns.typed_tuple(&quote! { refs });
                (
                    caller_type,
                    quote! { let refs = self.0.call_returns(#name, args, #count); #tuple },
                )
            }
            None if returns.is_stream() => (
                quote! { ::raylet::Result<#caller_type> },
                quote! { self.0.call_generator(#name, args, #backpressure) },
            ),
            None => (caller_type, quote! { self.0.call(#name, args) }),
        };
        quote! {
            #[doc = #doc]
            #[allow(clippy::too_many_arguments)]
            pub fn #ident(&self, #( #arg_names: impl ::raylet::IntoArg<#arg_types> ),*) -> #output {
                let args = (|| -> ::raylet::Result<::std::vec::Vec<::raylet::Arg>> {
                    ::std::result::Result::Ok(::std::vec![ #( ::raylet::IntoArg::into_arg(#arg_names)? ),* ])
                })();
                #call
            }
        }
    }

    /// The method table's arm: decodes the arguments, takes the lock and calls.
    fn dispatch_arm(&self) -> TokenStream {
        let Method {
            ident,
            arg_names,
            arg_types,
            returns,
            mutable,
            asynchronous,
            ..
        } = self;
        let name = ident.to_string();
        let arity = arg_names.len();
        let indices = 0..arity;
        let decode = quote! {
            ::raylet::__private::check_arity("", &args, #arity)?;
            #( let #arg_names: #arg_types = ::raylet::__private::decode_arg("", #indices, &args[#indices])?; )*
        };
        let finish = returns.finish(&quote! { "" });
        let call = match asynchronous {
            true => quote! { state.#ident(#(#arg_names),*).await },
            false => quote! { state.#ident(#(#arg_names),*) },
        };
        if *asynchronous {
            let lock = match mutable {
                true => quote! { let mut state = cell.write().await; },
                false => quote! { let state = cell.read().await; },
            };
            return quote! {
                #name => {
                    let cell = cell.clone();
                    ::std::option::Option::Some(::raylet::__private::MethodCall::Async(::std::boxed::Box::pin(async move {
                        #decode
                        #lock
                        let output = #call;
                        #finish
                    })))
                }
            };
        }
        let lock = match mutable {
            true => quote! { let mut state = cell.write_blocking(); },
            false => quote! { let state = cell.read_blocking(); },
        };
        quote! {
            #name => {
                let cell = cell.clone();
                ::std::option::Option::Some(::raylet::__private::MethodCall::Sync(::std::boxed::Box::new(move || {
                    #decode
                    #lock
                    let output = #call;
                    #finish
                })))
            }
        }
    }
}

/// Takes `#[raylet::method(num_returns = N)]` or
/// `#[raylet::method(streaming, generator_backpressure = N)]` off a method.
fn take_method_options(attrs: &mut Vec<syn::Attribute>) -> syn::Result<ReturnOptions> {
    let mut options = ReturnOptions::default();
    let mut kept = Vec::with_capacity(attrs.len());
    for attr in attrs.drain(..) {
        if attr
            .path()
            .segments
            .last()
            .is_none_or(|segment| segment.ident != "method")
        {
            kept.push(attr);
            continue;
        }
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("streaming") {
                options.streaming = Some(meta.path.span());
                return Ok(());
            }
            if meta.path.is_ident("num_returns") {
                let value: syn::Expr = meta.value()?.parse()?;
                options.num_returns = Some((count(&value)?, value.span()));
                return Ok(());
            }
            if meta.path.is_ident("generator_backpressure") {
                options.backpressure = Some(meta.value()?.parse()?);
                return Ok(());
            }
            Err(meta.error("expected num_returns = N, streaming or generator_backpressure = N"))
        })?;
    }
    *attrs = kept;
    Ok(options)
}

fn typed_args<'a>(inputs: impl Iterator<Item = &'a FnArg>) -> syn::Result<(Vec<syn::Ident>, Vec<Type>)> {
    let mut names = Vec::new();
    let mut types = Vec::new();
    for (index, input) in inputs.enumerate() {
        let FnArg::Typed(typed) = input else {
            return Err(syn::Error::new(input.span(), "unexpected receiver"));
        };
        names.push(format_ident!("arg{}", index));
        types.push(typed.ty.as_ref().clone());
    }
    Ok((names, types))
}

/// The constructor: `fn new(..) -> Self` or `-> Result<Self, E>`.
struct Constructor {
    arg_names: Vec<syn::Ident>,
    arg_types: Vec<Type>,
    fallible: bool,
}

impl Constructor {
    fn find(item: &ItemImpl) -> syn::Result<Self> {
        let new = item.items.iter().find_map(|item| match item {
            ImplItem::Fn(function) if function.sig.ident == "new" => Some(function),
            _ => None,
        });
        let Some(new) = new else {
            return Err(syn::Error::new(
                item.self_ty.span(),
                "an actor needs a constructor: fn new(..) -> Self or -> Result<Self, E>",
            ));
        };
        if new.sig.asyncness.is_some() || matches!(new.sig.inputs.first(), Some(FnArg::Receiver(_))) {
            return Err(syn::Error::new(
                new.sig.span(),
                "the constructor is a plain fn new(..) without self",
            ));
        }
        let (arg_names, arg_types) = typed_args(new.sig.inputs.iter())?;
        let fallible = value_type(&new.sig.output).1;
        Ok(Constructor {
            arg_names,
            arg_types,
            fallible,
        })
    }
}

/// The impl block, `remote()`, the handle's methods, the method table and
/// the registration.
fn expand_impl(mut item: ItemImpl) -> syn::Result<TokenStream> {
    if !item.generics.params.is_empty() || item.trait_.is_some() {
        return Err(syn::Error::new(
            item.span(),
            "#[raylet::actor] goes on the inherent impl block of a type without generics",
        ));
    }
    let Type::Path(self_path) = item.self_ty.as_ref() else {
        return Err(syn::Error::new(item.self_ty.span(), "expected the actor's type name"));
    };
    let ident = self_path
        .path
        .get_ident()
        .ok_or_else(|| syn::Error::new(self_path.span(), "expected the actor's type name"))?
        .clone();
    let handle = format_ident!("{}Handle", ident);
    let module = format_ident!("__raylet_actor_{}", ident);
    let class = ident.to_string();
    let constructor = Constructor::find(&item)?;
    let mut methods = Vec::new();
    for member in &mut item.items {
        if let ImplItem::Fn(function) = member
            && let Some(method) = Method::parse(function)?
        {
            methods.push(method);
        }
    }
    let Constructor {
        arg_names,
        arg_types,
        fallible,
    } = &constructor;
    let arity = arg_names.len();
    let indices = 0..arity;
    let construct = match fallible {
        true => quote! {
            <#ident>::new(#(#arg_names),*).map_err(|error| ::raylet::__private::application_error("", error))?
        },
        false => quote! { <#ident>::new(#(#arg_names),*) },
    };
    let handle_methods = methods.iter().map(Method::handle_method);
    let arms = methods.iter().map(Method::dispatch_arm);
    let remote_doc = format!("Creates a `{class}` actor: set its options on the builder, then `spawn()` it.");
    Ok(quote! {
        #item

        impl #ident {
            #[doc = #remote_doc]
            pub fn remote(
                cluster: &::raylet::Cluster,
                #( #arg_names: impl ::raylet::IntoArg<#arg_types> ),*
            ) -> ::raylet::ActorBuilder<#handle> {
                let args = (|| -> ::raylet::Result<::std::vec::Vec<::raylet::Arg>> {
                    ::std::result::Result::Ok(::std::vec![ #( ::raylet::IntoArg::into_arg(#arg_names)? ),* ])
                })();
                ::raylet::ActorBuilder::new(cluster, <#ident as ::raylet::Actor>::CLASS, args)
            }
        }

        impl ::raylet::Actor for #ident {
            const CLASS: &'static str = ::std::concat!(::std::module_path!(), "::", #class);
            type Handle = #handle;
        }

        impl #handle {
            #( #handle_methods )*
        }

        #[doc(hidden)]
        #[allow(non_snake_case, unused_imports)]
        mod #module {
            use super::*;

            fn construct(args: ::std::vec::Vec<::raylet::__private::Bytes>) -> ::raylet::__private::Constructed {
                ::raylet::__private::check_arity("", &args, #arity)?;
                #( let #arg_names: #arg_types = ::raylet::__private::decode_arg("", #indices, &args[#indices])?; )*
                let state = #construct;
                ::std::result::Result::Ok(::raylet::__private::host(state, dispatch))
            }

            fn dispatch(
                cell: &::std::sync::Arc<::raylet::__private::ActorCell<#ident>>,
                method: &str,
                args: ::std::vec::Vec<::raylet::__private::Bytes>,
            ) -> ::std::option::Option<::raylet::__private::MethodCall> {
                match method {
                    #( #arms )*
                    _ => ::std::option::Option::None,
                }
            }

            ::raylet::__register!(
                ActorClass,
                || <#ident as ::raylet::Actor>::CLASS,
                &::raylet::__private::ActorClass { construct }
            );
        }
    })
}
