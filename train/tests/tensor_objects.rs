//! Tensors as cluster objects, on the CPU through the same code a GPU's take
//! (staged to host on put, placed on the getter's device on get): the
//! putting process gets its own tensor back without a copy, a worker gets
//! it from the object store (4 MiB, so through shared memory), and a tensor
//! a worker puts comes back to the driver.

use burn::prelude::*;
use burn::tensor::TensorData;
use raylet_train::{TensorRef, cpu_device};

/// Doubles the tensor `input` holds, on this worker's device, and stores the
/// result; says whether the input was this worker's own.
#[raylet::remote]
fn double(input: TensorRef<2>) -> (bool, TensorRef<2>) {
    let cluster = raylet::current().unwrap();
    let tensor = input.get(&cluster, &cpu_device()).unwrap();
    (input.is_local(), TensorRef::put(&cluster, tensor * 2.0).unwrap())
}

fn values(tensor: Tensor<2>) -> Vec<f32> {
    tensor.into_data().try_into_vec::<f32>().unwrap()
}

#[test]
fn a_tensor_goes_to_a_worker_and_back_and_stays_uncopied_where_it_was_put() {
    let cluster = raylet::init().unwrap();
    let device = cpu_device();
    let input: Vec<f32> = (0..1 << 20).map(|i| (i % 1000) as f32).collect();
    let tensor = Tensor::<2>::from_data(TensorData::new(input.clone(), [1024, 1024]), &device);
    let stored = TensorRef::put(&cluster, tensor).unwrap();
    assert!(stored.is_local());
    assert_eq!(values(stored.get(&cluster, &device).unwrap()), input);

    let (was_local_there, doubled) = double::remote(&cluster, stored.clone()).unwrap().get().unwrap();
    assert!(!was_local_there, "the worker read the tensor from the object store");
    assert!(
        !doubled.is_local(),
        "the driver reads the worker's tensor from the store"
    );
    let doubled = doubled.get(&cluster, &device).unwrap();
    assert_eq!(doubled.dims(), [1024, 1024]);
    let expected: Vec<f32> = input.iter().map(|v| v * 2.0).collect();
    assert_eq!(values(doubled), expected);
    cluster.shutdown().unwrap();
}
