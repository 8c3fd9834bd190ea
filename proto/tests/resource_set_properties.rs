//! Properties of resource sets over arbitrary sets: adding then subtracting
//! gives back the original, subtracting never goes below zero, and
//! `fits` agrees with what `try_subtract` and `subtract` do.

use proptest::prelude::*;
use raylet_proto::resources::{CPU, GPU, MEMORY};
use raylet_proto::{Amount, ResourceSet};

/// The names a set is drawn from: built-in ones and a custom one.
const NAMES: [&str; 4] = [CPU, GPU, MEMORY, "accel_a100"];
/// Far below where adding saturates, so sums stay exact.
const MAX_RAW: i64 = 1 << 40;

fn resource_set() -> impl Strategy<Value = ResourceSet> {
    proptest::collection::vec((0..NAMES.len(), 0..MAX_RAW), 0..6).prop_map(|amounts| {
        let mut set = ResourceSet::new();
        for (name, raw) in amounts {
            set.set(NAMES[name], Amount::from_raw(raw).expect("non-negative"));
        }
        set
    })
}

proptest! {
    #[test]
    fn adding_then_subtracting_gives_back_the_original(base in resource_set(), other in resource_set()) {
        let mut set = base.clone();
        set.add(&other);
        set.subtract(&other);
        prop_assert_eq!(set, base);
    }

    #[test]
    fn subtracting_never_goes_below_zero(base in resource_set(), demand in resource_set()) {
        let mut rest = base.clone();
        rest.subtract(&demand);
        for name in NAMES {
            let expected = (base.get(name).raw() - demand.get(name).raw()).max(0);
            prop_assert_eq!(rest.get(name).raw(), expected, "{}", name);
        }
        prop_assert!(rest.iter().all(|(_, amount)| amount > Amount::ZERO), "zero amounts are dropped: {:?}", rest);
    }

    #[test]
    fn a_demand_fits_exactly_when_subtracting_it_takes_all_of_it(base in resource_set(), demand in resource_set()) {
        let mut tried = base.clone();
        let subtracted = tried.try_subtract(&demand);
        prop_assert_eq!(subtracted, base.fits(&demand));
        match subtracted {
            true => {
                let mut restored = tried.clone();
                restored.add(&demand);
                prop_assert_eq!(restored, base);
            }
            false => prop_assert_eq!(tried, base, "a demand that does not fit takes nothing"),
        }
    }

    #[test]
    fn a_set_always_fits_itself_and_any_part_of_it(base in resource_set(), other in resource_set()) {
        prop_assert!(base.fits(&base));
        prop_assert!(base.fits(&ResourceSet::new()));
        let mut larger = base.clone();
        larger.add(&other);
        prop_assert!(larger.fits(&base) && larger.fits(&other));
    }

    #[test]
    fn the_wire_form_reads_back_as_the_same_set(set in resource_set()) {
        prop_assert_eq!(ResourceSet::from_proto(&set.to_proto()).expect("a valid set"), set);
    }
}
