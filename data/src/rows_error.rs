//! What can go wrong working on a block's rows in its task: encoding and
//! decoding them, Arrow's kernels over them (joining, picking, comparing,
//! sorting, aggregating), and columns that are not there or not of the
//! kind a step needs. Each variant says what the step was doing.

use arrow::error::ArrowError;

/// A failure over a block's rows.
#[derive(Debug, thiserror::Error)]
pub enum RowsError {
    /// An Arrow kernel failed; `doing` says what for.
    #[error("{doing}: {source}")]
    Arrow {
        doing: &'static str,
        #[source]
        source: ArrowError,
    },
    /// Rows could not be encoded or decoded one by one.
    #[error("{doing}: {source}")]
    Codec {
        doing: &'static str,
        #[source]
        source: raylet::codec::Error,
    },
    #[error("reading rows as {type_name} from columns {columns:?}: {source}")]
    FromColumns {
        type_name: &'static str,
        columns: Vec<String>,
        #[source]
        source: serde_arrow::Error,
    },
    #[error("the Arrow columns of {type_name}: {source}")]
    ColumnTypes {
        type_name: &'static str,
        #[source]
        source: serde_arrow::Error,
    },
    #[error("rows to Arrow columns: {0}")]
    ToColumns(#[source] serde_arrow::Error),
    /// Typed rows met Arrow rows where one kind was needed.
    #[error("{doing} typed rows with Arrow rows")]
    MixedKinds { doing: &'static str },
    #[error("joining rows of different columns: {left:?} and {right:?}")]
    ColumnsDiffer { left: Vec<String>, right: Vec<String> },
    #[error("zipping blocks of {left} and {right} rows")]
    LengthsDiffer { left: usize, right: usize },
    #[error("no column {column} (its columns: {})", columns.join(", "))]
    NoColumn { column: String, columns: Vec<String> },
    #[error("sorting or grouping by column {0} needs Arrow rows (read_parquet, read_csv), not typed ones")]
    KeysNotArrow(String),
    #[error("aggregating column {column}: {source}")]
    Aggregate {
        column: String,
        #[source]
        source: ArrowError,
    },
    #[error("no column {0} to filter on")]
    NoFilterColumn(String),
    #[error("comparing column {column} ({data_type}) with {value}: {source}")]
    Compare {
        column: String,
        data_type: arrow::datatypes::DataType,
        value: String,
        #[source]
        source: ArrowError,
    },
    #[error(transparent)]
    NotRegistered(#[from] raylet::RegistryError),
    /// A groupby's function failed on a group: its message.
    #[error("{0}")]
    GroupFunction(String),
}

impl RowsError {
    /// An error of Arrow's while `doing` something.
    pub(crate) fn arrow(doing: &'static str) -> impl Fn(ArrowError) -> RowsError + Copy {
        move |source| RowsError::Arrow { doing, source }
    }

    /// An error of the codec's while `doing` something.
    pub(crate) fn codec(doing: &'static str) -> impl Fn(raylet::codec::Error) -> RowsError + Copy {
        move |source| RowsError::Codec { doing, source }
    }
}

/// The names of a schema's columns, for errors.
pub(crate) fn column_names(schema: &arrow_schema::Schema) -> Vec<String> {
    schema.fields().iter().map(|f| f.name().clone()).collect()
}
