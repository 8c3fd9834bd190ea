//! A dashboard for a program's own embedded cluster: served from a thread
//! of its own on a loopback port while the returned handle lives.

use std::net::{Ipv4Addr, SocketAddr};
use std::thread::JoinHandle;

use raylet::Cluster;
use raylet_common::auth::AuthToken;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// The dashboard of the cluster a program started with `raylet::init()`
/// (a started head serves its own: `raylet start --head --dashboard-port`).
/// Dropping it stops the server.
///
/// ```no_run
/// let cluster = raylet::init()?;
/// let dashboard = raylet_dashboard::LocalDashboard::start(&cluster, 0)?;
/// println!("http://{}/ (token {})", dashboard.address(), cluster.token());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct LocalDashboard {
    address: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<()>>,
}

impl LocalDashboard {
    /// Serves the dashboard of `cluster` on the loopback `port` (0: any
    /// free one).
    pub fn start(cluster: &Cluster, port: u16) -> std::io::Result<LocalDashboard> {
        let token = AuthToken::parse(&cluster.token()).map_err(std::io::Error::other)?;
        let head = cluster.head_address();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let listener = std::net::TcpListener::bind(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port))?;
        listener.set_nonblocking(true)?;
        let address = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let server = std::thread::Builder::new()
            .name("raylet-dashboard".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let shutdown = async {
                        let _ = stopped.await;
                    };
                    let served = match TcpListener::from_std(listener) {
                        Ok(listener) => crate::run(listener, head, token, shutdown).await,
                        Err(e) => Err(e),
                    };
                    if let Err(e) = served {
                        tracing::error!("the dashboard at {address} stopped: {e}");
                    }
                });
            })?;
        Ok(LocalDashboard {
            address,
            stop: Some(stop),
            server: Some(server),
        })
    }

    /// Where the dashboard listens: open `http://ADDRESS/`.
    pub fn address(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for LocalDashboard {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            let _ = server.join();
        }
    }
}
