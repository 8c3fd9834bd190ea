//! Space-filling start designs: a Latin hypercube puts each of n points in
//! its own n-th of every hyperparameter's range, so a handful of startup
//! trials covers the space more evenly than independent random draws.

use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use super::SearchSpace;
use crate::TrialConfig;

/// How many hypercubes are drawn; the one whose closest two points are
/// farthest apart is kept.
const CANDIDATE_DESIGNS: usize = 16;

/// `n` configurations whose uniformly drawn entries (ranges and choices)
/// form a Latin hypercube; the other entries are left for the caller to draw.
pub(crate) fn latin_hypercube(space: &SearchSpace, n: usize, rng: &mut StdRng) -> Vec<TrialConfig> {
    let stratified: Vec<usize> = (0..space.entries().len())
        .filter(|index| space.entries()[*index].1.value_at_unit(0.5).is_some())
        .collect();
    let (_, units) = (0..CANDIDATE_DESIGNS)
        .map(|_| {
            let design = unit_hypercube(n, stratified.len(), rng);
            (closest_pair(&design), design)
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .unwrap_or_default();
    units
        .iter()
        .map(|point| {
            let mut config = TrialConfig::new();
            for (unit, index) in point.iter().zip(&stratified) {
                let (path, domain) = &space.entries()[*index];
                config.set(path, domain.value_at_unit(*unit).expect("a stratified domain"));
            }
            config
        })
        .collect()
}

/// `n` points in the unit cube of `dims` dimensions, one per stratum of each axis.
fn unit_hypercube(n: usize, dims: usize, rng: &mut StdRng) -> Vec<Vec<f64>> {
    let mut points = vec![Vec::with_capacity(dims); n];
    for _ in 0..dims {
        let mut strata: Vec<usize> = (0..n).collect();
        strata.shuffle(rng);
        for (point, stratum) in points.iter_mut().zip(strata) {
            point.push((stratum as f64 + rng.random::<f64>()) / n as f64);
        }
    }
    points
}

/// The distance between the closest two points.
fn closest_pair(points: &[Vec<f64>]) -> f64 {
    let mut closest = f64::INFINITY;
    for (i, a) in points.iter().enumerate() {
        for b in &points[i + 1..] {
            let squared: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
            closest = closest.min(squared.sqrt());
        }
    }
    closest
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;
    use crate::search::{choice, randint, sample_from, uniform};

    #[test]
    fn every_range_and_choice_is_split_evenly_among_the_points() {
        let space = SearchSpace::new()
            .with("x", uniform(-1.0, 1.0))
            .with("n", randint(0, 10))
            .with("kind", choice(["a", "b", "c", "d", "e"]))
            .with("epochs", 3)
            .with("y", sample_from(|_, _| 0.into()));
        let design = latin_hypercube(&space, 10, &mut StdRng::seed_from_u64(2));
        assert_eq!(design.len(), 10);
        let mut tenths: Vec<usize> = design
            .iter()
            .map(|c| ((c.get::<f64>("x").unwrap() + 1.0) * 5.0) as usize)
            .collect();
        tenths.sort();
        assert_eq!(tenths, (0..10).collect::<Vec<_>>(), "one x in each tenth of [-1, 1)");
        let mut ns: Vec<i64> = design.iter().map(|c| c.get("n").unwrap()).collect();
        ns.sort();
        assert_eq!(ns, (0..10).collect::<Vec<_>>(), "each integer once");
        for kind in ["a", "b", "c", "d", "e"] {
            let count = design
                .iter()
                .filter(|c| c.get::<String>("kind").unwrap() == kind)
                .count();
            assert_eq!(count, 2, "each choice twice");
        }
        assert!(
            design
                .iter()
                .all(|c| c.value("epochs").is_none() && c.value("y").is_none())
        );
    }
}
