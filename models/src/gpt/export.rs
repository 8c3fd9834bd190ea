//! A GPT's parameters as PyTorch names and lays them out, written as a
//! safetensors file, so that another framework can load the very same
//! weights (the serving benchmark loads them into PyTorch). Linear weights
//! are transposed to PyTorch's `[out, in]`, LayerNorm's gamma and beta are
//! `weight` and `bias`; the file's metadata holds the model's sizes as
//! JSON under `config`.

use std::io::Write;
use std::path::Path;

use burn::module::Param;
use burn::nn::{LayerNorm, Linear};
use burn::prelude::*;
use serde_json::json;

use super::Gpt;

/// One parameter: its PyTorch name, shape and values (row-major f32).
pub struct NamedTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

impl Gpt {
    /// Every parameter under its PyTorch name, in PyTorch's layout.
    pub fn pytorch_tensors(&self) -> Vec<NamedTensor> {
        let mut tensors = vec![
            tensor("token_embedding.weight", self.token_embedding.weight.val()),
            tensor("position_embedding", self.position_embedding.val()),
        ];
        for (index, block) in self.blocks.iter().enumerate() {
            let prefix = format!("blocks.{index}");
            tensors.extend(layer_norm(&format!("{prefix}.attention_norm"), &block.attention_norm));
            let attention = &block.attention;
            tensors.extend(linear(
                &format!("{prefix}.attention.query_key_value"),
                &attention.query_key_value,
            ));
            tensors.extend(linear(&format!("{prefix}.attention.output"), &attention.output));
            tensors.extend(layer_norm(&format!("{prefix}.mlp_norm"), &block.mlp_norm));
            tensors.extend(linear(&format!("{prefix}.mlp.expand"), &block.mlp.expand));
            tensors.extend(linear(&format!("{prefix}.mlp.contract"), &block.mlp.contract));
        }
        tensors.extend(layer_norm("final_norm", &self.final_norm));
        tensors
    }

    /// Writes [`pytorch_tensors`](Self::pytorch_tensors) to `path` as
    /// safetensors, with the model's sizes in the metadata.
    pub fn save_safetensors(&self, path: &Path) -> std::io::Result<()> {
        let [vocab_size, d_model] = self.token_embedding.weight.shape().dims::<2>();
        let first = self.blocks.first();
        let config = json!({
            "vocab_size": vocab_size,
            "context_length": self.context_length(),
            "d_model": d_model,
            "n_heads": first.map_or(0, |block| block.attention.n_heads),
            "n_layers": self.blocks.len(),
            "mlp_ratio": first.map_or(0, |block| block.mlp.expand.weight.shape().dims::<2>()[1] / d_model),
        });
        write_safetensors(path, &self.pytorch_tensors(), &config.to_string())
    }
}

fn tensor<const D: usize>(name: &str, value: Tensor<D>) -> NamedTensor {
    NamedTensor {
        name: name.to_string(),
        shape: value.dims().to_vec(),
        values: value.into_data().try_to_vec::<f32>().expect("a float tensor"),
    }
}

/// A Linear's weight, transposed to `[out, in]`, and its bias.
fn linear(prefix: &str, layer: &Linear) -> Vec<NamedTensor> {
    let mut tensors = vec![tensor(&format!("{prefix}.weight"), layer.weight.val().transpose())];
    tensors.extend(
        layer
            .bias
            .as_ref()
            .map(|bias| tensor(&format!("{prefix}.bias"), bias.val())),
    );
    tensors
}

fn layer_norm(prefix: &str, norm: &LayerNorm) -> Vec<NamedTensor> {
    let mut tensors = vec![tensor(&format!("{prefix}.weight"), norm.gamma.val())];
    tensors.extend(
        norm.beta
            .as_ref()
            .map(|beta: &Param<Tensor<1>>| tensor(&format!("{prefix}.bias"), beta.val())),
    );
    tensors
}

/// The safetensors format: the header's length (u64, little-endian), a
/// JSON header naming each tensor's dtype, shape and byte range, then the
/// bytes.
fn write_safetensors(path: &Path, tensors: &[NamedTensor], config: &str) -> std::io::Result<()> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({ "config": config }));
    let mut offset = 0;
    for tensor in tensors {
        let bytes = tensor.values.len() * std::mem::size_of::<f32>();
        header.insert(
            tensor.name.clone(),
            json!({"dtype": "F32", "shape": tensor.shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let mut header = serde_json::Value::Object(header).to_string().into_bytes();
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
    file.write_all(&(header.len() as u64).to_le_bytes())?;
    file.write_all(&header)?;
    for tensor in tensors {
        for value in &tensor.values {
            file.write_all(&value.to_le_bytes())?;
        }
    }
    file.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpt::GptConfig;

    #[test]
    fn every_parameter_is_exported_once_in_pytorchs_layout() {
        let config = GptConfig {
            vocab_size: 40,
            context_length: 8,
            d_model: 16,
            n_heads: 2,
            n_layers: 2,
            mlp_ratio: 4,
            dropout: 0.0,
        };
        let model = Gpt::new(&config, &Device::flex()).unwrap();
        let tensors = model.pytorch_tensors();
        let count: usize = tensors.iter().map(|t| t.values.len()).sum();
        assert_eq!(count, config.parameter_count());
        let shape_of = |name: &str| tensors.iter().find(|t| t.name == name).unwrap().shape.clone();
        assert_eq!(shape_of("blocks.1.attention.query_key_value.weight"), [48, 16]);
        assert_eq!(shape_of("blocks.0.mlp.contract.weight"), [16, 64]);
        assert_eq!(shape_of("final_norm.bias"), [16]);

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gpt.safetensors");
        model.save_safetensors(&path).unwrap();
        let file = std::fs::read(&path).unwrap();
        let header_len = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
        let header: serde_json::Value = serde_json::from_slice(&file[8..8 + header_len]).unwrap();
        assert_eq!(file.len(), 8 + header_len + 4 * count);
        let config_json: serde_json::Value =
            serde_json::from_str(header["__metadata__"]["config"].as_str().unwrap()).unwrap();
        assert_eq!(config_json["n_heads"], 2);
        assert_eq!(config_json["mlp_ratio"], 4);
        let qkv = &header["blocks.1.attention.query_key_value.weight"];
        assert_eq!(qkv["shape"], json!([48, 16]));
    }
}
