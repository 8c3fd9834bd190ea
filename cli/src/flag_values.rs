//! Parsers of flag values that clap does not know: durations (bounded, so
//! that no deadline overflows), labels and `KEY=VALUE` pairs, each with a
//! typed error that says what is wrong with the value.

use std::time::Duration;

use raylet_proto::Labels;

/// The longest duration a flag takes: 10 years of 365.25 days. Far beyond
/// any useful grace period, timeout or interval, and far below what
/// overflows a deadline (an `Instant` plus 300 billion years panics).
const MAX_DURATION: Duration = Duration::from_secs(10 * 31_557_600);

/// Why a flag's value was refused.
#[derive(Debug, thiserror::Error)]
pub enum FlagValueError {
    #[error("{0} (examples: 5s, 500ms, 1m)")]
    NotADuration(#[from] humantime::DurationError),
    #[error("{text} is too long: at most {}", humantime::format_duration(MAX_DURATION))]
    TooLong { text: String },
    #[error("must be longer than zero")]
    Zero,
    #[error(transparent)]
    Labels(#[from] raylet_proto::Error),
    #[error("'{0}' is not KEY=VALUE")]
    NotKeyValue(String),
}

/// A duration above zero and at most [`MAX_DURATION`].
pub fn parse_duration(text: &str) -> Result<Duration, FlagValueError> {
    let duration = parse_duration_or_zero(text)?;
    if duration.is_zero() {
        return Err(FlagValueError::Zero);
    }
    Ok(duration)
}

/// A duration of at most [`MAX_DURATION`], zero included (for a setting
/// that zero turns off).
pub fn parse_duration_or_zero(text: &str) -> Result<Duration, FlagValueError> {
    let duration = humantime::parse_duration(text)?;
    if duration > MAX_DURATION {
        return Err(FlagValueError::TooLong { text: text.to_string() });
    }
    Ok(duration)
}

/// Labels as `--labels` takes them: `k=v,k2=v2`.
pub fn parse_labels(text: &str) -> Result<Labels, FlagValueError> {
    Ok(raylet_proto::scheduling::parse_labels(text)?)
}

/// One `KEY=VALUE` pair with a key that is not empty.
pub fn parse_key_value(text: &str) -> Result<(String, String), FlagValueError> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(FlagValueError::NotKeyValue(text.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refused_value_says_why() {
        assert!(matches!(parse_duration("soon"), Err(FlagValueError::NotADuration(_))));
        assert!(matches!(parse_duration("0s"), Err(FlagValueError::Zero)));
        assert_eq!(parse_duration_or_zero("0s").ok(), Some(Duration::ZERO));
        let error = parse_duration_or_zero("11years").unwrap_err();
        assert!(matches!(error, FlagValueError::TooLong { .. }), "{error}");
        assert!(error.to_string().contains("at most 10years"), "{error}");
        assert!(matches!(parse_labels("zone"), Err(FlagValueError::Labels(_))));
        assert_eq!(parse_labels("zone=a").map(|labels| labels.len()).ok(), Some(1));
        assert!(matches!(parse_key_value("=x"), Err(FlagValueError::NotKeyValue(_))));
        assert_eq!(parse_key_value("a=b=c").ok(), Some(("a".into(), "b=c".into())));
    }
}
