//! The cluster name that scopes a provider's instances, so that two
//! clusters never see each other's nodes. It becomes part of Slurm job
//! names and of network namespace names, so it is kept to characters that
//! are plain in both.

/// The longest name accepted: namespace and job names stay readable.
const MAX_LEN: usize = 40;

/// Why a cluster name was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClusterNameError {
    #[error("the cluster name is empty")]
    Empty,
    #[error("the cluster name `{0}` is longer than {MAX_LEN} characters")]
    TooLong(String),
    #[error("the cluster name `{0}` must be ASCII letters, digits, `-`, `_` and `.`, beginning with a letter or digit")]
    NotPlain(String),
}

/// `Ok` if `name` is 1 to 40 ASCII letters, digits, `-`, `_` or `.`,
/// beginning with a letter or digit; else why not.
pub(crate) fn check_cluster_name(name: &str) -> Result<(), ClusterNameError> {
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    match name.chars().next() {
        None => Err(ClusterNameError::Empty),
        Some(_) if name.len() > MAX_LEN => Err(ClusterNameError::TooLong(name.to_string())),
        Some(first) if !first.is_ascii_alphanumeric() || !name.chars().all(plain) => {
            Err(ClusterNameError::NotPlain(name.to_string()))
        }
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
        assert_eq!(check_cluster_name(""), Err(ClusterNameError::Empty));
        let long = "x".repeat(41);
        assert_eq!(check_cluster_name(&long), Err(ClusterNameError::TooLong(long.clone())));
        for name in ["-a", "a b", "a/b", "é"] {
            assert_eq!(
                check_cluster_name(name),
                Err(ClusterNameError::NotPlain(name.into())),
                "{name}"
            );
        }
    }
}
