//! Batch inference on the digits (feature `digits`): the test images as
//! 8x8 PGM files, and a [`BatchModel`] that loads a digits MLP from a Train
//! checkpoint once per actor and classifies batches of those files.

use std::path::{Path, PathBuf};

use burn::prelude::*;
use burn::tensor::TensorData;
use raylet_models::digits::{Digit, DigitsMlp};
use serde::{Deserialize, Serialize};

use crate::{BatchModel, FileBytes, ModelError};

const SIDE: usize = 8;
/// The digits' darkest pixel value.
const MAX_VALUE: f32 = 16.0;
/// The model's parameters in a Train checkpoint's directory: a burnpack
/// file, as raylet-train's `Checkpoint::save_model` writes it.
const CHECKPOINT_MODEL_FILE: &str = "model.bpk";

/// Writes each digit to `dir` as `digit_NNNNN_label_L.pgm` (binary PGM,
/// 8x8, values 0..16); returns the paths.
pub fn write_images(dir: &Path, digits: &[Digit]) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    digits
        .iter()
        .enumerate()
        .map(|(index, digit)| {
            let path = dir.join(format!("digit_{index:05}_label_{}.pgm", digit.label));
            let mut bytes = format!("P5\n{SIDE} {SIDE}\n{}\n", MAX_VALUE as u8).into_bytes();
            bytes.extend(digit.pixels.iter().map(|p| (p * MAX_VALUE).round() as u8));
            std::fs::write(&path, bytes)?;
            Ok(path)
        })
        .collect()
}

/// Why bytes are not an 8x8 binary PGM file.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PgmError {
    #[error("not a PGM file: its header ends early")]
    HeaderEndsEarly,
    #[error("not a PGM file: bad header field {0:?}")]
    BadHeaderField(String),
    #[error("not an 8x8 binary PGM: {magic} {width}x{height} max {max_value}")]
    NotEightByEightBinary {
        magic: String,
        width: usize,
        height: usize,
        max_value: usize,
    },
    #[error("the PGM's pixels are cut short")]
    PixelsCutShort,
}

/// The pixels of a binary 8x8 PGM file, scaled to 0..1 as the digits are.
pub fn parse_pgm(bytes: &[u8]) -> Result<Vec<f32>, PgmError> {
    let mut fields = Vec::new();
    let mut position = 0;
    while fields.len() < 4 {
        while bytes.get(position).is_some_and(u8::is_ascii_whitespace) {
            position += 1;
        }
        let start = position;
        while bytes.get(position).is_some_and(|b| !b.is_ascii_whitespace()) {
            position += 1;
        }
        if start == position {
            return Err(PgmError::HeaderEndsEarly);
        }
        fields.push(String::from_utf8_lossy(&bytes[start..position]).into_owned());
    }
    let number = |field: &str| {
        field
            .parse::<usize>()
            .map_err(|_| PgmError::BadHeaderField(field.to_string()))
    };
    let (width, height, max_value) = (number(&fields[1])?, number(&fields[2])?, number(&fields[3])?);
    if fields[0] != "P5" || (width, height) != (SIDE, SIDE) || max_value == 0 || max_value > 255 {
        return Err(PgmError::NotEightByEightBinary {
            magic: fields[0].clone(),
            width,
            height,
            max_value,
        });
    }
    let pixels = bytes
        .get(position + 1..position + 1 + SIDE * SIDE)
        .ok_or(PgmError::PixelsCutShort)?;
    Ok(pixels.iter().map(|p| *p as f32 / max_value as f32).collect())
}

/// The label a file name written by [`write_images`] carries.
fn label_in_name(path: &str) -> Option<u8> {
    let stem = Path::new(path).file_stem()?.to_str()?;
    stem.rsplit_once("_label_")?.1.parse().ok()
}

/// One classified file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    pub path: String,
    /// The label in the file's name, when it has one.
    pub label: Option<u8>,
    pub predicted: u8,
}

/// A digits MLP read from a Train checkpoint, classifying PGM files.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DigitClassifier {
    pub checkpoint: PathBuf,
    pub hidden: usize,
}
crate::register_batch_model!(DigitClassifier);

impl BatchModel for DigitClassifier {
    type In = FileBytes;
    type Out = Prediction;
    type State = (DigitsMlp, Device);

    fn load(&self) -> Result<(DigitsMlp, Device), ModelError> {
        let device = Device::flex();
        let model = DigitsMlp::new(self.hidden, &device)
            .try_load_file(self.checkpoint.join(CHECKPOINT_MODEL_FILE))
            .map_err(|e| format!("loading the model from {}: {e}", self.checkpoint.display()))?;
        Ok((model, device))
    }

    fn predict(&self, state: &mut (DigitsMlp, Device), batch: Vec<FileBytes>) -> Result<Vec<Prediction>, ModelError> {
        let (model, device) = state;
        let mut pixels = Vec::with_capacity(batch.len() * SIDE * SIDE);
        for file in &batch {
            pixels.extend(parse_pgm(&file.bytes).map_err(|e| format!("{}: {e}", file.path))?);
        }
        let input = Tensor::<2>::from_data(TensorData::new(pixels, [batch.len(), SIDE * SIDE]), &*device);
        let classes = model.forward(input).argmax(1).into_data();
        Ok(batch
            .into_iter()
            .zip(classes.iter::<i64>())
            .map(|(file, class)| Prediction {
                label: label_in_name(&file.path),
                path: file.path,
                predicted: class as u8,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_round_trip_through_pgm_files_and_bad_ones_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let digits = raylet_models::digits::load(0.2, 0).test;
        let paths = write_images(dir.path(), &digits[..5]).unwrap();
        for (path, digit) in paths.iter().zip(&digits) {
            let pixels = parse_pgm(&std::fs::read(path).unwrap()).unwrap();
            assert_eq!(pixels, digit.pixels);
            assert_eq!(label_in_name(&path.to_string_lossy()), Some(digit.label));
        }
        assert_eq!(parse_pgm(b"P5\n8 8\n16\n\x01\x02"), Err(PgmError::PixelsCutShort));
        let error = parse_pgm(b"P2\n8 8\n16\n").unwrap_err();
        assert!(matches!(error, PgmError::NotEightByEightBinary { .. }), "{error}");
        assert!(error.to_string().contains("not an 8x8 binary PGM"), "{error}");
        assert_eq!(parse_pgm(b"GIF89a"), Err(PgmError::HeaderEndsEarly));
        assert_eq!(parse_pgm(b"P5 x 8 16"), Err(PgmError::BadHeaderField("x".into())));
    }

    #[test]
    fn the_classifier_loads_the_model_a_train_checkpoint_saved() {
        let dir = tempfile::tempdir().unwrap();
        let device = Device::flex();
        let saved = DigitsMlp::new(8, &device);
        raylet_train::Checkpoint::from_directory(dir.path())
            .save_model(&saved)
            .unwrap();
        let classifier = DigitClassifier {
            checkpoint: dir.path().to_path_buf(),
            hidden: 8,
        };
        let (loaded, device) = classifier.load().unwrap();
        let digits = raylet_models::digits::load(0.2, 0).test;
        let (pixels, _) = raylet_models::digits::batch(&digits[..20], &device);
        let scores = |model: &DigitsMlp| {
            model
                .forward(pixels.clone())
                .into_data()
                .iter::<f32>()
                .collect::<Vec<_>>()
        };
        assert_eq!(scores(&loaded), scores(&saved));
    }
}
