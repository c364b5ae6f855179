//! Whole-sandbox limits through a cgroup of the sandbox's own, created
//! before the sandbox and removed after it:
//! - `--memory`: RAM with no swap on top (cgroup v2 `memory.max` and
//!   `memory.swap.max = 0`, v1 `memory.limit_in_bytes` and
//!   `memory.memsw.limit_in_bytes`); when the sandbox reaches it, the whole
//!   sandbox is killed (v2 `memory.oom.group`; v1: the launcher kills it on
//!   the kernel's OOM notification), not one process chosen by the kernel;
//! - `--pids`: `pids.max`, counting CMD and everything it starts (threads
//!   included), not egressd's own [`OWN_TASKS`];
//! - `--cpu`: the CPU time the sandbox used, summed over all its processes
//!   (v2 `cpu.stat`, which every v2 group has; v1 `cpuacct.usage`), read by
//!   the launcher, which kills the sandbox when it is used up.
//!
//! Where the group goes: on cgroup v2, under the launcher's own group when
//! that is the hierarchy's root, else beside it (a v2 group that holds
//! processes cannot hand controllers to a child, so a child of the
//! launcher's own group would get no memory or pids controller). A v1
//! hierarchy (hosts that still mount one, where v2 lacks the controller)
//! gets a child of the launcher's group. Either way it takes write access:
//! root, or a delegated subtree. What cannot be had falls back to rlimits
//! in the caller, which says so.
//!
//! Owns the groups' directories and their files; does not own the
//! processes (the outer process joins by writing to [`Cgroups::procs`]) or
//! the decision to kill (the launcher's).

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::limits::Limits;
use super::sys;

/// egressd's own processes in the sandbox's group: the outer process and
/// the sandbox's init. `pids.max` is `--pids` plus these.
pub const OWN_TASKS: u64 = 2;
/// How long removing a group may wait for its last process to be gone.
const REMOVE_DEADLINE: Duration = Duration::from_secs(2);
const REMOVE_RETRY: Duration = Duration::from_millis(5);

/// One cgroup hierarchy the launcher is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    pub v2: bool,
    /// v1: the controllers bound to it (`memory`, `cpu`, `cpuacct`, …).
    pub controllers: Vec<String>,
    /// The directory of the launcher's own group.
    pub own: PathBuf,
    /// Whether that group is the root of what is mounted.
    pub at_root: bool,
}

/// The hierarchies of `/proc/self/cgroup` that `/proc/self/mountinfo`
/// shows a mount for. Pure.
pub fn hierarchies(proc_cgroup: &str, mountinfo: &str) -> Vec<Hierarchy> {
    struct Mount {
        root: String,
        point: PathBuf,
        v2: bool,
        opts: Vec<String>,
    }
    let mounts: Vec<Mount> = mountinfo
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let mut post = post.split(' ');
            let fstype = post.next()?;
            let _source = post.next()?;
            let opts = post.next().unwrap_or("");
            let v2 = match fstype {
                "cgroup2" => true,
                "cgroup" => false,
                _ => return None,
            };
            Some(Mount {
                root: unescape(pre.get(3)?),
                point: PathBuf::from(unescape(pre.get(4)?)),
                v2,
                opts: opts.split(',').map(str::to_string).collect(),
            })
        })
        .collect();
    let mut out = Vec::new();
    for line in proc_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(_), Some(ctrl), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let v2 = ctrl.is_empty();
        let controllers: Vec<String> = ctrl
            .split(',')
            .filter(|c| !c.is_empty())
            .map(str::to_string)
            .collect();
        let mount = mounts
            .iter()
            .find(|m| m.v2 == v2 && (v2 || controllers.iter().all(|c| m.opts.contains(c))));
        let Some(m) = mount else { continue };
        let Some(rel) = Path::new(path).strip_prefix(&m.root).ok() else {
            continue; // our group is outside what is mounted
        };
        out.push(Hierarchy {
            v2,
            controllers,
            own: m.point.join(rel).components().collect(),
            at_root: rel.as_os_str().is_empty(),
        });
    }
    out
}

/// mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let code = std::str::from_utf8(&b[i + 1..i + 4])
                .ok()
                .and_then(|o| u8::from_str_radix(o, 8).ok());
            if let Some(v) = code {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[derive(Debug)]
struct Group {
    dir: PathBuf,
    v2: bool,
}

/// The sandbox's groups (one per hierarchy used), removed on drop.
#[derive(Debug, Default)]
pub struct Cgroups {
    groups: Vec<Group>,
    memory: Option<usize>,
    pids: Option<usize>,
    cpu: Option<usize>,
    /// v1: signalled by the kernel on an OOM in the memory group.
    oom_event: Option<OwnedFd>,
    /// Held open while the event is registered.
    _oom_control: Option<std::fs::File>,
}

/// What [`create`] could not cover, and why.
#[derive(Debug, Default)]
pub struct Uncovered {
    pub limits: Limits,
    /// (`--memory`, `--pids` or `--cpu`, why), first reason first.
    pub why: Vec<(&'static str, String)>,
}

impl Uncovered {
    /// For each limit still uncovered, the last reason (the last place
    /// tried), without repeats.
    pub fn reasons(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for (flag, open) in [
            ("--memory", self.limits.memory.is_some()),
            ("--pids", self.limits.pids.is_some()),
            ("--cpu", self.limits.cpu_secs.is_some()),
        ] {
            let last = self.why.iter().rev().find(|(f, _)| *f == flag);
            if let (true, Some((_, w))) = (open, last) {
                if !out.contains(&w.as_str()) {
                    out.push(w);
                }
            }
        }
        out
    }
}

/// Creates the groups for `limits` (named `name`, e.g. `egressd-run-PID`).
/// Never fails: what is not covered comes back, with the reasons, for the
/// rlimit fallback.
pub fn create(limits: &Limits, name: &str) -> (Cgroups, Uncovered) {
    let mut cg = Cgroups::default();
    let mut left = Uncovered {
        limits: Limits {
            memory: limits.memory,
            pids: limits.pids,
            cpu_secs: limits.cpu_secs,
            file_size: None,
        },
        why: Vec::new(),
    };
    if left.limits.memory.is_none() && left.limits.pids.is_none() && left.limits.cpu_secs.is_none()
    {
        return (cg, left);
    }
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let hs = hierarchies(&read("/proc/self/cgroup"), &read("/proc/self/mountinfo"));
    if hs.is_empty() {
        for f in ["--memory", "--pids", "--cpu"] {
            left.why.push((f, "no cgroup filesystem is mounted".into()));
        }
        return (cg, left);
    }
    if let Some(h) = hs.iter().find(|h| h.v2) {
        cg.add_v2(h, name, &mut left);
    }
    for (flag, ctrl, wanted) in [
        ("--memory", "memory", left.limits.memory.is_some()),
        ("--pids", "pids", left.limits.pids.is_some()),
        ("--cpu", "cpuacct", left.limits.cpu_secs.is_some()),
    ] {
        if !wanted {
            continue;
        }
        let found = hs
            .iter()
            .find(|h| !h.v2 && h.controllers.iter().any(|c| c == ctrl));
        match found {
            Some(h) => {
                if let Err(e) = cg.add_v1(h, ctrl, name, &mut left.limits) {
                    left.why.push((flag, e));
                }
            }
            None if hs.iter().any(|h| !h.v2) => left.why.push((
                flag,
                format!("no cgroup v1 hierarchy has the {ctrl} controller"),
            )),
            None => {}
        }
    }
    (cg, left)
}

fn write(dir: &Path, file: &str, value: impl std::fmt::Display) -> Result<(), String> {
    let p = dir.join(file);
    std::fs::write(&p, value.to_string()).map_err(|e| format!("cannot write {}: {e}", p.display()))
}

/// Creates `dir`, replacing an empty leftover of a launcher that was killed.
fn make_dir(dir: &Path) -> Result<(), String> {
    match std::fs::create_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            std::fs::remove_dir(dir).and_then(|()| std::fs::create_dir(dir))
        }
        r => r,
    }
    .map_err(|e| format!("cannot create {}: {e}", dir.display()))
}

/// The controllers on for `parent`'s children, after enabling those the
/// limits want (what cannot be is said in `left`).
fn enable_controllers(parent: &Path, left: &mut Uncovered) -> Vec<String> {
    let read = |f: &str| std::fs::read_to_string(parent.join(f)).unwrap_or_default();
    let mut on: Vec<String> = read("cgroup.subtree_control")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let available = read("cgroup.controllers");
    for (flag, ctrl, wanted) in [
        ("--memory", "memory", left.limits.memory.is_some()),
        ("--pids", "pids", left.limits.pids.is_some()),
    ] {
        if !wanted || on.iter().any(|c| c == ctrl) {
            continue;
        }
        if !available.split_whitespace().any(|c| c == ctrl) {
            left.why.push((
                flag,
                format!("cgroup v2 has no {ctrl} controller in {}", parent.display()),
            ));
            continue;
        }
        // The hierarchy's root may hand a controller to children even
        // while it holds processes; any other group refuses (EBUSY).
        match std::fs::write(parent.join("cgroup.subtree_control"), format!("+{ctrl}")) {
            Ok(()) => on.push(ctrl.to_string()),
            Err(e) => left.why.push((
                flag,
                format!(
                    "cannot enable the {ctrl} controller in {}: {e}",
                    parent.display()
                ),
            )),
        }
    }
    on
}

impl Cgroups {
    fn add_v2(&mut self, h: &Hierarchy, name: &str, left: &mut Uncovered) {
        let parent = match h.own.parent() {
            _ if h.at_root => h.own.clone(),
            Some(p) => p.to_path_buf(),
            None => return,
        };
        let on = enable_controllers(&parent, left);
        let memory = left
            .limits
            .memory
            .filter(|_| on.iter().any(|c| c == "memory"));
        let pids = left.limits.pids.filter(|_| on.iter().any(|c| c == "pids"));
        let cpu = left.limits.cpu_secs;
        if memory.is_none() && pids.is_none() && cpu.is_none() {
            return;
        }
        let dir = parent.join(name);
        if let Err(e) = make_dir(&dir) {
            for f in ["--memory", "--pids", "--cpu"] {
                left.why.push((f, e.clone()));
            }
            return;
        }
        let idx = self.groups.len();
        self.groups.push(Group {
            dir: dir.clone(),
            v2: true,
        });
        if let Some(m) = memory {
            let set = write(&dir, "memory.max", m)
                .and_then(|()| match dir.join("memory.swap.max").exists() {
                    true => write(&dir, "memory.swap.max", 0),
                    false => Ok(()),
                })
                .and_then(|()| write(&dir, "memory.oom.group", 1));
            match set {
                Ok(()) => {
                    self.memory = Some(idx);
                    left.limits.memory = None;
                }
                Err(e) => left.why.push(("--memory", e)),
            }
        }
        if let Some(n) = pids {
            match write(&dir, "pids.max", n.saturating_add(OWN_TASKS)) {
                Ok(()) => {
                    self.pids = Some(idx);
                    left.limits.pids = None;
                }
                Err(e) => left.why.push(("--pids", e)),
            }
        }
        if cpu.is_some() {
            self.cpu = Some(idx);
            left.limits.cpu_secs = None;
        }
    }

    fn add_v1(
        &mut self,
        h: &Hierarchy,
        ctrl: &str,
        name: &str,
        left: &mut Limits,
    ) -> Result<(), String> {
        let dir = h.own.join(name);
        // One hierarchy may carry several controllers (cpu,cpuacct).
        let idx = match self.groups.iter().position(|g| g.dir == dir) {
            Some(i) => i,
            None => {
                make_dir(&dir)?;
                self.groups.push(Group {
                    dir: dir.clone(),
                    v2: false,
                });
                self.groups.len() - 1
            }
        };
        match ctrl {
            "memory" => {
                let m = left.memory.expect("wanted");
                write(&dir, "memory.limit_in_bytes", m)?;
                if dir.join("memory.memsw.limit_in_bytes").exists() {
                    write(&dir, "memory.memsw.limit_in_bytes", m)?;
                }
                let control = std::fs::File::open(dir.join("memory.oom_control"))
                    .map_err(|e| format!("cannot open memory.oom_control: {e}"))?;
                let event = sys::eventfd().map_err(|e| format!("cannot create an eventfd: {e}"))?;
                write(
                    &dir,
                    "cgroup.event_control",
                    format!("{} {}", event.as_raw_fd(), control.as_raw_fd()),
                )?;
                self.oom_event = Some(event);
                self._oom_control = Some(control);
                self.memory = Some(idx);
                left.memory = None;
            }
            "pids" => {
                let n = left.pids.expect("wanted");
                write(&dir, "pids.max", n.saturating_add(OWN_TASKS))?;
                self.pids = Some(idx);
                left.pids = None;
            }
            _ => {
                self.cpu = Some(idx);
                left.cpu_secs = None;
            }
        }
        Ok(())
    }

    /// The `cgroup.procs` files the sandbox's outer process writes itself
    /// into (`0`: the writer), before it creates anything.
    pub fn procs(&self) -> Vec<PathBuf> {
        self.groups
            .iter()
            .map(|g| g.dir.join("cgroup.procs"))
            .collect()
    }

    pub fn covers_cpu(&self) -> bool {
        self.cpu.is_some()
    }

    /// v1: the eventfd the kernel signals when the memory group hits its
    /// limit (v2 kills the whole group itself).
    pub fn take_oom_event(&mut self) -> Option<OwnedFd> {
        self.oom_event.take()
    }

    /// CPU time the sandbox has used so far.
    pub fn cpu_used(&self) -> io::Result<Duration> {
        let g = &self.groups[self.cpu.ok_or_else(|| io::Error::other("no cpu group"))?];
        if g.v2 {
            let stat = std::fs::read_to_string(g.dir.join("cpu.stat"))?;
            let usec =
                field(&stat, "usage_usec").ok_or_else(|| io::Error::other("no usage_usec"))?;
            Ok(Duration::from_micros(usec))
        } else {
            let ns = std::fs::read_to_string(g.dir.join("cpuacct.usage"))?;
            let ns: u64 = ns.trim().parse().map_err(io::Error::other)?;
            Ok(Duration::from_nanos(ns))
        }
    }

    /// How often the kernel killed for memory in the sandbox's group.
    pub fn oom_kills(&self) -> u64 {
        let Some(g) = self.memory.map(|i| &self.groups[i]) else {
            return 0;
        };
        let file = if g.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        let text = std::fs::read_to_string(g.dir.join(file)).unwrap_or_default();
        field(&text, "oom_kill").unwrap_or(0)
    }
}

/// The value of `name` in a flat-keyed cgroup file (`name value` lines).
fn field(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == name).then(|| v.trim().parse().ok()).flatten()
    })
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        self.oom_event = None;
        self._oom_control = None;
        for g in self.groups.iter().rev() {
            // The last process may still be on its way out of the group.
            let deadline = Instant::now() + REMOVE_DEADLINE;
            loop {
                match std::fs::remove_dir(&g.dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(e) if Instant::now() >= deadline => {
                        eprintln!(
                            "egressd run: cannot remove the sandbox's cgroup {}: {e}",
                            g.dir.display()
                        );
                        break;
                    }
                    Err(_) => std::thread::sleep(REMOVE_RETRY),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_CGROUP: &str = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/0da1\n\
                                 2:cpu,cpuacct:/x\n0::/\n";
    const HYBRID_MOUNTS: &str = "\
30 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
31 25 0:27 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
32 25 0:28 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
33 25 0:29 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
34 25 0:30 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
22 1 8:1 / / rw,relatime - ext4 /dev/vda rw
";

    #[test]
    fn hybrid_hosts_have_v1_controllers_and_a_bare_v2() {
        let hs = hierarchies(HYBRID_CGROUP, HYBRID_MOUNTS);
        let find = |c: &str| hs.iter().find(|h| h.controllers.iter().any(|x| x == c));
        assert_eq!(
            find("memory").unwrap().own,
            Path::new("/sys/fs/cgroup/memory/process_api/0da1")
        );
        assert!(!find("memory").unwrap().at_root);
        assert!(find("pids").unwrap().at_root);
        assert_eq!(
            find("cpuacct").unwrap().own,
            Path::new("/sys/fs/cgroup/cpu,cpuacct/x")
        );
        let v2 = hs.iter().find(|h| h.v2).unwrap();
        assert_eq!(v2.own, Path::new("/sys/fs/cgroup/unified"));
        assert!(v2.at_root);
        assert_eq!(hs.len(), 5);
    }

    #[test]
    fn a_container_mounts_a_subtree() {
        let hs = hierarchies(
            "0::/user.slice/user-1000.slice/session-2.scope\n",
            "40 30 0:35 /user.slice /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
        );
        assert_eq!(
            hs,
            [Hierarchy {
                v2: true,
                controllers: vec![],
                own: "/sys/fs/cgroup/user-1000.slice/session-2.scope".into(),
                at_root: false,
            }]
        );
        // A group outside the mounted subtree cannot be reached.
        assert!(hierarchies(
            "0::/system.slice\n",
            "40 30 0:35 /user.slice /x rw - cgroup2 c rw\n"
        )
        .is_empty());
        assert_eq!(unescape(r"/mnt/with\040space"), "/mnt/with space");
    }

    #[test]
    fn flat_keyed_files() {
        let events = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 1\n";
        assert_eq!(field(events, "oom_kill"), Some(1));
        assert_eq!(
            field("usage_usec 1500\nuser_usec 1000\n", "usage_usec"),
            Some(1500)
        );
        assert_eq!(
            field("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", "oom_kill"),
            Some(3)
        );
        assert_eq!(field("", "oom_kill"), None);
    }
}
