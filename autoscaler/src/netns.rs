//! The `netns` provider: each node is a host of its own on this machine, a
//! network namespace `raylet-<cluster>-<n>` linked by a veth pair to a
//! bridge in the provider's namespace, with the subnet's `n`th address. It
//! runs `ip netns exec <namespace> raylet start --address HEAD --node-ip
//! <address> --block` as a child of the provider. The bridge, made if
//! missing, holds the subnet's first address (the gateway), where the head
//! listens. For multi-host tests and demonstrations on one machine; it needs
//! root and iproute2, and one subnet to a cluster.
//!
//! `instances()` reads the namespaces from `ip netns list`, and each one's
//! node type from the record the launch left beside the node's log, so that
//! a restarted head finds the nodes its predecessor launched. A node whose
//! process ended without `terminate` is failed, with the end of its log.
//! `terminate` sends SIGTERM to the node's process (to every process in the
//! namespace for a node an earlier provider started), SIGKILL to what is
//! left after a grace period, and deletes the namespace, which removes its
//! veth pair.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs::File;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};

use crate::cluster_name::{ClusterNameError, check_cluster_name};
use crate::command_error::{self, CommandError};
use crate::output_tail::output_tail;
use crate::provider::{
    Instance, InstanceId, InstanceState, LaunchRequest, NodeProvider, ProviderCall, ProviderError, TOKEN_ENV,
    start_flags,
};

/// How long a terminated node may take to stop before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long processes may outlive SIGKILL before terminate gives up.
const KILL_PATIENCE: Duration = Duration::from_secs(5);
/// How often a stopping node's namespace is looked at.
const STOP_POLL: Duration = Duration::from_millis(50);
/// The name of a node's end of its veth pair, inside its namespace.
const NODE_LINK: &str = "eth0";
/// The longest Linux interface name.
const MAX_INTERFACE_NAME: usize = 15;

/// The bridge, the addresses and the binary of the nodes: the `provider:`
/// section of a cluster config with `type: netns`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetnsConfig {
    /// The bridge the nodes' veth links join, in the head's namespace; made
    /// (with the gateway address) if missing. A Linux interface name: at
    /// most 15 characters.
    pub bridge: String,
    /// The IPv4 subnet of the bridge and the nodes, `ADDRESS/PREFIX` with a
    /// prefix of 8 to 30: the bridge has its first address (the gateway,
    /// where the head listens), the nodes the following ones. Each cluster
    /// on a machine needs a subnet and bridge of its own.
    pub subnet: String,
    /// The `raylet` binary the nodes run; by default this process's own
    /// executable.
    pub binary: PathBuf,
    /// The nodes' `--temp-dir`; the provider keeps each node's log and
    /// record under its `autoscaler/` directory.
    pub temp_dir: PathBuf,
}

impl Default for NetnsConfig {
    fn default() -> Self {
        NetnsConfig {
            bridge: "raylet0".to_string(),
            subnet: "10.213.0.0/24".to_string(),
            binary: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("raylet")),
            temp_dir: PathBuf::from("/tmp/raylet"),
        }
    }
}

/// Why a [`NetnsProvider`] cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error(transparent)]
    ClusterName(#[from] ClusterNameError),
    #[error("the bridge name `{0}` must be 1 to 15 ASCII letters, digits, `-`, `_` or `.`")]
    BridgeName(String),
    #[error("the subnet `{subnet}` {reason}")]
    Subnet {
        subnet: String,
        #[source]
        reason: SubnetError,
    },
    #[error("the bridge cannot be set up: {0}")]
    Bridge(#[source] CommandError),
}

/// What is wrong with a subnet as the config gives it.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum SubnetError {
    #[error("is not ADDRESS/PREFIX, e.g. 10.213.0.0/24")]
    NotCidr,
    #[error("has no IPv4 address: {address}: {source}")]
    Address {
        address: String,
        source: std::net::AddrParseError,
    },
    #[error("needs a prefix of 8 to 30")]
    Prefix,
}

/// Why a node's namespace could not be made, found or emptied.
#[derive(Debug, thiserror::Error)]
enum HostError {
    #[error(transparent)]
    Ip(#[from] CommandError),
    #[error("the subnet {0} has no address left for another node")]
    SubnetFull(Subnet),
    #[error("writing {}: {source}", path.display())]
    Record { path: PathBuf, source: std::io::Error },
    #[error("running {} in namespace {instance}: {source}", binary.display())]
    Spawn {
        binary: PathBuf,
        instance: InstanceId,
        source: std::io::Error,
    },
    #[error("the node's status cannot be read: {0}")]
    Wait(std::io::Error),
    #[error("processes {pids:?} in namespace {namespace} outlived SIGKILL")]
    OutlivedKill { pids: Vec<i32>, namespace: String },
}

/// Nodes as network namespaces of this machine, of one cluster.
pub struct NetnsProvider {
    cluster: String,
    bridge: String,
    subnet: Subnet,
    binary: PathBuf,
    temp_dir: PathBuf,
    /// Whether this provider made the bridge, which
    /// [`NetnsProvider::remove_bridge`] then deletes.
    made_bridge: bool,
    /// The node processes this provider started and has not terminated.
    children: Mutex<BTreeMap<InstanceId, Child>>,
    /// Held by a launch while it picks a free address and takes it.
    launching: tokio::sync::Mutex<()>,
}

impl NetnsProvider {
    /// A provider for the nodes of `cluster_name`; makes the bridge with the
    /// gateway address if it is missing.
    pub fn new(cluster_name: &str, config: NetnsConfig) -> Result<Self, NetnsError> {
        check_cluster_name(cluster_name)?;
        check_bridge_name(&config.bridge)?;
        let subnet = Subnet::parse(&config.subnet).map_err(|reason| NetnsError::Subnet {
            subnet: config.subnet.clone(),
            reason,
        })?;
        let made_bridge = ensure_bridge(&config.bridge, subnet).map_err(NetnsError::Bridge)?;
        Ok(NetnsProvider {
            cluster: cluster_name.to_string(),
            bridge: config.bridge,
            subnet,
            binary: config.binary,
            temp_dir: config.temp_dir,
            made_bridge,
            children: Mutex::new(BTreeMap::new()),
            launching: tokio::sync::Mutex::new(()),
        })
    }

    /// The bridge's address, where the head must listen for the nodes to
    /// reach it.
    pub fn gateway(&self) -> Ipv4Addr {
        self.subnet.host(1)
    }

    /// Deletes the bridge if this provider made it; for after every
    /// instance is terminated.
    pub fn remove_bridge(&self) -> Result<(), NetnsError> {
        if self.made_bridge {
            ip_blocking(&["link", "del", &self.bridge]).map_err(NetnsError::Bridge)?;
        }
        Ok(())
    }

    fn instance(&self, number: u32) -> InstanceId {
        InstanceId(format!("raylet-{}-{number}", self.cluster))
    }

    /// The host number of a namespace of this cluster, `None` for others'.
    fn host_number(&self, namespace: &str) -> Option<u32> {
        let number = namespace.strip_prefix(&format!("raylet-{}-", self.cluster))?;
        number
            .bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| number.parse().ok())?
    }

    fn log_path(&self, instance: &InstanceId) -> PathBuf {
        self.temp_dir.join("autoscaler").join(format!("{instance}.log"))
    }

    /// The file that holds the name of the node's type.
    fn record_path(&self, instance: &InstanceId) -> PathBuf {
        self.temp_dir.join("autoscaler").join(format!("{instance}.node_type"))
    }

    /// The node type's name from the instance's record, empty if it is lost.
    fn recorded_type(&self, instance: &InstanceId) -> String {
        let text = std::fs::read_to_string(self.record_path(instance)).unwrap_or_default();
        text.trim().to_string()
    }

    /// The namespaces of this cluster, by `ip netns list`.
    async fn namespaces(&self) -> Result<BTreeSet<InstanceId>, CommandError> {
        let listed = ip(&["netns", "list"]).await?;
        let names = listed.lines().filter_map(|line| line.split_whitespace().next());
        let ours = names.filter(|name| self.host_number(name).is_some());
        Ok(ours.map(|name| InstanceId(name.to_string())).collect())
    }

    async fn start(&self, request: &LaunchRequest) -> Result<InstanceId, ProviderError> {
        let launch_error = |message| ProviderError::Launch {
            node_type: request.node_type.name.clone(),
            message,
        };
        if !self.binary.is_file() {
            return Err(launch_error(format!("{} is not a file", self.binary.display())));
        }
        let _launching = self.launching.lock().await;
        let number = self.free_host_number().await.map_err(|e| launch_error(e.to_string()))?;
        let instance = self.instance(number);
        let child = match self.start_host(request, &instance, number).await {
            Ok(child) => child,
            Err(error) => {
                self.remove_host(&instance).await;
                return Err(launch_error(error.to_string()));
            }
        };
        let address = self.subnet.host(number);
        tracing::info!(%instance, node_type = %request.node_type.name, %address, "launched a node in a network namespace");
        self.lock().insert(instance.clone(), child);
        Ok(instance)
    }

    /// The lowest host number that no namespace of this cluster has.
    async fn free_host_number(&self) -> Result<u32, HostError> {
        let taken: BTreeSet<u32> = self
            .namespaces()
            .await?
            .iter()
            .filter_map(|instance| self.host_number(&instance.0))
            .collect();
        let mut numbers = self.subnet.node_numbers();
        numbers
            .find(|number| !taken.contains(number))
            .ok_or(HostError::SubnetFull(self.subnet))
    }

    /// Records the node's type, makes its namespace and link, and starts
    /// its `raylet start` there.
    async fn start_host(
        &self,
        request: &LaunchRequest,
        instance: &InstanceId,
        number: u32,
    ) -> Result<Child, HostError> {
        let record = self.record_path(instance);
        let write_record = || {
            std::fs::create_dir_all(self.temp_dir.join("autoscaler"))?;
            std::fs::write(&record, &request.node_type.name)
        };
        write_record().map_err(|source| HostError::Record { path: record, source })?;
        self.make_namespace(instance, number).await?;
        self.spawn_node(request, instance, number)
            .map_err(|source| HostError::Spawn {
                binary: self.binary.clone(),
                instance: instance.clone(),
                source,
            })
    }

    /// The namespace, with its end of a veth pair as [`NODE_LINK`] holding
    /// its address, and the other end on the bridge.
    async fn make_namespace(&self, instance: &InstanceId, number: u32) -> Result<(), CommandError> {
        let namespace = instance.0.as_str();
        let veth = veth_name(namespace);
        let address = self.subnet.cidr(number);
        let steps: [&[&str]; 7] = [
            &["netns", "add", namespace],
            &[
                "link", "add", &veth, "type", "veth", "peer", "name", NODE_LINK, "netns", namespace,
            ],
            &["link", "set", &veth, "master", &self.bridge],
            &["link", "set", &veth, "up"],
            &["-n", namespace, "addr", "add", &address, "dev", NODE_LINK],
            &["-n", namespace, "link", "set", NODE_LINK, "up"],
            &["-n", namespace, "link", "set", "lo", "up"],
        ];
        for step in steps {
            ip(step).await?;
        }
        Ok(())
    }

    fn spawn_node(&self, request: &LaunchRequest, instance: &InstanceId, number: u32) -> std::io::Result<Child> {
        let log = File::create(self.log_path(instance))?;
        Command::new("ip")
            .args(["netns", "exec", &instance.0])
            .arg(&self.binary)
            .args(start_flags(request, instance))
            .args(["--node-ip", &self.subnet.host(number).to_string(), "--temp-dir"])
            .arg(&self.temp_dir)
            .env(TOKEN_ENV, &request.token)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
    }

    async fn list(&self) -> Result<Vec<Instance>, ProviderError> {
        let namespaces = self
            .namespaces()
            .await
            .map_err(|e| ProviderError::List(e.to_string()))?;
        let mut ids = namespaces.clone();
        ids.extend(self.lock().keys().cloned());
        let mut instances = Vec::with_capacity(ids.len());
        for id in ids {
            let state = match namespaces.contains(&id) {
                true => self.state(&id).await,
                false => InstanceState::Failed(format!("its namespace {id} was deleted")),
            };
            let node_type = self.recorded_type(&id);
            instances.push(Instance { id, node_type, state });
        }
        Ok(instances)
    }

    /// Running while the node's process runs: this provider's child, or for
    /// a node an earlier provider started, any process in its namespace.
    async fn state(&self, instance: &InstanceId) -> InstanceState {
        let exit = self.lock().get_mut(instance).map(Child::try_wait);
        let ended = match exit {
            Some(Ok(None)) => return InstanceState::Running,
            Some(Ok(Some(status))) => format!("the node exited ({status})"),
            Some(Err(e)) => format!("the node's status cannot be read ({e})"),
            None if !namespace_pids(&instance.0).await.is_empty() => return InstanceState::Running,
            None => format!("no process runs in namespace {instance}"),
        };
        InstanceState::Failed(format!(
            "{ended}; its log ends: {}",
            output_tail(&self.log_path(instance))
        ))
    }

    async fn stop(&self, instance: &InstanceId) -> Result<(), ProviderError> {
        let terminate_error = |error: &dyn std::error::Error| ProviderError::Terminate {
            instance: instance.clone(),
            message: error.to_string(),
        };
        let child = self.lock().remove(instance);
        let exists = self
            .namespaces()
            .await
            .map_err(|e| terminate_error(&e))?
            .contains(instance);
        if child.is_none() && !exists {
            return Err(ProviderError::NoSuchInstance(instance.clone()));
        }
        end_processes(&instance.0, child)
            .await
            .map_err(|e| terminate_error(&e))?;
        if exists {
            ip(&["netns", "del", &instance.0])
                .await
                .map_err(|e| terminate_error(&e))?;
        }
        let _ = std::fs::remove_file(self.record_path(instance));
        tracing::info!(%instance, "terminated a node in a network namespace");
        Ok(())
    }

    /// Removes what a launch that failed half-way made.
    async fn remove_host(&self, instance: &InstanceId) {
        end_processes(&instance.0, None).await.ok();
        ip(&["netns", "del", &instance.0]).await.ok();
        let _ = std::fs::remove_file(self.record_path(instance));
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<InstanceId, Child>> {
        self.children.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl NodeProvider for NetnsProvider {
    fn launch<'a>(&'a self, request: &'a LaunchRequest) -> ProviderCall<'a, InstanceId> {
        Box::pin(self.start(request))
    }

    fn instances(&self) -> ProviderCall<'_, Vec<Instance>> {
        Box::pin(self.list())
    }

    fn terminate<'a>(&'a self, instance: &'a InstanceId) -> ProviderCall<'a, ()> {
        Box::pin(self.stop(instance))
    }

    fn tear_down(&self) -> ProviderCall<'_, ()> {
        Box::pin(async move { self.remove_bridge().map_err(|e| ProviderError::TearDown(e.to_string())) })
    }
}

/// An IPv4 subnet: its first address and prefix length.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Subnet {
    network: u32,
    prefix: u8,
}

impl Subnet {
    /// Reads `ADDRESS/PREFIX`, the prefix 8 to 30; host bits are cleared.
    fn parse(text: &str) -> Result<Subnet, SubnetError> {
        let (address, prefix) = text.split_once('/').ok_or(SubnetError::NotCidr)?;
        let address: Ipv4Addr = address.parse().map_err(|source| SubnetError::Address {
            address: address.to_string(),
            source,
        })?;
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|prefix| (8..=30).contains(prefix))
            .ok_or(SubnetError::Prefix)?;
        let mask = u32::MAX << (32 - prefix);
        Ok(Subnet {
            network: u32::from(address) & mask,
            prefix,
        })
    }

    /// The subnet's `number`th address.
    fn host(&self, number: u32) -> Ipv4Addr {
        Ipv4Addr::from(self.network + number)
    }

    /// `ADDRESS/PREFIX` of the `number`th address, as `ip addr add` takes it.
    fn cidr(&self, number: u32) -> String {
        format!("{}/{}", self.host(number), self.prefix)
    }

    /// The host numbers of nodes: after the gateway, before the broadcast
    /// address.
    fn node_numbers(&self) -> std::ops::RangeInclusive<u32> {
        2..=(1u32 << (32 - self.prefix)) - 2
    }
}

impl fmt::Display for Subnet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", Ipv4Addr::from(self.network), self.prefix)
    }
}

fn check_bridge_name(bridge: &str) -> Result<(), NetnsError> {
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if bridge.is_empty() || bridge.len() > MAX_INTERFACE_NAME || !bridge.chars().all(plain) {
        return Err(NetnsError::BridgeName(bridge.to_string()));
    }
    Ok(())
}

/// Makes `bridge` if it is missing, gives it the gateway address if it
/// lacks it, and brings it up; whether it made the bridge.
fn ensure_bridge(bridge: &str, subnet: Subnet) -> Result<bool, CommandError> {
    let missing = ip_blocking(&["link", "show", "dev", bridge]).is_err();
    if missing {
        ip_blocking(&["link", "add", bridge, "type", "bridge"])?;
    }
    let gateway = subnet.cidr(1);
    let addresses = ip_blocking(&["-o", "-4", "addr", "show", "dev", bridge])?;
    if !addresses.split_whitespace().any(|word| word == gateway) {
        ip_blocking(&["addr", "add", &gateway, "dev", bridge])?;
    }
    ip_blocking(&["link", "set", bridge, "up"])?;
    Ok(missing)
}

/// The host's end of a namespace's veth pair: a name of at most 15
/// characters, the same for the same namespace (a 32-bit FNV-1a hash).
fn veth_name(namespace: &str) -> String {
    let hash = namespace.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    });
    format!("rlv{hash:08x}")
}

/// SIGTERM to the node's process (`child`), or without one to every process
/// in `namespace`; SIGKILL to every process left there after
/// [`STOP_GRACE`]; returns once none is left.
async fn end_processes(namespace: &str, mut child: Option<Child>) -> Result<(), HostError> {
    let first = match child.as_ref().and_then(Child::id) {
        Some(pid) => vec![pid as i32],
        None => namespace_pids(namespace).await,
    };
    signal_all(&first, Signal::SIGTERM);
    let kill_after = Instant::now() + STOP_GRACE;
    let give_up = kill_after + KILL_PATIENCE;
    loop {
        let child_ended = match child.as_mut() {
            Some(child) => child.try_wait().map_err(HostError::Wait)?.is_some(),
            None => true,
        };
        let left = namespace_pids(namespace).await;
        if child_ended && left.is_empty() {
            return Ok(());
        }
        let now = Instant::now();
        if now >= give_up {
            return Err(HostError::OutlivedKill {
                pids: left,
                namespace: namespace.to_string(),
            });
        }
        if now >= kill_after {
            tracing::warn!(%namespace, pids = ?left, "a node outlived its grace period: SIGKILL");
            signal_all(&left, Signal::SIGKILL);
            if let Some(child) = child.as_mut() {
                child.start_kill().ok();
            }
        }
        tokio::time::sleep(STOP_POLL).await;
    }
}

fn signal_all(pids: &[i32], signal: Signal) {
    for &pid in pids {
        let _ = kill(Pid::from_raw(pid), signal);
    }
}

/// The processes in `namespace`; none if it does not exist.
async fn namespace_pids(namespace: &str) -> Vec<i32> {
    let listed = ip(&["netns", "pids", namespace]).await.unwrap_or_default();
    listed.split_whitespace().filter_map(|pid| pid.parse().ok()).collect()
}

/// Runs `ip ARGS`: what it printed, or what it said on failing.
async fn ip(args: &[&str]) -> Result<String, CommandError> {
    ip_output(args, Command::new("ip").args(args).output().await)
}

/// [`ip`] for callers that are not async.
fn ip_blocking(args: &[&str]) -> Result<String, CommandError> {
    ip_output(args, std::process::Command::new("ip").args(args).output())
}

fn ip_output(args: &[&str], output: std::io::Result<Output>) -> Result<String, CommandError> {
    let command = format!("ip {}", args.join(" "));
    match output {
        Ok(output) => command_error::printed(&command, output),
        Err(source) => Err(CommandError::Spawn { command, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subnet_gives_the_gateway_first_and_nodes_up_to_the_broadcast_address() {
        let subnet = Subnet::parse("10.213.0.77/24").unwrap();
        assert_eq!(subnet.to_string(), "10.213.0.0/24");
        assert_eq!(subnet.host(1), Ipv4Addr::new(10, 213, 0, 1));
        assert_eq!(subnet.cidr(2), "10.213.0.2/24");
        assert_eq!(subnet.node_numbers(), 2..=254);
        assert_eq!(Subnet::parse("10.0.0.0/30").unwrap().node_numbers(), 2..=2);
        assert_eq!(Subnet::parse("10.0.0.0"), Err(SubnetError::NotCidr));
        assert!(matches!(Subnet::parse("10.0.0/24"), Err(SubnetError::Address { .. })));
        for bad in ["10.0.0.0/31", "10.0.0.0/x"] {
            assert_eq!(Subnet::parse(bad), Err(SubnetError::Prefix), "{bad}");
        }
    }

    #[test]
    fn namespaces_of_other_clusters_are_not_ours() {
        let provider = |cluster: &str| NetnsProvider {
            cluster: cluster.into(),
            bridge: "raylet0".into(),
            subnet: Subnet::parse("10.213.0.0/24").unwrap(),
            binary: "raylet".into(),
            temp_dir: "/tmp/raylet".into(),
            made_bridge: false,
            children: Mutex::new(BTreeMap::new()),
            launching: tokio::sync::Mutex::new(()),
        };
        let (a, a1) = (provider("a"), provider("a-1"));
        assert_eq!(a.instance(7), InstanceId("raylet-a-7".into()));
        assert_eq!(a.host_number("raylet-a-7"), Some(7));
        assert_eq!(a.host_number("raylet-a-1-5"), None, "cluster a-1's node 5");
        assert_eq!(a1.host_number("raylet-a-15"), None, "cluster a's node 15");
        assert_eq!(a1.host_number("raylet-a-1-5"), Some(5));
        assert_eq!(a.host_number("raylet-a-"), None);
        assert_eq!(a.host_number("raylet-a-+7"), None);
    }

    #[test]
    fn veth_names_fit_an_interface_name_and_differ_by_namespace() {
        let name = veth_name("raylet-some-long-cluster-name-254");
        assert!(name.len() <= MAX_INTERFACE_NAME, "{name}");
        assert_eq!(name, veth_name("raylet-some-long-cluster-name-254"));
        assert_ne!(veth_name("raylet-a-2"), veth_name("raylet-a-3"));
    }

    #[test]
    fn the_config_has_defaults_and_refuses_unknown_fields_and_bad_names() {
        let config: NetnsConfig = serde_json::from_str(r#"{"bridge": "rl1"}"#).unwrap();
        assert_eq!(
            (config.bridge.as_str(), config.subnet.as_str()),
            ("rl1", "10.213.0.0/24")
        );
        let unknown = serde_json::from_str::<NetnsConfig>(r#"{"bridges": "rl1"}"#).unwrap_err();
        assert!(unknown.to_string().contains("unknown field `bridges`"), "{unknown}");
        let long = NetnsConfig {
            bridge: "a-very-long-bridge".into(),
            ..NetnsConfig::default()
        };
        let refused = NetnsProvider::new("c", long).err().unwrap();
        assert!(matches!(refused, NetnsError::BridgeName(_)), "{refused}");
        let bad_subnet = NetnsConfig {
            subnet: "10.0.0.0/33".into(),
            ..NetnsConfig::default()
        };
        let refused = NetnsProvider::new("c", bad_subnet).err().unwrap();
        assert_eq!(
            refused.to_string(),
            "the subnet `10.0.0.0/33` needs a prefix of 8 to 30"
        );
    }
}
