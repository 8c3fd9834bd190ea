//! A configuration as MLflow params: MLflow params are flat string pairs,
//! so nested objects become dotted keys and every leaf its text.

use serde_json::Value;

/// Every leaf of `config` with its dotted path (`model.hidden` = `64`), in
/// key order: strings as they are, arrays and other values as JSON. A
/// config that is not an object is one param, `config`.
pub fn flatten_params(config: &Value) -> Vec<(String, String)> {
    let mut params = Vec::new();
    match config {
        Value::Object(_) => flatten_into(config, "", &mut params),
        Value::Null => {}
        leaf => params.push(("config".to_string(), text(leaf))),
    }
    params
}

fn flatten_into(value: &Value, path: &str, params: &mut Vec<(String, String)>) {
    match value {
        Value::Object(object) => {
            for (key, inner) in object {
                let inner_path = match path {
                    "" => key.clone(),
                    _ => format!("{path}.{key}"),
                };
                flatten_into(inner, &inner_path, params);
            }
        }
        leaf => params.push((path.to_string(), text(leaf))),
    }
}

fn text(leaf: &Value) -> String {
    match leaf {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_objects_become_dotted_keys_and_leaves_their_text() {
        let config = serde_json::json!({
            "lr": 0.003,
            "model": {"hidden": 64, "activation": "relu", "layers": [64, 32]},
            "seed": null,
            "shuffle": true,
        });
        let params = flatten_params(&config);
        let expected = [
            ("lr", "0.003"),
            ("model.activation", "relu"),
            ("model.hidden", "64"),
            ("model.layers", "[64,32]"),
            ("seed", "null"),
            ("shuffle", "true"),
        ];
        let expected: Vec<(String, String)> = expected.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        assert_eq!(params, expected);
    }

    #[test]
    fn a_config_that_is_not_an_object_is_one_param() {
        assert_eq!(flatten_params(&Value::from(3)), vec![("config".into(), "3".into())]);
        assert!(flatten_params(&Value::Null).is_empty());
    }
}
