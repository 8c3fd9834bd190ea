//! Which local address to use to reach a peer.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs, UdpSocket};

use raylet_proto::Error;

use crate::Result;

/// Loopback when `peer` is on loopback; otherwise the local address the
/// kernel would use to reach it (a UDP connect sends no packet).
pub fn local_ip_towards(peer: &str) -> Result<IpAddr> {
    let resolve_error = |e: String| Error::InvalidArgument(format!("cannot resolve {peer}: {e}"));
    let address = peer
        .to_socket_addrs()
        .map_err(|e| resolve_error(e.to_string()))?
        .next()
        .ok_or_else(|| resolve_error("no address".into()))?;
    if address.ip().is_loopback() {
        return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    let probe = UdpSocket::bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0))?;
    probe
        .connect(address)
        .map_err(|e| Error::Unavailable(format!("no route to {peer}: {e}")))?;
    Ok(probe.local_addr()?.ip())
}
