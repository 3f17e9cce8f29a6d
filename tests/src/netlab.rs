//! A network lab on this machine for the chaos suite's network faults: every nats-server and
//! every host in a network namespace of its own, joined to the root namespace by a veth pair,
//! the root namespace routing between them. Every packet between two members crosses the root
//! namespace's `FORWARD` chain, so a fault is one `iptables` rule there:
//! - [`Lab::cut`]: every packet to or from a member dropped (a host partitioned from every node);
//! - [`Lab::cut_between`]: packets between two groups dropped (a minority node cut off from the
//!   rest of its cluster, its clients still connected);
//! - [`Lab::shape`]: packets queued to user space (`NFQUEUE`) and released after a delay, or
//!   dropped, by [`Shaper`]: this kernel has no `netem` qdisc.
//!
//! The test process itself stays in the root namespace and reaches every member directly
//! (its traffic is local, not forwarded), so faults never blind the assertions. Needs root,
//! `ip` (iproute2) and `iptables`; `tests/setup.sh` installs them.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where lab subnets are allocated: one directory per `10.<n>.0.0/16` in use, holding the
/// allocating process's pid, so concurrent tests never share addresses.
const LOCKS: &str = "/tmp/dedup-netlab";

/// One network namespace in the lab.
#[derive(Debug, Clone)]
pub struct Member {
    /// The namespace's name (`ip netns exec <ns> ...`).
    pub ns: String,
    /// Its address.
    pub ip: String,
}

impl Member {
    /// A command that runs `program` inside this member's namespace.
    pub fn command(&self, program: impl Into<PathBuf>) -> Command {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.ns])
            .arg(program.into());
        command
    }
}

/// A lab: its members, and the rules it added, removed on drop.
pub struct Lab {
    net: u8,
    members: Vec<Member>,
    rules: Vec<Vec<String>>,
    shapers: Vec<Shaper>,
}

impl Lab {
    /// A new, empty lab on a subnet no other running test uses.
    ///
    /// Panics with what to install when this machine cannot build one (not root, no `ip` or
    /// `iptables`): the chaos suite's network faults are not optional.
    pub fn new() -> Self {
        for tool in [["ip", "-V"], ["iptables", "-V"]] {
            let ok = Command::new(tool[0])
                .arg(tool[1])
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            assert!(
                ok,
                "`{}` is missing: the network-fault tests need iproute2 and iptables, as root (`bash tests/setup.sh` installs them)",
                tool[0]
            );
        }
        // The root namespace routes between the members (no `sysctl` binary needed).
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")
            .expect("enable IPv4 forwarding (the network-fault tests run as root)");
        Self {
            net: allocate_net(),
            members: Vec::new(),
            rules: Vec::new(),
            shapers: Vec::new(),
        }
    }

    /// Adds a member: a namespace with loopback up and one veth to the root namespace,
    /// addressed `10.<net>.<index>.2`, its default route through the root side.
    pub fn add(&mut self) -> Member {
        let index = self.members.len() as u8 + 1;
        let name = format!("dhl{}-{index}", self.net);
        let (inside, outside) = (format!("{name}i"), format!("{name}o"));
        let (root_ip, ip) = (
            format!("10.{}.{index}.1", self.net),
            format!("10.{}.{index}.2", self.net),
        );
        run(&["ip", "netns", "add", &name]);
        run(&[
            "ip", "link", "add", &outside, "type", "veth", "peer", "name", &inside,
        ]);
        run(&["ip", "link", "set", &inside, "netns", &name]);
        run(&[
            "ip",
            "addr",
            "add",
            &format!("{root_ip}/24"),
            "dev",
            &outside,
        ]);
        run(&["ip", "link", "set", &outside, "up"]);
        let in_ns = |args: &[&str]| {
            let mut all = vec!["ip", "-n", &name];
            all.extend_from_slice(args);
            run(&all);
        };
        in_ns(&["addr", "add", &format!("{ip}/24"), "dev", &inside]);
        in_ns(&["link", "set", &inside, "up"]);
        in_ns(&["link", "set", "lo", "up"]);
        in_ns(&["route", "add", "default", "via", &root_ip]);
        let member = Member { ns: name, ip };
        self.members.push(member.clone());
        member
    }

    /// Drops every packet to or from `member` until [`Lab::heal`].
    pub fn cut(&mut self, member: &Member) {
        self.rule(&["-s", &member.ip, "-j", "DROP"]);
        self.rule(&["-d", &member.ip, "-j", "DROP"]);
    }

    /// Drops every packet between a member of `a` and a member of `b` (both ways) until
    /// [`Lab::heal`]; their traffic with everyone else flows.
    pub fn cut_between(&mut self, a: &[&Member], b: &[&Member]) {
        for x in a {
            for y in b {
                self.rule(&["-s", &x.ip, "-d", &y.ip, "-j", "DROP"]);
                self.rule(&["-s", &y.ip, "-d", &x.ip, "-j", "DROP"]);
            }
        }
    }

    /// Delays every packet to or from `members` by `delay` ± `jitter` and drops `loss` of
    /// them (0.0–1.0), until [`Lab::heal`].
    pub fn shape(&mut self, members: &[&Member], delay: Duration, jitter: Duration, loss: f64) {
        let queue = 100 + u16::from(self.net) * 4 + self.shapers.len() as u16;
        let shaper = Shaper::start(queue, delay, jitter, loss);
        let num = queue.to_string();
        for m in members {
            for dir in ["-s", "-d"] {
                self.rule(&[
                    dir,
                    &m.ip,
                    "-j",
                    "NFQUEUE",
                    "--queue-num",
                    &num,
                    "--queue-bypass",
                ]);
            }
        }
        self.shapers.push(shaper);
    }

    /// Removes every fault: rules first, then the shapers release what they hold.
    pub fn heal(&mut self) {
        for rule in std::mem::take(&mut self.rules).into_iter().rev() {
            let mut args = vec!["iptables", "-w", "-D", "FORWARD"];
            args.extend(rule.iter().map(String::as_str));
            run(&args);
        }
        for shaper in std::mem::take(&mut self.shapers) {
            shaper.stop();
        }
    }

    fn rule(&mut self, rule: &[&str]) {
        let mut args = vec!["iptables", "-w", "-I", "FORWARD"];
        args.extend_from_slice(rule);
        run(&args);
        self.rules
            .push(rule.iter().map(|s| s.to_string()).collect());
    }
}

impl Default for Lab {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.heal();
        for m in &self.members {
            // Deleting the namespace deletes its veth end, and with it the root end.
            let _ = Command::new("ip").args(["netns", "del", &m.ns]).status();
        }
        let _ = std::fs::remove_dir_all(format!("{LOCKS}/{}", self.net));
    }
}

/// Runs a set-up command, panicking with its output when it fails.
fn run(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run `{}`: {e}", args.join(" ")));
    assert!(
        out.status.success(),
        "`{}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A `10.<n>` network no live test holds: a directory per network records its holder's pid;
/// one whose holder is gone (a killed test) is taken over, after removing what it left.
fn allocate_net() -> u8 {
    std::fs::create_dir_all(LOCKS).expect("create the lab lock directory");
    let start = (std::process::id() % 200) as u8;
    for i in 0..200u8 {
        let net = 20 + (start.wrapping_add(i) % 200);
        let dir = format!("{LOCKS}/{net}");
        if std::fs::create_dir(&dir).is_ok() {
            std::fs::write(format!("{dir}/pid"), std::process::id().to_string()).ok();
            clean_leftovers(net);
            return net;
        }
        let holder = std::fs::read_to_string(format!("{dir}/pid")).unwrap_or_default();
        let alive = !holder.is_empty() && PathBuf::from(format!("/proc/{holder}")).exists();
        if !alive && std::fs::remove_dir_all(&dir).is_ok() && std::fs::create_dir(&dir).is_ok() {
            std::fs::write(format!("{dir}/pid"), std::process::id().to_string()).ok();
            clean_leftovers(net);
            return net;
        }
    }
    panic!("no free lab network under {LOCKS}: remove stale entries");
}

/// Removes namespaces and rules a killed test left on network `net`.
fn clean_leftovers(net: u8) {
    let prefix = format!("dhl{net}-");
    if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            if name.starts_with(&prefix) {
                let _ = Command::new("ip").args(["netns", "del", name]).status();
            }
        }
    }
    let subnet = format!("10.{net}.");
    if let Ok(out) = Command::new("iptables")
        .args(["-w", "-S", "FORWARD"])
        .output()
    {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if line.starts_with("-A FORWARD") && line.contains(&subnet) {
                let mut args = vec!["-w".to_string(), "-D".to_string()];
                args.extend(line["-A ".len()..].split_whitespace().map(String::from));
                let _ = Command::new("iptables").args(&args).status();
            }
        }
    }
}

/// Counts what a [`Shaper`] did.
static SHAPED: AtomicU32 = AtomicU32::new(0);

/// A user-space packet shaper on one `NFQUEUE`: a thread that holds each packet for the delay
/// (± jitter) and drops a share of them. Stopping it releases everything it holds.
pub struct Shaper {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Shaper {
    fn start(queue_num: u16, delay: Duration, jitter: Duration, loss: f64) -> Self {
        let mut queue = nfq::Queue::open().expect("open an NFQUEUE socket (needs root)");
        queue.bind(queue_num).expect("bind the NFQUEUE");
        queue
            .set_fail_open(queue_num, true)
            .expect("NFQUEUE fail-open");
        queue.set_nonblocking(true);
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut held: VecDeque<(Instant, nfq::Message)> = VecDeque::new();
            let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(queue_num);
            let mut next = move || {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed
            };
            while !stopping.load(Ordering::SeqCst) {
                let mut idle = true;
                while let Ok(mut msg) = queue.recv() {
                    idle = false;
                    SHAPED.fetch_add(1, Ordering::Relaxed);
                    if (next() % 10_000) as f64 / 10_000.0 < loss {
                        msg.set_verdict(nfq::Verdict::Drop);
                        let _ = queue.verdict(msg);
                        continue;
                    }
                    let spread = jitter.as_micros() as u64;
                    let offset = if spread == 0 {
                        0
                    } else {
                        next() % (2 * spread)
                    };
                    let hold = (delay + Duration::from_micros(offset)).saturating_sub(jitter);
                    msg.set_verdict(nfq::Verdict::Accept);
                    held.push_back((Instant::now() + hold, msg));
                }
                // Released in arrival order: a TCP stream is not reordered by jitter.
                let now = Instant::now();
                while held.front().is_some_and(|(at, _)| *at <= now) {
                    let (_, msg) = held.pop_front().expect("front");
                    let _ = queue.verdict(msg);
                }
                if idle {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            for (_, msg) in held {
                let _ = queue.verdict(msg);
            }
            let _ = queue.unbind(queue_num);
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }

    fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Packets every shaper has seen so far in this process (to show a shaping test shaped).
pub fn shaped_packets() -> u32 {
    SHAPED.load(Ordering::Relaxed)
}
