//! The runtime object storage calls run on, so that callers (tasks,
//! drivers, actors) call them synchronously from any thread.

use std::sync::OnceLock;

/// Runs `future` on this crate's runtime and waits for it; callable
/// from any thread, inside another runtime or not.
pub fn run<F>(future: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    let runtime = RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("raylet-storage-io")
            .enable_all()
            .build()
            .expect("the storage I/O runtime starts")
    });
    let (sender, receiver) = std::sync::mpsc::sync_channel(1);
    runtime.spawn(async move {
        let _ = sender.send(future.await);
    });
    receiver.recv().expect("an I/O future runs to its end")
}
