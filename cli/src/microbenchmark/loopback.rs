//! One loopback TCP stream, the reference that node-to-node transfer is
//! compared with, measured in the same run as `bench/physlimits.c tcp`
//! measures it: a thread writes 1 MiB blocks to 127.0.0.1 for a while, and
//! the reader reads them into one 1 MiB buffer; the reader's rate counts.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// The name the stream's rate is printed under.
pub(super) const METRIC: &str = "loopback TCP one stream gigabytes";

/// Bytes of each write and of the reader's buffer.
const BLOCK: usize = 1 << 20;

/// GB/s that one stream carries, written for `duration`.
pub(super) fn stream_rate(duration: Duration) -> io::Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    let writer = std::thread::spawn(move || write_blocks(address, duration));
    let (mut reader, _) = listener.accept()?;
    let mut buffer = vec![0u8; BLOCK];
    let started = Instant::now();
    let (mut received, mut last) = (0u64, started);
    loop {
        match reader.read(&mut buffer)? {
            0 => break,
            read => received += read as u64,
        }
        last = Instant::now();
    }
    writer
        .join()
        .map_err(|_| io::Error::other("the loopback writer panicked"))??;
    Ok(received as f64 / (last - started).as_secs_f64() / 1e9)
}

fn write_blocks(address: SocketAddr, duration: Duration) -> io::Result<()> {
    let mut stream = TcpStream::connect(address)?;
    let block = vec![7u8; BLOCK];
    let started = Instant::now();
    while started.elapsed() < duration {
        stream.write_all(&block)?;
    }
    Ok(())
}
