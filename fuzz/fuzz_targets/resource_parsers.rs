//! The parsers behind `raylet start`'s flags, on arbitrary text picked by
//! the first byte: `--resources` (custom resources as JSON), `--labels`
//! (`k=v,..`), label selectors (`key` and `value`, `!value`, `in(a,b)` or
//! `!in(a,b)`), and the amounts of `--num-cpus` and the like. What one of
//! them accepts is well formed, survives its wire form, and parses again
//! from how it prints to the same thing.

#![no_main]

use libfuzzer_sys::fuzz_target;
use raylet_proto::resources::{CPU, GPU, MEMORY, OBJECT_STORE_MEMORY};
use raylet_proto::scheduling::{labels_from_proto, labels_to_proto, parse_labels};
use raylet_proto::{Amount, LabelSelector, ResourceSet, Scheduling};

fuzz_target!(|data: &[u8]| {
    let Some((&pick, bytes)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    match pick % 4 {
        0 => custom_resources(text),
        1 => labels(text),
        2 => selector(text),
        _ => amount(pick, text),
    }
});

fn custom_resources(json: &str) {
    let Ok(set) = ResourceSet::parse_custom_json(json) else {
        return;
    };
    for (name, amount) in set.iter() {
        assert!(
            ![CPU, GPU, MEMORY, OBJECT_STORE_MEMORY].contains(&name),
            "{name} is built in"
        );
        assert!(amount > Amount::ZERO, "{name} is kept at zero");
    }
    assert_eq!(ResourceSet::from_proto(&set.to_proto()).unwrap(), set);
    let printed = serde_json::to_string(&set).unwrap();
    let again = ResourceSet::parse_custom_json(&printed).unwrap_or_else(|e| panic!("{printed}: {e}"));
    assert_eq!(again, set, "{printed}");
}

fn labels(text: &str) {
    let Ok(labels) = parse_labels(text) else {
        return;
    };
    assert_eq!(labels_from_proto(&labels_to_proto(&labels)).unwrap(), labels);
    let printed: Vec<String> = labels.iter().map(|(key, value)| format!("{key}={value}")).collect();
    let printed = printed.join(",");
    assert_eq!(parse_labels(&printed).unwrap(), labels, "{printed}");
}

fn selector(text: &str) {
    let (key, expression) = text.split_once('=').unwrap_or((text, ""));
    let Ok(selector) = LabelSelector::default().with(key, expression) else {
        return;
    };
    let printed = selector.to_string();
    let (key, expression) = printed.split_once('=').expect("a selector prints as key=condition");
    assert_eq!(
        LabelSelector::default().with(key, expression).unwrap(),
        selector,
        "{printed}"
    );
    let scheduling = Scheduling {
        label_selector: selector,
        ..Scheduling::default()
    };
    assert_eq!(
        Scheduling::from_proto(Some(&scheduling.to_proto())).unwrap(),
        scheduling
    );
}

fn amount(pick: u8, text: &str) {
    let Ok(value) = text.trim().parse::<f64>() else {
        return;
    };
    let name = [CPU, GPU, MEMORY, OBJECT_STORE_MEMORY, "TPU"][usize::from(pick / 4 % 5)];
    let Ok(amount) = Amount::parse(name, value) else {
        return;
    };
    assert!(value.is_finite() && value >= 0.0, "{value} was taken");
    assert_eq!(Amount::from_raw(amount.raw()).unwrap(), amount);
    let printed = amount.to_string();
    let again = Amount::parse(name, printed.parse().unwrap()).unwrap_or_else(|e| panic!("{printed}: {e}"));
    assert_eq!(again, amount, "{value} printed as {printed}");
}
