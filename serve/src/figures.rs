//! A deployment's own figures (tokens per second, time to first token):
//! each replica reports what [`Deployment::figures`](crate::Deployment::figures)
//! gives with its load, about once a second, and the controller combines
//! the running replicas' reports per name, summing or averaging as each
//! [`Figure`] asks, into the deployment's status.

use serde::{Deserialize, Serialize};

/// One named value of a replica, such as `tokens_per_s` or `ttft_p99_s`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    pub name: String,
    pub value: f64,
    /// How the replicas' values make the deployment's.
    pub combine: Combine,
}

/// How replicas' values of a figure make the deployment's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Combine {
    /// Added up: throughputs, counts.
    Sum,
    /// Averaged: latencies, ratios.
    Mean,
}

impl Figure {
    pub fn new(name: impl Into<String>, value: f64, combine: Combine) -> Self {
        Figure {
            name: name.into(),
            value,
            combine,
        }
    }
}

/// The deployment's figures from its replicas' reports: one per name, in
/// the order names first appear, each combined as its first report says.
/// Values that are not finite are left out.
pub(crate) fn combine<'a>(reports: impl IntoIterator<Item = &'a [Figure]>) -> Vec<Figure> {
    let mut combined: Vec<(Figure, u32)> = Vec::new();
    let finite = reports.into_iter().flatten().filter(|figure| figure.value.is_finite());
    for figure in finite {
        match combined.iter_mut().find(|(seen, _)| seen.name == figure.name) {
            Some((seen, count)) => {
                seen.value += figure.value;
                *count += 1;
            }
            None => combined.push((figure.clone(), 1)),
        }
    }
    combined
        .into_iter()
        .map(|(mut figure, count)| {
            if figure.combine == Combine::Mean {
                figure.value /= f64::from(count);
            }
            figure
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throughputs_add_up_and_latencies_average_over_replicas() {
        let first = [
            Figure::new("tokens_per_s", 400.0, Combine::Sum),
            Figure::new("ttft_p50_s", 0.2, Combine::Mean),
        ];
        let second = [
            Figure::new("tokens_per_s", 412.5, Combine::Sum),
            Figure::new("ttft_p50_s", 0.4, Combine::Mean),
            Figure::new("broken", f64::NAN, Combine::Mean),
        ];
        let combined = combine([&first[..], &second[..]]);
        assert_eq!(
            combined,
            [
                Figure::new("tokens_per_s", 812.5, Combine::Sum),
                Figure::new("ttft_p50_s", 0.30000000000000004, Combine::Mean),
            ]
        );
        assert!(combine(std::iter::empty::<&[Figure]>()).is_empty());
    }
}
