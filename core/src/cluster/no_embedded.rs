//! A build without the embedded cluster (raylet's feature `embedded` off):
//! the driver joins a running cluster, and `raylet::init()` without an
//! address says how to give one.

use raylet_common::auth::AuthToken;

use crate::cluster::config::Config;
use crate::{Error, Result};

/// No embedded cluster can run in this build, so none is ever made.
pub(crate) enum Embedded {}

impl Embedded {
    /// Refuses: this build has no head or node manager to start.
    pub(crate) async fn start(_config: &Config) -> Result<Self> {
        Err(Error::NoEmbeddedCluster)
    }

    pub(crate) fn node_manager(&self) -> &str {
        match *self {}
    }

    pub(crate) fn head_address(&self) -> &str {
        match *self {}
    }

    pub(crate) fn token(&self) -> &AuthToken {
        match *self {}
    }

    pub(crate) async fn stop(self) -> Result<()> {
        match self {}
    }
}
