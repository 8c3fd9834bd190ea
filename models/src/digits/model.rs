//! A two-layer perceptron for the digits, and the batches it reads.

use burn::nn::{Linear, LinearConfig, Relu};
use burn::prelude::*;
use burn::tensor::TensorData;

use super::Digit;

const PIXELS: usize = 64;
const CLASSES: usize = 10;

/// 64 pixels, a hidden layer with ReLU, 10 class scores.
#[derive(Module, Debug)]
pub struct DigitsMlp {
    hidden: Linear,
    activation: Relu,
    output: Linear,
}

impl DigitsMlp {
    pub fn new(hidden: usize, device: &Device) -> Self {
        DigitsMlp {
            hidden: LinearConfig::new(PIXELS, hidden).init(device),
            activation: Relu::new(),
            output: LinearConfig::new(hidden, CLASSES).init(device),
        }
    }

    /// Class scores (logits) of a batch of images, `[batch, 64]` to `[batch, 10]`.
    pub fn forward(&self, pixels: Tensor<2>) -> Tensor<2> {
        self.output
            .forward(self.activation.forward(self.hidden.forward(pixels)))
    }

    /// How many of `digits` the model labels right.
    pub fn count_correct(&self, digits: &[Digit], device: &Device) -> usize {
        if digits.is_empty() {
            return 0;
        }
        let (pixels, _) = batch(digits, device);
        let predicted = self.forward(pixels).argmax(1).into_data();
        predicted
            .iter::<i64>()
            .zip(digits)
            .filter(|(class, digit)| *class == i64::from(digit.label))
            .count()
    }
}

/// The images and labels of `digits` as tensors.
pub fn batch(digits: &[Digit], device: &Device) -> (Tensor<2>, Tensor<1, Int>) {
    let pixels: Vec<f32> = digits.iter().flat_map(|d| d.pixels.iter().copied()).collect();
    let labels: Vec<i64> = digits.iter().map(|d| i64::from(d.label)).collect();
    (
        Tensor::<2>::from_data(TensorData::new(pixels, [digits.len(), PIXELS]), device),
        Tensor::<1, Int>::from_data(TensorData::new(labels, [digits.len()]), device),
    )
}
