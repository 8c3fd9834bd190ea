//! What a remote function or actor method returns to its caller: one
//! object, several (`num_returns = N` on an N-tuple), or a stream of items
//! (`streaming`, on a function that returns an iterator or a stream).

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::spanned::Spanned;
use syn::{Expr, GenericArgument, Lit, PathArguments, ReturnType, Type, TypeParamBound};

/// How a call's output reaches its caller.
pub(crate) enum Returns {
    /// One object of `value`.
    One { value: Type, fallible: bool },
    /// One object per element of a tuple.
    Many { values: Vec<Type>, fallible: bool },
    /// A generator's items: `Result`s when `fallible_items`; from a
    /// `Stream` when `stream`, else from an iterator.
    Items {
        item: Type,
        fallible_items: bool,
        stream: bool,
    },
}

/// What the attribute asks of the return value.
#[derive(Default)]
pub(crate) struct ReturnOptions {
    pub(crate) num_returns: Option<(u32, Span)>,
    pub(crate) streaming: Option<Span>,
    /// A generator method's bound on items sent ahead of its caller.
    pub(crate) backpressure: Option<syn::Expr>,
}

impl Returns {
    pub(crate) fn parse(output: &ReturnType, options: &ReturnOptions) -> syn::Result<Self> {
        if let (Some((_, span)), Some(_)) = (options.num_returns, options.streaming) {
            return Err(syn::Error::new(
                span,
                "a generator returns a stream: num_returns does not apply",
            ));
        }
        if options.streaming.is_some() {
            return Self::items(output);
        }
        let (value, fallible) = value_type(output);
        match options.num_returns {
            None | Some((1, _)) => Ok(Returns::One { value, fallible }),
            Some((count, span)) => {
                let Type::Tuple(tuple) = &value else {
                    return Err(syn::Error::new(
                        value.span(),
                        format!("num_returns = {count} needs a tuple of {count} values as the return type"),
                    ));
                };
                if tuple.elems.len() != count as usize || !(2..=8).contains(&count) {
                    return Err(syn::Error::new(
                        span,
                        format!(
                            "num_returns = {count}, but the function returns a tuple of {} (2 to 8 values)",
                            tuple.elems.len()
                        ),
                    ));
                }
                Ok(Returns::Many {
                    values: tuple.elems.iter().cloned().collect(),
                    fallible,
                })
            }
        }
    }

    /// A generator's items, from `impl Iterator<Item = T>` or
    /// `impl Stream<Item = T>` (boxed trait objects too).
    fn items(output: &ReturnType) -> syn::Result<Self> {
        let ReturnType::Type(_, ty) = output else {
            return Err(syn::Error::new(
                output.span(),
                "a streaming function returns an iterator or a stream",
            ));
        };
        let (trait_name, item) = item_of(ty).ok_or_else(|| {
            syn::Error::new(
                ty.span(),
                "a streaming function returns `impl Iterator<Item = T>` or `impl Stream<Item = T>`",
            )
        })?;
        let (value, fallible_items) = value_type(&syn::parse_quote!(-> #item));
        Ok(Returns::Items {
            item: value,
            fallible_items,
            stream: trait_name == "Stream",
        })
    }

    /// The type the caller gets from `remote`.
    pub(crate) fn caller_type(&self) -> TokenStream {
        match self {
            Returns::One { value, .. } => quote! { ::raylet::ObjectRef<#value> },
            Returns::Many { values, .. } => quote! { ( #( ::raylet::ObjectRef<#values>, )* ) },
            Returns::Items { item, .. } => quote! { ::raylet::ObjectRefStream<#item> },
        }
    }

    /// Encodes `output`, the value the function returned, as a task outcome.
    pub(crate) fn finish(&self, function: &TokenStream) -> TokenStream {
        match self {
            Returns::One { fallible: true, .. } => quote! { ::raylet::__private::encode_result(#function, output) },
            Returns::One { fallible: false, .. } => quote! { ::raylet::__private::encode_value(#function, &output) },
            Returns::Many { fallible: true, .. } => {
                quote! { ::raylet::__private::encode_returns_result(#function, output) }
            }
            Returns::Many { fallible: false, .. } => {
                quote! { ::raylet::__private::encode_returns(#function, &output) }
            }
            Returns::Items {
                fallible_items, stream, ..
            } => match (stream, fallible_items) {
                (false, true) => quote! { ::raylet::__private::iterate(#function, output) },
                (false, false) => quote! { ::raylet::__private::iterate_values(#function, output) },
                (true, true) => quote! { ::raylet::__private::stream(#function, output) },
                (true, false) => quote! { ::raylet::__private::stream_values(#function, output) },
            },
        }
    }

    /// How many objects the call returns, for a call of several.
    pub(crate) fn count(&self) -> Option<u32> {
        match self {
            Returns::Many { values, .. } => Some(values.len() as u32),
            _ => None,
        }
    }

    pub(crate) fn is_stream(&self) -> bool {
        matches!(self, Returns::Items { .. })
    }

    /// Turns the untyped references of a call of several into the tuple.
    pub(crate) fn typed_tuple(&self, refs: &TokenStream) -> TokenStream {
        let Returns::Many { values, .. } = self else {
            return refs.clone();
        };
        let typed = values.iter().map(|value| {
            quote! { ::raylet::AnyObjectRef::typed::<#value>(refs.next().expect("one reference per return")) }
        });
        quote! {{
            let mut refs = ::std::iter::IntoIterator::into_iter(#refs);
            ( #( #typed, )* )
        }}
    }
}

/// The trait (`Iterator`, `IntoIterator` or `Stream`) and its `Item` in
/// `impl Trait<Item = T>` or `Box<dyn Trait<Item = T>>`.
fn item_of(ty: &Type) -> Option<(String, Type)> {
    let bounds = match ty {
        Type::ImplTrait(found) => &found.bounds,
        Type::TraitObject(found) => &found.bounds,
        Type::Path(path) => {
            let last = path.path.segments.last()?;
            let PathArguments::AngleBracketed(args) = &last.arguments else {
                return None;
            };
            return args.args.iter().find_map(|arg| match arg {
                GenericArgument::Type(inner) if last.ident == "Box" || last.ident == "Pin" => item_of(inner),
                _ => None,
            });
        }
        _ => return None,
    };
    bounds.iter().find_map(|bound| {
        let TypeParamBound::Trait(bound) = bound else {
            return None;
        };
        let last = bound.path.segments.last()?;
        let name = last.ident.to_string();
        if !matches!(name.as_str(), "Iterator" | "IntoIterator" | "Stream") {
            return None;
        }
        let PathArguments::AngleBracketed(args) = &last.arguments else {
            return None;
        };
        args.args.iter().find_map(|arg| match arg {
            GenericArgument::AssocType(assoc) if assoc.ident == "Item" => Some((name.clone(), assoc.ty.clone())),
            _ => None,
        })
    })
}

/// `num_returns`'s value: an integer literal.
pub(crate) fn count(expr: &Expr) -> syn::Result<u32> {
    match expr {
        Expr::Lit(lit) => match &lit.lit {
            Lit::Int(int) => int.base10_parse(),
            other => Err(syn::Error::new(other.span(), "expected a count")),
        },
        other => Err(syn::Error::new(other.span(), "expected a count")),
    }
}

/// `Result<R, E>` or `Result<R>` (by last path segment): the value type and
/// whether the function can fail.
pub(crate) fn value_type(output: &ReturnType) -> (Type, bool) {
    let Type::Path(path) = (match output {
        ReturnType::Default => return (syn::parse_quote!(()), false),
        ReturnType::Type(_, ty) => ty.as_ref().clone(),
    }) else {
        let ReturnType::Type(_, ty) = output else {
            unreachable!()
        };
        return (ty.as_ref().clone(), false);
    };
    let last = path.path.segments.last();
    if let Some(segment) = last.filter(|s| s.ident == "Result")
        && let PathArguments::AngleBracketed(args) = &segment.arguments
        && let Some(GenericArgument::Type(value)) = args.args.first()
    {
        return (value.clone(), true);
    }
    (Type::Path(path), false)
}
