//! Simple row filters for `read_parquet`: a column compared with a value.
//! The planner skips row groups whose statistics (min and max) show that
//! no row can match; the reading task then keeps only the matching rows.

use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, Scalar, StringArray};
use arrow::compute::CastOptions;
use arrow::compute::kernels::cmp;
use arrow::datatypes::DataType;
use serde::{Deserialize, Serialize};

use crate::rows_error::RowsError;

/// How a column is compared with the value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Comparison {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// A value to compare a column with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Value {
    Int(i64),
    Float(f64),
    Text(String),
}

impl From<i64> for Value {
    fn from(value: i64) -> Self {
        Value::Int(value)
    }
}

impl From<f64> for Value {
    fn from(value: f64) -> Self {
        Value::Float(value)
    }
}

impl From<&str> for Value {
    fn from(value: &str) -> Self {
        Value::Text(value.to_string())
    }
}

/// Rows whose `column` compares with `value` as `comparison` says.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Predicate {
    pub column: String,
    pub comparison: Comparison,
    pub value: Value,
}

macro_rules! constructors {
    ($($name:ident => $comparison:ident),*) => {$(
        #[doc = concat!("Rows whose `column` is `", stringify!($comparison), "` `value`.")]
        pub fn $name(column: &str, value: impl Into<Value>) -> Self {
            Predicate { column: column.to_string(), comparison: Comparison::$comparison, value: value.into() }
        }
    )*};
}

impl Predicate {
    constructors!(eq => Eq, ne => Ne, lt => Lt, le => Le, gt => Gt, ge => Ge);

    /// The column (or its statistics) and the value, both of the type
    /// they are compared as: the column's, or Float64 for an integer
    /// column and a fractional value.
    fn operands(&self, column: &ArrayRef) -> Result<(ArrayRef, Scalar<ArrayRef>), RowsError> {
        let error = |source| RowsError::Compare {
            column: self.column.clone(),
            data_type: column.data_type().clone(),
            value: format!("{:?}", self.value),
            source,
        };
        let value: ArrayRef = match &self.value {
            Value::Int(v) => Arc::new(Int64Array::from(vec![*v])),
            Value::Float(v) => Arc::new(Float64Array::from(vec![*v])),
            Value::Text(v) => Arc::new(StringArray::from(vec![v.as_str()])),
        };
        let column = match (&self.value, column.data_type().is_integer()) {
            (Value::Float(_), true) => arrow::compute::cast(column, &DataType::Float64).map_err(error)?,
            _ => column.clone(),
        };
        let strict = CastOptions {
            safe: false,
            ..CastOptions::default()
        };
        let value = arrow::compute::cast_with_options(&value, column.data_type(), &strict).map_err(error)?;
        Ok((column, Scalar::new(value)))
    }

    /// The rows of `batch` that match.
    pub(crate) fn filter(&self, batch: &RecordBatch) -> Result<RecordBatch, RowsError> {
        let column = batch
            .column_by_name(&self.column)
            .ok_or_else(|| RowsError::NoFilterColumn(self.column.clone()))?;
        let (column, value) = self.operands(column)?;
        let keep = match self.comparison {
            Comparison::Eq => cmp::eq(&column, &value),
            Comparison::Ne => cmp::neq(&column, &value),
            Comparison::Lt => cmp::lt(&column, &value),
            Comparison::Le => cmp::lt_eq(&column, &value),
            Comparison::Gt => cmp::gt(&column, &value),
            Comparison::Ge => cmp::gt_eq(&column, &value),
        }
        .map_err(RowsError::arrow("comparing rows with the filter's value"))?;
        arrow::compute::filter_record_batch(batch, &keep).map_err(RowsError::arrow("keeping the matching rows"))
    }

    /// Per row group, whether any of its rows may match, from the column's
    /// minima and maxima (a group without statistics may).
    pub(crate) fn may_match(&self, mins: &ArrayRef, maxes: &ArrayRef) -> Result<Vec<bool>, RowsError> {
        let (mins, value) = self.operands(mins)?;
        let (maxes, _) = self.operands(maxes)?;
        let (mins, maxes) = (&mins, &maxes);
        let all = |array: Result<BooleanArray, _>| {
            array.map_err(RowsError::arrow("comparing statistics with the filter's value"))
        };
        let possible = match self.comparison {
            Comparison::Eq => both(all(cmp::lt_eq(mins, &value))?, all(cmp::gt_eq(maxes, &value))?),
            Comparison::Ne => {
                let min_is = all(cmp::eq(mins, &value))?;
                let max_is = all(cmp::eq(maxes, &value))?;
                let only_value = both(min_is, max_is);
                only_value.iter().map(|only| only.map(|only| !only)).collect()
            }
            Comparison::Lt => all(cmp::lt(mins, &value))?,
            Comparison::Le => all(cmp::lt_eq(mins, &value))?,
            Comparison::Gt => all(cmp::gt(maxes, &value))?,
            Comparison::Ge => all(cmp::gt_eq(maxes, &value))?,
        };
        Ok(possible.iter().map(|may| may.unwrap_or(true)).collect())
    }
}

fn both(a: BooleanArray, b: BooleanArray) -> BooleanArray {
    a.iter()
        .zip(b.iter())
        .map(|(a, b)| match (a, b) {
            (Some(a), Some(b)) => Some(a && b),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_rule_out_groups_and_filters_keep_matching_rows() {
        let mins: ArrayRef = Arc::new(Float64Array::from(vec![Some(0.0), Some(10.0), None]));
        let maxes: ArrayRef = Arc::new(Float64Array::from(vec![Some(9.0), Some(19.0), None]));
        let groups = |p: Predicate| p.may_match(&mins, &maxes).unwrap();
        assert_eq!(groups(Predicate::gt("x", 9.0)), [false, true, true]);
        assert_eq!(groups(Predicate::ge("x", 9.0)), [true, true, true]);
        assert_eq!(groups(Predicate::lt("x", 10_i64)), [true, false, true]);
        assert_eq!(groups(Predicate::eq("x", 12.0)), [false, true, true]);
        let batch = RecordBatch::try_from_iter([("x", Arc::new(Int64Array::from(vec![1, 5, 9])) as ArrayRef)]).unwrap();
        assert_eq!(Predicate::ge("x", 5_i64).filter(&batch).unwrap().num_rows(), 2);
        assert_eq!(Predicate::ne("x", 5.0).filter(&batch).unwrap().num_rows(), 2);
        assert_eq!(
            Predicate::ge("x", 5.5).filter(&batch).unwrap().num_rows(),
            1,
            "compared as floats"
        );
        let error = Predicate::eq("y", 1_i64).filter(&batch).unwrap_err();
        assert!(
            matches!(error, RowsError::NoFilterColumn(ref column) if column == "y"),
            "{error}"
        );
        let error = Predicate::eq("x", "five").filter(&batch).unwrap_err();
        assert!(matches!(error, RowsError::Compare { .. }), "{error}");
        assert!(error.to_string().contains("comparing column x"), "{error}");
    }
}
