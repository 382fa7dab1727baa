//! The attributes of `gossamer`; use them through `gossamer::function` and
//! `gossamer::stable_type`, whose docs are the reference. They only write the registration
//! next to the item: every check of types and names happens in `gossamer` itself.

use proc_macro::TokenStream;
use quote::quote;
use syn::spanned::Spanned;
use syn::{FnArg, ItemFn, LitStr, parse_macro_input};

/// Registers a function under a name that holds across builds: `#[gossamer::function("kv.put")]`.
///
/// A function of two arguments, `fn(&mut T, A) -> R`, is applied to a property of type `T`;
/// one of one argument, `fn(A) -> R`, runs in a fiber of the node it is spawned on.
#[proc_macro_attribute]
pub fn function(attr: TokenStream, item: TokenStream) -> TokenStream {
    let name = parse_macro_input!(attr as LitStr);
    let f = parse_macro_input!(item as ItemFn);
    if let Err(e) = check_name(&name) {
        return e.to_compile_error().into();
    }
    if !f.sig.generics.params.is_empty() || f.sig.generics.where_clause.is_some() {
        return error(
            f.sig.generics.span(),
            "a named function cannot be generic: every build must agree on its types",
        );
    }
    if f.sig.asyncness.is_some() || f.sig.unsafety.is_some() || f.sig.variadic.is_some() {
        return error(
            f.sig.span(),
            "a named function must be a plain, safe, synchronous `fn`",
        );
    }
    if let Some(receiver) = f
        .sig
        .inputs
        .iter()
        .find(|a| matches!(a, FnArg::Receiver(_)))
    {
        return error(
            receiver.span(),
            "a named function cannot be a method: write a free `fn`",
        );
    }
    let ident = &f.sig.ident;
    let constructor = match f.sig.inputs.len() {
        2 => quote!(apply),
        1 => quote!(free),
        _ => {
            return error(
                f.sig.inputs.span(),
                "a named function takes the property and one argument \
                 (`fn(&mut T, A) -> R`), or one argument (`fn(A) -> R`); \
                 pass several values as a tuple",
            );
        }
    };
    quote! {
        #f
        ::gossamer::__private::inventory::submit! {
            ::gossamer::__private::Linked(::gossamer::Function::#constructor(#name, #ident))
        }
    }
    .into()
}

/// Names a property type the same way in every build: `#[gossamer::stable_type("kv.Table/3")]`.
///
/// The name goes into the fingerprint of every named function on the type and is checked
/// when a property is looked up by name, so bump its version when the type changes meaning.
#[proc_macro_attribute]
pub fn stable_type(attr: TokenStream, item: TokenStream) -> TokenStream {
    let name = parse_macro_input!(attr as LitStr);
    let input = parse_macro_input!(item as syn::DeriveInput);
    if let Err(e) = check_name(&name) {
        return e.to_compile_error().into();
    }
    if !input.generics.params.is_empty() {
        return error(
            input.generics.span(),
            "a stable type cannot be generic: its one name would stand for many types",
        );
    }
    let ident = &input.ident;
    quote! {
        #input
        impl ::gossamer::StableType for #ident {
            const STABLE_NAME: &'static str = #name;
        }
    }
    .into()
}

/// Names are printable ASCII without spaces, 1 to 255 bytes: they travel in frames and appear in
/// messages.
fn check_name(name: &LitStr) -> syn::Result<()> {
    let value = name.value();
    let ok = !value.is_empty() && value.len() <= 255 && value.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        Ok(())
    } else {
        Err(syn::Error::new(
            name.span(),
            "a name is 1 to 255 printable ASCII characters, without spaces",
        ))
    }
}

fn error(span: proc_macro2::Span, message: &str) -> TokenStream {
    syn::Error::new(span, message).to_compile_error().into()
}
