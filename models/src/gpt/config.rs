//! The shape of a [`Gpt`](super::Gpt): its sizes, the named presets, the
//! checks a shape must pass and the parameter count it implies.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A named model size: its name, and its config for a vocabulary size.
pub type Preset = (&'static str, fn(usize) -> GptConfig);

/// The named model sizes, smallest first. Parameter counts at an 8192-token
/// vocabulary: tiny 1.46M, small 13.9M, base 91.7M.
pub const PRESETS: [Preset; 3] = [
    ("tiny", GptConfig::tiny),
    ("small", GptConfig::small),
    ("base", GptConfig::base),
];

/// The sizes of a GPT-style model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GptConfig {
    /// Tokens the model reads and predicts.
    pub vocab_size: usize,
    /// The most tokens one forward pass sees (the learned positions).
    pub context_length: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Attention heads per block; each has `d_model / n_heads` dimensions.
    pub n_heads: usize,
    /// Transformer blocks.
    pub n_layers: usize,
    /// The MLP's hidden width, as a multiple of `d_model`.
    #[serde(default = "default_mlp_ratio")]
    pub mlp_ratio: usize,
    /// Dropout on the embeddings and on each block's two residual branches.
    #[serde(default)]
    pub dropout: f64,
}

fn default_mlp_ratio() -> usize {
    4
}

/// Why a [`GptConfig`] cannot be built.
#[derive(Debug, Error, PartialEq)]
pub enum GptConfigError {
    #[error("unknown GPT preset {name:?}: the known ones are {known}")]
    UnknownPreset { name: String, known: String },
    #[error("{field} is 0: it must be at least 1")]
    Zero { field: &'static str },
    #[error("d_model ({d_model}) is not divisible by n_heads ({n_heads})")]
    HeadsDoNotDivideWidth { d_model: usize, n_heads: usize },
    #[error("dropout ({0}) is not in [0, 1)")]
    Dropout(f64),
}

impl GptConfig {
    fn new(vocab_size: usize, context_length: usize, d_model: usize, n_heads: usize, n_layers: usize) -> Self {
        GptConfig {
            vocab_size,
            context_length,
            d_model,
            n_heads,
            n_layers,
            mlp_ratio: default_mlp_ratio(),
            dropout: 0.0,
        }
    }

    /// About 1.5M parameters at an 8k vocabulary: for tests and smoke runs.
    pub fn tiny(vocab_size: usize) -> Self {
        GptConfig::new(vocab_size, 128, 128, 4, 2)
    }

    /// About 14M parameters at an 8k vocabulary: trains on CPUs.
    pub fn small(vocab_size: usize) -> Self {
        GptConfig::new(vocab_size, 256, 384, 6, 6)
    }

    /// About 92M parameters at an 8k vocabulary (GPT-2 small's blocks).
    pub fn base(vocab_size: usize) -> Self {
        GptConfig::new(vocab_size, 512, 768, 12, 12)
    }

    /// The preset called `name` (see [`PRESETS`]).
    pub fn named(name: &str, vocab_size: usize) -> Result<Self, GptConfigError> {
        PRESETS
            .iter()
            .find(|(preset, _)| *preset == name)
            .map(|(_, preset)| preset(vocab_size))
            .ok_or_else(|| GptConfigError::UnknownPreset {
                name: name.to_owned(),
                known: PRESETS.map(|(preset, _)| preset).join(", "),
            })
    }

    /// Refuses shapes no model can have.
    pub fn check(&self) -> Result<(), GptConfigError> {
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("context_length", self.context_length),
            ("d_model", self.d_model),
            ("n_heads", self.n_heads),
            ("n_layers", self.n_layers),
            ("mlp_ratio", self.mlp_ratio),
        ];
        if let Some((field, _)) = sizes.iter().find(|(_, size)| *size == 0) {
            return Err(GptConfigError::Zero { field });
        }
        if !self.d_model.is_multiple_of(self.n_heads) {
            return Err(GptConfigError::HeadsDoNotDivideWidth {
                d_model: self.d_model,
                n_heads: self.n_heads,
            });
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(GptConfigError::Dropout(self.dropout));
        }
        Ok(())
    }

    /// Dimensions of each attention head.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads
    }

    /// The MLP's hidden width.
    pub fn mlp_width(&self) -> usize {
        self.mlp_ratio * self.d_model
    }

    /// Parameters of a model of this shape: the token and position
    /// embeddings, the blocks and the final LayerNorm (the tied output head
    /// adds none).
    pub fn parameter_count(&self) -> usize {
        let embeddings = (self.vocab_size + self.context_length) * self.d_model;
        embeddings + self.n_layers * self.block_parameter_count() + layer_norm_parameter_count(self.d_model)
    }

    /// One block: two LayerNorms, the fused query/key/value projection and
    /// the output projection (with biases), and the MLP's two layers.
    fn block_parameter_count(&self) -> usize {
        let d = self.d_model;
        let hidden = self.mlp_width();
        let attention = linear_parameter_count(d, 3 * d) + linear_parameter_count(d, d);
        let mlp = linear_parameter_count(d, hidden) + linear_parameter_count(hidden, d);
        2 * layer_norm_parameter_count(d) + attention + mlp
    }
}

fn linear_parameter_count(inputs: usize, outputs: usize) -> usize {
    inputs * outputs + outputs
}

fn layer_norm_parameter_count(width: usize) -> usize {
    2 * width
}

#[cfg(test)]
mod tests {
    use super::*;

    const VOCAB: usize = 8192;

    #[test]
    fn presets_have_their_stated_sizes_at_an_8k_vocabulary() {
        let millions = |name| GptConfig::named(name, VOCAB).unwrap().parameter_count() as f64 / 1e6;
        assert!((1.0..2.0).contains(&millions("tiny")), "tiny: {}M", millions("tiny"));
        assert!(
            (10.0..20.0).contains(&millions("small")),
            "small: {}M",
            millions("small")
        );
        assert!((50.0..120.0).contains(&millions("base")), "base: {}M", millions("base"));
    }

    #[test]
    fn every_preset_passes_its_checks_and_grows_with_its_rank() {
        let counts: Vec<usize> = PRESETS
            .iter()
            .map(|(name, preset)| {
                let config = preset(VOCAB);
                config.check().unwrap_or_else(|error| panic!("{name}: {error}"));
                assert_eq!(GptConfig::named(name, VOCAB).unwrap(), config);
                config.parameter_count()
            })
            .collect();
        assert!(counts.is_sorted(), "{counts:?}");
    }

    #[test]
    fn an_unknown_preset_is_refused_with_the_known_names() {
        let error = GptConfig::named("huge", VOCAB).unwrap_err();
        assert_eq!(
            error.to_string(),
            r#"unknown GPT preset "huge": the known ones are tiny, small, base"#
        );
    }

    #[test]
    fn shapes_no_model_can_have_are_refused() {
        let tiny = GptConfig::tiny(VOCAB);
        let uneven_heads = GptConfig {
            n_heads: 3,
            ..tiny.clone()
        };
        assert_eq!(
            uneven_heads.check().unwrap_err().to_string(),
            "d_model (128) is not divisible by n_heads (3)"
        );
        let no_layers = GptConfig {
            n_layers: 0,
            ..tiny.clone()
        };
        assert_eq!(
            no_layers.check().unwrap_err().to_string(),
            "n_layers is 0: it must be at least 1"
        );
        let no_heads = GptConfig {
            n_heads: 0,
            ..tiny.clone()
        };
        assert_eq!(no_heads.check().unwrap_err(), GptConfigError::Zero { field: "n_heads" });
        let certain_dropout = GptConfig { dropout: 1.0, ..tiny };
        assert_eq!(
            certain_dropout.check().unwrap_err().to_string(),
            "dropout (1) is not in [0, 1)"
        );
    }

    #[test]
    fn the_output_head_adds_no_parameter_per_token() {
        let config = GptConfig::tiny(VOCAB);
        let one_more_token = GptConfig {
            vocab_size: VOCAB + 1,
            ..config.clone()
        };
        assert_eq!(
            one_more_token.parameter_count() - config.parameter_count(),
            config.d_model
        );
    }

    #[test]
    fn a_config_without_the_defaulted_fields_reads_with_their_defaults() {
        let json = r#"{"vocab_size": 100, "context_length": 8, "d_model": 16, "n_heads": 2, "n_layers": 1}"#;
        let config: GptConfig = serde_json::from_str(json).unwrap();
        assert_eq!(config, GptConfig::new(100, 8, 16, 2, 1));
        assert_eq!(config.mlp_ratio, 4);
        assert_eq!(config.dropout, 0.0);
    }
}
