//! Greedy decoding: the model's most likely next token, appended and fed
//! back, one full forward pass over the last `context_length` tokens per new
//! token (no key/value cache: generation here is for samples and tests;
//! serving decodes with one, see [`Gpt::step`]).

use burn::prelude::*;

use super::{Gpt, token_batch};

impl Gpt {
    /// `prompt` followed by `new_tokens` tokens, each the most likely after
    /// those before it; the model sees at most the last `context_length`.
    ///
    /// # Panics
    /// If `prompt` is empty: the model has no start token of its own.
    pub fn generate_greedy(&self, prompt: &[u32], new_tokens: usize, device: &Device) -> Vec<u32> {
        assert!(
            !prompt.is_empty(),
            "greedy generation needs a prompt of at least one token"
        );
        let mut tokens = prompt.to_vec();
        for _ in 0..new_tokens {
            let window_start = tokens.len().saturating_sub(self.context_length());
            let next = self.most_likely_next(&tokens[window_start..], device);
            tokens.push(next);
        }
        tokens
    }

    /// The argmax of the logits at the last position of `window`.
    fn most_likely_next(&self, window: &[u32], device: &Device) -> u32 {
        let input = token_batch(&[window], device);
        let last = window.len() - 1;
        let logits = self
            .forward(input)
            .slice([0..1, last..last + 1])
            .reshape([self.vocab_size()]);
        let next = logits.argmax(0).into_scalar::<i64>();
        u32::try_from(next).expect("an argmax over the vocabulary is a token id")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpt::GptConfig;

    fn micro_model(vocab_size: usize, context_length: usize, device: &Device) -> Gpt {
        let config = GptConfig {
            vocab_size,
            context_length,
            d_model: 16,
            n_heads: 2,
            n_layers: 1,
            mlp_ratio: 4,
            dropout: 0.0,
        };
        Gpt::new(&config, device).unwrap()
    }

    #[test]
    fn greedy_generation_appends_tokens_from_the_vocabulary_deterministically() {
        let device = Device::flex();
        let model = micro_model(30, 8, &device);
        let prompt = [3, 1, 4];

        let generated = model.generate_greedy(&prompt, 6, &device);

        assert_eq!(generated.len(), prompt.len() + 6);
        assert_eq!(generated[..prompt.len()], prompt);
        assert!(generated.iter().all(|&token| token < 30), "{generated:?}");
        assert_eq!(model.generate_greedy(&prompt, 6, &device), generated);
    }

    #[test]
    fn a_prompt_longer_than_the_context_is_cropped_to_its_end() {
        let device = Device::flex();
        let model = micro_model(30, 4, &device);
        let prompt = [9, 8, 7, 6, 5, 4, 3];

        let generated = model.generate_greedy(&prompt, 3, &device);

        assert_eq!(generated.len(), 10);
        let from_the_end_alone = model.generate_greedy(&prompt[3..], 1, &device);
        assert_eq!(generated[7], from_the_end_alone[4]);
    }
}
