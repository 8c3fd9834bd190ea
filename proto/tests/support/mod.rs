//! What the task stream tests share: a batch of one task whose id carries
//! a payload of a given size.

use raylet_proto::v1::{TaskBatch, TaskSpec};

pub fn batch(function: &str, payload: usize) -> TaskBatch {
    TaskBatch {
        tasks: vec![TaskSpec {
            function: function.to_string(),
            task_id: vec![7; payload],
            ..TaskSpec::default()
        }],
        ..TaskBatch::default()
    }
}
