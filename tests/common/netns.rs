//! Test hosts made of network namespaces: each host is a namespace with one
//! veth link to a bridge in the test's own namespace, so that its daemons
//! have their own address and can be cut off (link down), frozen or killed
//! as a whole. Everything a network made is removed when it is dropped.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use raylet_test_support::{Need, missing};

/// A bridge in this namespace and the hosts linked to it, on the subnet
/// 10.(100 + scenario).0.0/24: this namespace is .1, the hosts .2 and up.
pub struct TestNetwork {
    bridge: String,
    hosts: Vec<Host>,
}

/// One namespace: a host with its own address and directory.
pub struct Host {
    pub name: String,
    pub namespace: String,
    pub ip: String,
    /// The end of the host's veth pair on the bridge: down cuts it off.
    link: String,
    /// Where its daemons keep their sessions.
    pub temp: PathBuf,
}

impl TestNetwork {
    /// Makes one host per name under `temp`; `None` where network
    /// namespaces cannot be made and the run leaves them out (else the test
    /// fails, saying why: see `raylet_test_support::missing`).
    pub fn create(scenario: u8, names: &[&str], temp: &Path) -> Option<TestNetwork> {
        if let Err(reason) = namespaces_available() {
            missing(Need::NetworkNamespaces, &reason);
            return None;
        }
        remove_stale(scenario);
        let pid = std::process::id();
        let bridge = format!("rlc{scenario}b{pid}");
        let subnet = format!("10.{}.0", 100 + u32::from(scenario));
        ip(&["link", "add", &bridge, "type", "bridge"]);
        let mut network = TestNetwork {
            bridge: bridge.clone(),
            hosts: Vec::new(),
        };
        ip(&["addr", "add", &format!("{subnet}.1/24"), "dev", &bridge]);
        ip(&["link", "set", &bridge, "up"]);
        for (index, name) in names.iter().enumerate() {
            let host = Host {
                name: name.to_string(),
                namespace: format!("rlc{scenario}-{pid}-{name}"),
                ip: format!("{subnet}.{}", index + 2),
                link: format!("rlc{scenario}v{index}x{pid}"),
                temp: temp.join(name),
            };
            std::fs::create_dir_all(&host.temp).unwrap();
            link_host(&host, &bridge, scenario, index, pid);
            network.hosts.push(host);
        }
        Some(network)
    }

    pub fn host(&self, name: &str) -> &Host {
        self.hosts
            .iter()
            .find(|host| host.name == name)
            .unwrap_or_else(|| panic!("no host {name}"))
    }

    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// Takes the host's link down: its packets go nowhere, its connections
    /// stay open.
    pub fn cut(&self, host: &str) {
        ip(&["link", "set", &self.host(host).link, "down"]);
    }

    /// Brings the host's link up again.
    pub fn heal(&self, host: &str) {
        ip(&["link", "set", &self.host(host).link, "up"]);
    }

    /// `program` to run inside the host's namespace.
    pub fn command(&self, host: &str, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.host(host).namespace, program]);
        command
    }

    /// Sends `signal` to every process in the host's namespace: SIGKILL
    /// ends the host, SIGSTOP freezes it and SIGCONT thaws it.
    pub fn signal_host(&self, host: &str, signal: Signal) {
        for pid in self.host(host).pids() {
            let _ = kill(Pid::from_raw(pid), signal);
        }
    }
}

impl Host {
    /// The processes running in this host's namespace.
    pub fn pids(&self) -> Vec<i32> {
        namespace_pids(&self.namespace)
    }

    /// The inode of the host's namespace: a process on the host reads the
    /// same from `/proc/self/ns/net`.
    pub fn namespace_inode(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(format!("/run/netns/{}", self.namespace))
            .unwrap()
            .ino()
    }
}

impl Drop for TestNetwork {
    fn drop(&mut self) {
        for host in &self.hosts {
            remove_namespace(&host.namespace);
        }
        let _ = Command::new("ip").args(["link", "del", &self.bridge]).output();
    }
}

/// Whether this process may make namespaces, and `ip` is there.
fn namespaces_available() -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata("/proc/self").map_or(true, |me| me.uid() != 0) {
        return Err("they need root".into());
    }
    match Command::new("ip").arg("-V").output() {
        Ok(output) if output.status.success() => Ok(()),
        _ => Err("`ip` (iproute2) is not installed".into()),
    }
}

/// Makes the host's namespace and joins it to the bridge by a veth pair.
fn link_host(host: &Host, bridge: &str, scenario: u8, index: usize, pid: u32) {
    let peer = format!("rlc{scenario}p{index}x{pid}");
    let namespace = host.namespace.as_str();
    ip(&["netns", "add", namespace]);
    ip(&["link", "add", &host.link, "type", "veth", "peer", "name", &peer]);
    ip(&["link", "set", &peer, "netns", namespace]);
    ip(&["link", "set", &host.link, "master", bridge]);
    ip(&["link", "set", &host.link, "up"]);
    ip(&["-n", namespace, "addr", "add", &format!("{}/24", host.ip), "dev", &peer]);
    ip(&["-n", namespace, "link", "set", &peer, "up"]);
    ip(&["-n", namespace, "link", "set", "lo", "up"]);
}

/// Removes what an earlier run of this scenario left behind when its
/// process died before it could.
fn remove_stale(scenario: u8) {
    let dead = |pid: &str| !Path::new(&format!("/proc/{pid}")).exists();
    let namespaces = run(Command::new("ip").args(["netns", "list"]));
    let prefix = format!("rlc{scenario}-");
    for line in String::from_utf8_lossy(&namespaces.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        if let Some(pid) = name.strip_prefix(&prefix).and_then(|rest| rest.split('-').next())
            && dead(pid)
        {
            remove_namespace(name);
        }
    }
    let bridges = run(Command::new("ip").args(["-o", "link", "show", "type", "bridge"]));
    let prefix = format!("rlc{scenario}b");
    for line in String::from_utf8_lossy(&bridges.stdout).lines() {
        let name = line.split(": ").nth(1).unwrap_or_default();
        if let Some(pid) = name.strip_prefix(&prefix)
            && dead(pid)
        {
            let _ = Command::new("ip").args(["link", "del", name]).output();
        }
    }
}

/// Ends every process in the namespace (they are the test's own daemons and
/// workers), then deletes it with its end of the veth pair.
fn remove_namespace(namespace: &str) {
    for _ in 0..50 {
        let pids = namespace_pids(namespace);
        if pids.is_empty() {
            break;
        }
        for pid in pids {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = Command::new("ip").args(["netns", "del", namespace]).output();
}

fn namespace_pids(namespace: &str) -> Vec<i32> {
    let output = run(Command::new("ip").args(["netns", "pids", namespace]));
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .filter_map(|pid| pid.parse().ok())
        .collect()
}

/// Runs `ip ARGS` and asserts that it succeeded.
fn ip(args: &[&str]) {
    let output = run(Command::new("ip").args(args));
    assert!(
        output.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn run(command: &mut Command) -> Output {
    command.output().expect("ip runs")
}

/// Runs `raylet start ARGS` on `host`, with the host's address, a 256 MiB
/// object store, heartbeats every 200 ms and death after 3 s of silence.
pub fn start_daemon(network: &TestNetwork, host: &str, args: &[&str]) {
    let on = network.host(host);
    let output = network
        .command(host, super::RAYLET)
        .arg("start")
        .args(args)
        .args(["--node-ip", &on.ip, "--object-store-memory", "268435456"])
        .args(["--heartbeat-interval", "200ms", "--heartbeat-timeout", "3s"])
        .arg("--temp-dir")
        .arg(&on.temp)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "raylet start {args:?} on {host}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Whether this process may make network namespaces; `false` only where
/// it cannot and the run leaves them out (else the test fails, saying why:
/// see `raylet_test_support::missing`).
pub fn can_make_namespaces() -> bool {
    match namespaces_available() {
        Ok(()) => true,
        Err(reason) => {
            missing(Need::NetworkNamespaces, &reason);
            false
        }
    }
}

/// Removes, with their processes, the namespaces whose names begin with
/// `prefix`.
pub fn remove_namespaces_named(prefix: &str) {
    let namespaces = run(Command::new("ip").args(["netns", "list"]));
    for line in String::from_utf8_lossy(&namespaces.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        if name.starts_with(prefix) {
            remove_namespace(name);
        }
    }
}

/// Removes the bridges `<bridge_prefix><pid>` and the namespaces
/// `<namespace_prefix><pid>-...` of test processes that died before they
/// could.
pub fn remove_stale_of_dead_tests(bridge_prefix: &str, namespace_prefix: &str) {
    let dead = |pid: &str| !pid.is_empty() && !Path::new(&format!("/proc/{pid}")).exists();
    let namespaces = run(Command::new("ip").args(["netns", "list"]));
    for line in String::from_utf8_lossy(&namespaces.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        if let Some(pid) = name
            .strip_prefix(namespace_prefix)
            .and_then(|rest| rest.split('-').next())
            && dead(pid)
        {
            remove_namespace(name);
        }
    }
    let bridges = run(Command::new("ip").args(["-o", "link", "show", "type", "bridge"]));
    for line in String::from_utf8_lossy(&bridges.stdout).lines() {
        let name = line.split(": ").nth(1).unwrap_or_default();
        if let Some(pid) = name.strip_prefix(bridge_prefix)
            && dead(pid)
        {
            let _ = Command::new("ip").args(["link", "del", name]).output();
        }
    }
}
