//! The cluster name that scopes a provider's instances, so that two
//! clusters never see each other's nodes. It becomes part of Slurm job
//! names and of network namespace names, so it is kept to characters that
//! are plain in both.

/// The longest name accepted: namespace and job names stay readable.
const MAX_LEN: usize = 40;

/// `Ok` if `name` is 1 to 40 ASCII letters, digits, `-`, `_` or `.`,
/// beginning with a letter or digit; else why not.
pub(crate) fn check_cluster_name(name: &str) -> Result<(), String> {
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    match name.chars().next() {
        None => Err("the cluster name is empty".into()),
        Some(_) if name.len() > MAX_LEN => {
            Err(format!("the cluster name `{name}` is longer than {MAX_LEN} characters"))
        }
        Some(first) if !first.is_ascii_alphanumeric() || !name.chars().all(plain) => Err(format!(
            "the cluster name `{name}` must be ASCII letters, digits, `-`, `_` and `.`, beginning with a letter or digit"
        )),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_names_and_refuses_the_rest() {
        for name in ["prod", "team-a_1.2", "7"] {
            assert_eq!(check_cluster_name(name), Ok(()), "{name}");
        }
        for name in ["", "-a", "a b", "a/b", "é", &"x".repeat(41)] {
            assert!(check_cluster_name(name).is_err(), "{name}");
        }
    }
}
