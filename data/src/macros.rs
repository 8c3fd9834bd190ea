//! The `register_*!` macros, through which a binary's functions and models
//! become known to its workers, and `__private`, the paths their
//! expansions name.

/// What the registration macros expand to. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use raylet;

    pub use crate::model_registry::RegisteredModel;
    pub use crate::registry::{
        RegisteredFn, apply_arrow_batches, apply_batches, apply_filter, apply_flat_map, apply_map,
    };
    pub use crate::stage::StageKind;
}

#[doc(hidden)]
#[macro_export]
macro_rules! __register_data_fn {
    ($function:path, $kind:ident, $adapter:ident) => {
        $crate::__private::raylet::__register!(
            DataFunction,
            || ::std::any::type_name_of_val(&$function),
            &$crate::__private::RegisteredFn {
                kind: $crate::__private::StageKind::$kind,
                apply: |rows, run| $crate::__private::$adapter(rows, run, $function),
            }
        );
    };
}

/// Registers `fn(In) -> Result<Out, E>` for [`Dataset::map`](crate::Dataset::map).
#[macro_export]
macro_rules! register_map {
    ($function:path) => {
        $crate::__register_data_fn!($function, Map, apply_map);
    };
}

/// Registers `fn(In) -> Result<Vec<Out>, E>` for [`Dataset::flat_map`](crate::Dataset::flat_map).
#[macro_export]
macro_rules! register_flat_map {
    ($function:path) => {
        $crate::__register_data_fn!($function, FlatMap, apply_flat_map);
    };
}

/// Registers `fn(&Row) -> bool` for [`Dataset::filter`](crate::Dataset::filter).
#[macro_export]
macro_rules! register_filter {
    ($function:path) => {
        $crate::__register_data_fn!($function, Filter, apply_filter);
    };
}

/// Registers `fn(Vec<In>) -> Result<Vec<Out>, E>` for
/// [`Dataset::map_batches`](crate::Dataset::map_batches).
#[macro_export]
macro_rules! register_batch_fn {
    ($function:path) => {
        $crate::__register_data_fn!($function, MapBatches, apply_batches);
    };
}

/// Registers `fn(RecordBatch) -> Result<RecordBatch, E>` for
/// [`Dataset::map_arrow_batches`](crate::Dataset::map_arrow_batches).
#[macro_export]
macro_rules! register_arrow_fn {
    ($function:path) => {
        $crate::__register_data_fn!($function, MapArrowBatches, apply_arrow_batches);
    };
}

/// Registers a [`BatchModel`](crate::BatchModel) type for
/// [`Dataset::map_batches_with`](crate::Dataset::map_batches_with).
#[macro_export]
macro_rules! register_batch_model {
    ($model:ty) => {
        $crate::__private::raylet::__register!(
            BatchModel,
            ::std::any::type_name::<$model>,
            &$crate::__private::RegisteredModel::of::<$model>()
        );
    };
}
