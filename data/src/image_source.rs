//! `read_images`: PNG and JPEG files decoded through the `image` crate,
//! optionally resized to a fixed size and converted to one mode, each a
//! row with its path, its label (the name of its folder, when asked) and
//! its pixels.

use serde::{Deserialize, Serialize};

use crate::source_error::SourceError;

/// The pixel layout of decoded images.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ImageMode {
    /// One byte per pixel.
    #[default]
    Gray,
    /// Three bytes per pixel.
    Rgb,
}

impl ImageMode {
    pub fn channels(self) -> u8 {
        match self {
            ImageMode::Gray => 1,
            ImageMode::Rgb => 3,
        }
    }
}

/// How `read_images` decodes its files.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageOptions {
    /// Every image resized to this width and height (as decoded when `None`).
    pub size: Option<(u32, u32)>,
    pub mode: ImageMode,
    /// Whether each image's label is the name of the folder it is in.
    pub labels_from_folders: bool,
}

impl ImageOptions {
    pub fn size(mut self, width: u32, height: u32) -> Self {
        self.size = Some((width, height));
        self
    }

    pub fn mode(mut self, mode: ImageMode) -> Self {
        self.mode = mode;
        self
    }

    pub fn labels_from_folders(mut self) -> Self {
        self.labels_from_folders = true;
        self
    }
}

/// One decoded image: row-major pixels, `channels` bytes each.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Image {
    pub path: String,
    pub label: Option<String>,
    pub width: u32,
    pub height: u32,
    pub channels: u8,
    #[serde(with = "serde_bytes")]
    pub pixels: Vec<u8>,
}

/// Whether `name` is a file `read_images` decodes, by its extension.
pub(crate) fn is_image(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    [".png", ".jpg", ".jpeg"]
        .iter()
        .any(|extension| lower.ends_with(extension))
}

/// The image in `bytes`, read from `path`.
#[cfg(feature = "images")]
pub(crate) fn decode(path: &str, bytes: &[u8], options: &ImageOptions) -> Result<Image, SourceError> {
    use image::imageops::FilterType;
    let mut decoded = image::load_from_memory(bytes).map_err(SourceError::Image)?;
    if let Some((width, height)) = options.size
        && (decoded.width(), decoded.height()) != (width, height)
    {
        decoded = decoded.resize_exact(width, height, FilterType::Triangle);
    }
    let (width, height) = (decoded.width(), decoded.height());
    let pixels = match options.mode {
        ImageMode::Gray => decoded.into_luma8().into_raw(),
        ImageMode::Rgb => decoded.into_rgb8().into_raw(),
    };
    let label = options.labels_from_folders.then(|| folder_name(path)).flatten();
    Ok(Image {
        path: path.to_string(),
        label,
        width,
        height,
        channels: options.mode.channels(),
        pixels,
    })
}

#[cfg(not(feature = "images"))]
pub(crate) fn decode(_path: &str, _bytes: &[u8], _options: &ImageOptions) -> Result<Image, SourceError> {
    Err(SourceError::ImagesOff)
}

/// The name of the folder the file at `path` is in.
#[cfg(feature = "images")]
fn folder_name(path: &str) -> Option<String> {
    let mut parts = path.rsplit('/');
    parts.next();
    parts.next().filter(|name| !name.is_empty()).map(str::to_string)
}
