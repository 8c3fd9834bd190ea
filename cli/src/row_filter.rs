//! `raylet list --filter KEY=VALUE` (or `KEY!=VALUE`): which listed rows to
//! keep, by a top-level field of their JSON form, as `ray list --filter`.
//! Strings compare without case (`state=alive`), other values by their JSON
//! text (`is_head_node=true`, `restarts=0`).

use anyhow::bail;
use serde::Serialize;
use serde_json::Value;

/// Why a `--filter` was refused.
#[derive(Debug, thiserror::Error)]
pub enum RowFilterError {
    #[error("{0:?} is not KEY=VALUE or KEY!=VALUE")]
    NotKeyValue(String),
    #[error("{0:?} names no field")]
    NoField(String),
}

/// One `--filter` predicate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowFilter {
    key: String,
    value: String,
    equal: bool,
}

impl RowFilter {
    /// Parses `KEY=VALUE` or `KEY!=VALUE`.
    pub fn parse(text: &str) -> Result<Self, RowFilterError> {
        let (key, value, equal) = match (text.split_once("!="), text.split_once('=')) {
            (Some((key, value)), _) => (key, value, false),
            (None, Some((key, value))) => (key, value, true),
            (None, None) => return Err(RowFilterError::NotKeyValue(text.to_string())),
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(RowFilterError::NoField(text.to_string()));
        }
        Ok(RowFilter {
            key: key.to_string(),
            value: value.trim().to_string(),
            equal,
        })
    }

    fn holds(&self, field: &Value) -> bool {
        let matches = match field {
            Value::String(text) => text.eq_ignore_ascii_case(&self.value),
            other => serde_json::to_string(other).is_ok_and(|text| text == self.value),
        };
        matches == self.equal
    }
}

/// The rows that every filter keeps. A filter on a field the rows do not
/// have is an error that lists the fields they do have.
pub fn keep<T: Serialize>(rows: Vec<T>, filters: &[RowFilter], what: &str) -> anyhow::Result<Vec<T>> {
    if filters.is_empty() {
        return Ok(rows);
    }
    let mut kept = Vec::new();
    for row in rows {
        let Value::Object(fields) = serde_json::to_value(&row)? else {
            bail!("listed {what} are not records, so they cannot be filtered");
        };
        for filter in filters {
            if !fields.contains_key(&filter.key) {
                let known: Vec<&str> = fields.keys().map(String::as_str).collect();
                bail!(
                    "{what} have no field {:?}; their fields: {}",
                    filter.key,
                    known.join(", ")
                );
            }
        }
        if filters.iter().all(|filter| filter.holds(&fields[&filter.key])) {
            kept.push(row);
        }
    }
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Serialize)]
    struct Actor {
        state: &'static str,
        restarts: u32,
        detached: bool,
    }

    fn actors() -> Vec<Actor> {
        vec![
            Actor {
                state: "ALIVE",
                restarts: 0,
                detached: true,
            },
            Actor {
                state: "DEAD",
                restarts: 2,
                detached: false,
            },
            Actor {
                state: "ALIVE",
                restarts: 1,
                detached: false,
            },
        ]
    }

    fn states(filters: &[&str]) -> Vec<(&'static str, u32)> {
        let filters: Vec<RowFilter> = filters.iter().map(|f| RowFilter::parse(f).unwrap()).collect();
        keep(actors(), &filters, "actors")
            .unwrap()
            .into_iter()
            .map(|a| (a.state, a.restarts))
            .collect()
    }

    #[test]
    fn filters_keep_rows_whose_fields_equal_or_differ_and_all_must_hold() {
        assert_eq!(states(&[]).len(), 3);
        assert_eq!(states(&["state=alive"]), vec![("ALIVE", 0), ("ALIVE", 1)]);
        assert_eq!(states(&["state!=ALIVE"]), vec![("DEAD", 2)]);
        assert_eq!(states(&["state=ALIVE", "restarts=1"]), vec![("ALIVE", 1)]);
        assert_eq!(states(&["detached=true"]), vec![("ALIVE", 0)]);
        assert_eq!(states(&[" state = DEAD "]), vec![("DEAD", 2)]);
    }

    #[test]
    fn malformed_filters_and_unknown_fields_are_errors_that_say_why() {
        let error = RowFilter::parse("state").unwrap_err();
        assert!(matches!(error, RowFilterError::NotKeyValue(_)), "{error}");
        assert!(error.to_string().contains("KEY=VALUE"), "{error}");
        assert!(matches!(RowFilter::parse("=ALIVE"), Err(RowFilterError::NoField(_))));
        let error = keep(actors(), &[RowFilter::parse("colour=red").unwrap()], "actors").unwrap_err();
        assert_eq!(
            error.to_string(),
            "actors have no field \"colour\"; their fields: detached, restarts, state"
        );
    }
}
