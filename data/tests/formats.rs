//! CSV and image sources, typed rows written as Parquet, and Arrow rows
//! written as CSV and JSON lines: each read back, and bad inputs failing
//! the run naming the file or skipped and listed.

use std::collections::BTreeMap;
use std::path::Path;

use raylet_data::arrow::datatypes::{DataType, Field, Schema};
use raylet_data::{CsvOptions, Dataset, Image, ImageMode, ImageOptions, OnError};
use serde::{Deserialize, Serialize};

fn init() {
    raylet::init_with(raylet::Config::default().num_cpus(2.0)).expect("an embedded cluster");
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Score {
    id: i64,
    name: String,
    score: f64,
}

fn scores(range: std::ops::Range<i64>) -> Vec<Score> {
    range
        .map(|id| Score {
            id,
            name: format!("player {id}"),
            score: id as f64 * 1.5,
        })
        .collect()
}

fn write_csv(path: &Path, rows: &[Score], delimiter: char) {
    let mut text = format!("id{delimiter}name{delimiter}score\n");
    for row in rows {
        text += &format!("{}{delimiter}{}{delimiter}{}\n", row.id, row.name, row.score);
    }
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn by_id(mut rows: Vec<Score>) -> Vec<Score> {
    rows.sort_by_key(|row| row.id);
    rows
}

#[test]
fn csv_files_read_with_an_inferred_or_given_schema_and_written_back_from_arrow() {
    init();
    let temp = tempfile::tempdir().unwrap();
    let input = temp.path().join("in");
    write_csv(&input.join("a.csv"), &scores(0..300), ',');
    write_csv(&input.join("b.csv"), &scores(300..500), ',');
    let dataset = || Dataset::read_csv(input.to_str().unwrap()).show_progress(false);
    let rows = dataset().rows::<Score>().take_all().unwrap();
    assert_eq!(by_id(rows), scores(0..500));

    let out = temp.path().join("csv_out");
    let summary = dataset().write_csv(&out).unwrap();
    assert_eq!(summary.rows, 500);
    let again = Dataset::read_csv(out.to_str().unwrap()).show_progress(false);
    assert_eq!(by_id(again.rows::<Score>().take_all().unwrap()), scores(0..500));

    let jsonl = temp.path().join("jsonl_out");
    dataset().write_jsonl(&jsonl).unwrap();
    let mut lines: Vec<Score> = Vec::new();
    for file in std::fs::read_dir(&jsonl).unwrap().flatten() {
        if file.file_name().to_string_lossy().ends_with(".jsonl") {
            let text = std::fs::read_to_string(file.path()).unwrap();
            lines.extend(text.lines().map(|line| serde_json::from_str::<Score>(line).unwrap()));
        }
    }
    assert_eq!(by_id(lines), scores(0..500));

    let semicolons = temp.path().join("semi");
    write_csv(&semicolons.join("s.csv"), &scores(0..10), ';');
    let schema = Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, false),
        Field::new("score", DataType::Float64, false),
    ]);
    let given = CsvOptions::default().delimiter(b';').schema(schema);
    let rows = Dataset::read_csv_with(semicolons.to_str().unwrap(), given)
        .show_progress(false)
        .rows::<Score>()
        .take_all()
        .unwrap();
    assert_eq!(by_id(rows), scores(0..10));
}

#[test]
fn a_csv_file_that_does_not_parse_fails_naming_it_or_is_skipped() {
    init();
    let temp = tempfile::tempdir().unwrap();
    let input = temp.path().join("in");
    write_csv(&input.join("a.csv"), &scores(0..50), ',');
    std::fs::write(input.join("b_bad.csv"), "id,name,score\n1,x,not-a-number\n").unwrap();
    let dataset = || Dataset::read_csv(input.to_str().unwrap()).show_progress(false);
    let error = dataset().take_all().unwrap_err().to_string();
    assert!(error.contains("b_bad.csv") && error.contains("read_csv"), "{error}");
    let summary = dataset()
        .on_error(OnError::Skip)
        .write_csv(temp.path().join("out"))
        .unwrap();
    assert_eq!(summary.rows, 50);
    assert!(summary.errors[0].source.ends_with("b_bad.csv"), "{:?}", summary.errors);
}

#[test]
fn typed_rows_are_written_as_parquet_and_read_back_by_column() {
    init();
    let temp = tempfile::tempdir().unwrap();
    let summary = Dataset::from_items(scores(0..2000))
        .items_per_block(300)
        .show_progress(false)
        .write_parquet(temp.path().join("out"))
        .unwrap();
    assert_eq!((summary.rows, summary.files.len()), (2000, 7));
    let rows = Dataset::read_parquet(temp.path().join("out").to_str().unwrap())
        .show_progress(false)
        .rows::<Score>()
        .take_all()
        .unwrap();
    assert_eq!(by_id(rows), scores(0..2000));
}

/// Writes a `side` x `side` gray image whose every pixel is `value`.
fn write_image(path: &Path, side: u32, value: u8) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    image::GrayImage::from_pixel(side, side, image::Luma([value]))
        .save(path)
        .unwrap();
}

#[test]
fn images_decode_to_rows_resized_with_labels_from_their_folders() {
    init();
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().join("images");
    for label in 0..3u8 {
        for n in 0..4u8 {
            write_image(&root.join(format!("{label}/img_{n}.png")), 8, label * 50 + n);
        }
    }
    image::RgbImage::from_pixel(6, 4, image::Rgb([10, 20, 30]))
        .save(root.join("2/photo.jpg"))
        .unwrap();
    std::fs::write(root.join("notes.txt"), "not an image").unwrap();
    let options = ImageOptions::default().size(4, 4).labels_from_folders();
    let images: Vec<Image> = Dataset::read_images(root.to_str().unwrap(), options.clone())
        .show_progress(false)
        .take_all()
        .unwrap();
    assert_eq!(images.len(), 13, "the text file is left out");
    let mut labels = BTreeMap::new();
    for image in &images {
        assert_eq!(
            (image.width, image.height, image.channels, image.pixels.len()),
            (4, 4, 1, 16)
        );
        *labels.entry(image.label.clone().unwrap()).or_insert(0) += 1;
    }
    assert_eq!(
        labels,
        BTreeMap::from([("0".into(), 4), ("1".into(), 4), ("2".into(), 5)])
    );
    let png = images.iter().find(|i| i.path.ends_with("1/img_3.png")).unwrap();
    assert!(png.pixels.iter().all(|p| *p == 53), "{:?}", png.pixels);

    let rgb = Dataset::read_images(
        root.join("2/photo.jpg").to_str().unwrap(),
        ImageOptions::default().mode(ImageMode::Rgb),
    )
    .show_progress(false)
    .take_all()
    .unwrap();
    assert_eq!(
        (rgb[0].width, rgb[0].height, rgb[0].channels, rgb[0].label.clone()),
        (6, 4, 3, None)
    );

    std::fs::write(root.join("1/broken.png"), b"\x89PNG but not really").unwrap();
    let error = Dataset::read_images(root.to_str().unwrap(), options.clone())
        .show_progress(false)
        .take_all()
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("broken.png") && error.contains("not a decodable image"),
        "{error}"
    );
    let mut skipping = Dataset::read_images(root.to_str().unwrap(), options)
        .show_progress(false)
        .on_error(OnError::Skip)
        .iter_batches(100)
        .unwrap();
    let decoded: usize = skipping.by_ref().map(|batch| batch.unwrap().len()).sum();
    assert_eq!(decoded, 13);
    assert!(
        skipping.skipped()[0].source.ends_with("broken.png"),
        "{:?}",
        skipping.skipped()
    );
}
