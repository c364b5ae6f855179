//! Who CMD is, inside the sandbox and on the host, and the id maps that make
//! it so. Pure: the launcher's own ids, `--uid`/`--gid`, `--owner` and
//! `SUDO_UID`/`SUDO_GID` come in; the user namespace's maps, the ids CMD
//! switches to and the idmap of writable binds come out. Owns no I/O: the
//! maps are written by `namespaces`, `--owner` is looked up by the caller.
//!
//! Inside, CMD is `--uid`/`--gid` (1000 by default) and never 0. A process
//! that is uid 0 with an empty bounding set cannot map uid 0 into a user
//! namespace of its own (the kernel wants CAP_SETFCAP in the parent for a
//! map whose lower id is 0), so neither `unshare -U --map-root-user` nor
//! Chromium's namespace sandbox could work inside; a non-root uid maps
//! itself (`0 1000 1`) without any capability. That uid must already exist
//! in the sandbox's namespace, and CMD, holding no capability, cannot add
//! it: so the launcher writes the sandbox's map itself, from outside.
//!
//! On the host, CMD's kernel ids are:
//! - started unprivileged: the caller's own (the only ids it may map);
//! - started as root (in the initial user namespace): the owner's —
//!   `--owner`, else `SUDO_UID`/`SUDO_GID`, else root — except that CMD
//!   never holds host id 0: for an owner that is root it runs as
//!   [`NOBODY`]. The writable binds (the working directory, `--rw`) are then
//!   idmapped mounts that show the owner's files as CMD's and store what CMD
//!   creates as the owner's, so "files land owned by the invoking user" and
//!   "no host privilege" hold together: a root-only file shown with `--ro`
//!   stays unreadable.

/// `--uid`/`--gid` when not given.
pub const DEFAULT_ID: u32 = 1000;
/// The unprivileged host id CMD runs as when the owner is root (the
/// kernel's overflow uid and gid, "nobody"/"nogroup").
pub const NOBODY: u32 = 65534;

/// The launcher's own ids.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// Root in the initial user namespace: may write any id map and make
    /// idmapped mounts. (uid 0 inside some other user namespace is not.)
    pub privileged: bool,
}

/// A host account, as `--owner` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

/// The id maps of an idmapped mount: on-disk ids (inside) to the ids the
/// sandbox's processes have (outside), in `/proc/PID/uid_map` form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdMap {
    pub uid_map: String,
    pub gid_map: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// CMD's uid and gid inside.
    pub uid: u32,
    pub gid: u32,
    /// CMD's uid and gid on the host (never 0).
    pub host_uid: u32,
    pub host_gid: u32,
    /// Whom files created in writable binds belong to.
    pub owner_uid: u32,
    pub owner_gid: u32,
    pub privileged: bool,
    caller: Caller,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    #[error(
        "--{0} 0: CMD never runs as root inside the sandbox (a root without capabilities \
         cannot build a sandbox of its own, as Chromium does); pick another id"
    )]
    Root(&'static str),
    #[error(
        "--owner {0}: only egressd run started as root can make files belong to another user \
         (started as uid {1}, files belong to uid {1})"
    )]
    OwnerNeedsRoot(String, u32),
}

/// `SUDO_UID`/`SUDO_GID` from an environment, when both are ids and the
/// uid is not root.
pub fn sudo_ids<'a>(env: impl IntoIterator<Item = (&'a str, &'a str)>) -> Option<(u32, u32)> {
    let (mut uid, mut gid) = (None, None);
    for (k, v) in env {
        match k {
            "SUDO_UID" => uid = v.parse::<u32>().ok(),
            "SUDO_GID" => gid = v.parse::<u32>().ok(),
            _ => {}
        }
    }
    match (uid, gid) {
        (Some(u), Some(g)) if u != 0 => Some((u, g)),
        _ => None,
    }
}

impl Identity {
    /// Decides CMD's ids. `inside` is (`--uid`, `--gid`); `sudo` is
    /// [`sudo_ids`] of the launcher's environment.
    pub fn resolve(
        caller: Caller,
        inside: (u32, u32),
        owner: Option<&Account>,
        sudo: Option<(u32, u32)>,
    ) -> Result<Identity, IdentityError> {
        let (uid, gid) = inside;
        if uid == 0 {
            return Err(IdentityError::Root("uid"));
        }
        if gid == 0 {
            return Err(IdentityError::Root("gid"));
        }
        let (owner_uid, owner_gid) = match (owner, caller.privileged) {
            (Some(a), true) => (a.uid, a.gid),
            (Some(a), false) if a.uid == caller.uid => (caller.uid, caller.gid),
            (Some(a), false) => {
                return Err(IdentityError::OwnerNeedsRoot(a.name.clone(), caller.uid))
            }
            (None, true) => sudo.unwrap_or((caller.uid, caller.gid)),
            (None, false) => (caller.uid, caller.gid),
        };
        let (host_uid, host_gid) = if caller.privileged {
            (
                if owner_uid == 0 { NOBODY } else { owner_uid },
                if owner_gid == 0 { NOBODY } else { owner_gid },
            )
        } else {
            (caller.uid, caller.gid)
        };
        Ok(Identity {
            uid,
            gid,
            host_uid,
            host_gid,
            owner_uid,
            owner_gid,
            privileged: caller.privileged,
            caller,
        })
    }

    /// The sandbox's `uid_map`. Root: the sandbox's own root (its init,
    /// which sets up the mounts) is host root, CMD's uid is `host_uid`.
    /// Unprivileged: the caller's uid is the only one there is, and it is
    /// CMD's (init holds the namespace's capabilities, CMD none).
    pub fn uid_map(&self) -> String {
        if self.privileged {
            format!("0 0 1\n{} {} 1\n", self.uid, self.host_uid)
        } else {
            format!("{} {} 1\n", self.uid, self.caller.uid)
        }
    }

    pub fn gid_map(&self) -> String {
        if self.privileged {
            format!("0 0 1\n{} {} 1\n", self.gid, self.host_gid)
        } else {
            format!("{} {} 1\n", self.gid, self.caller.gid)
        }
    }

    /// Unprivileged maps need `setgroups` denied first; CMD then keeps the
    /// caller's supplementary groups (unmapped inside). Root keeps it
    /// allowed so that CMD can drop root's groups.
    pub fn deny_setgroups(&self) -> bool {
        !self.privileged
    }

    /// The idmap for the writable binds, when CMD's host ids are not the
    /// owner's (the owner is root): the owner's on-disk ids appear as CMD's.
    pub fn bind_idmap(&self) -> Option<IdMap> {
        if (self.host_uid, self.host_gid) == (self.owner_uid, self.owner_gid) {
            return None;
        }
        Some(IdMap {
            uid_map: format!("{} {} 1\n", self.owner_uid, self.host_uid),
            gid_map: format!("{} {} 1\n", self.owner_gid, self.host_gid),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: Caller = Caller {
        uid: 0,
        gid: 0,
        privileged: true,
    };
    const ME: Caller = Caller {
        uid: 1234,
        gid: 1235,
        privileged: false,
    };

    fn nobody() -> Account {
        Account {
            name: "nobody".into(),
            uid: 65534,
            gid: 65534,
        }
    }

    #[test]
    fn unprivileged_maps_its_own_ids_to_cmds() {
        let i = Identity::resolve(ME, (1000, 1000), None, Some((5, 5))).unwrap();
        assert_eq!(i.uid_map(), "1000 1234 1\n");
        assert_eq!(i.gid_map(), "1000 1235 1\n");
        assert!(i.deny_setgroups());
        assert_eq!(
            (i.host_uid, i.owner_uid),
            (1234, 1234),
            "SUDO_UID is ignored"
        );
        assert_eq!(i.bind_idmap(), None);
    }

    #[test]
    fn root_never_lends_cmd_host_root() {
        let i = Identity::resolve(ROOT, (1000, 1000), None, None).unwrap();
        assert_eq!(i.uid_map(), "0 0 1\n1000 65534 1\n");
        assert_eq!(i.gid_map(), "0 0 1\n1000 65534 1\n");
        assert!(!i.deny_setgroups());
        assert_eq!((i.owner_uid, i.owner_gid), (0, 0));
        assert_eq!(
            i.bind_idmap(),
            Some(IdMap {
                uid_map: "0 65534 1\n".into(),
                gid_map: "0 65534 1\n".into()
            })
        );
    }

    #[test]
    fn root_runs_cmd_as_the_sudo_user_or_the_owner() {
        let i = Identity::resolve(ROOT, (1000, 1000), None, Some((501, 20))).unwrap();
        assert_eq!(i.uid_map(), "0 0 1\n1000 501 1\n");
        assert_eq!(i.gid_map(), "0 0 1\n1000 20 1\n");
        assert_eq!(i.bind_idmap(), None);

        let i = Identity::resolve(ROOT, (2000, 3000), Some(&nobody()), Some((501, 20))).unwrap();
        assert_eq!(i.uid_map(), "0 0 1\n2000 65534 1\n");
        assert_eq!(i.gid_map(), "0 0 1\n3000 65534 1\n");
        assert_eq!((i.owner_uid, i.owner_gid), (65534, 65534));
        assert_eq!(i.bind_idmap(), None);

        // An owner whose primary group is root: CMD's gid is not root either.
        let staff = Account {
            name: "ops".into(),
            uid: 700,
            gid: 0,
        };
        let i = Identity::resolve(ROOT, (1000, 1000), Some(&staff), None).unwrap();
        assert_eq!(i.gid_map(), "0 0 1\n1000 65534 1\n");
        assert_eq!(
            i.bind_idmap(),
            Some(IdMap {
                uid_map: "700 700 1\n".into(),
                gid_map: "0 65534 1\n".into()
            })
        );
    }

    #[test]
    fn refusals() {
        assert_eq!(
            Identity::resolve(ME, (0, 1000), None, None),
            Err(IdentityError::Root("uid"))
        );
        assert_eq!(
            Identity::resolve(ROOT, (1000, 0), None, None),
            Err(IdentityError::Root("gid"))
        );
        assert_eq!(
            Identity::resolve(ME, (1000, 1000), Some(&nobody()), None),
            Err(IdentityError::OwnerNeedsRoot("nobody".into(), 1234))
        );
        let me = Account {
            name: "me".into(),
            uid: 1234,
            gid: 1,
        };
        assert!(Identity::resolve(ME, (1000, 1000), Some(&me), None).is_ok());
    }

    #[test]
    fn sudo_ids_need_both_and_not_root() {
        assert_eq!(
            sudo_ids([("SUDO_UID", "501"), ("SUDO_GID", "20")]),
            Some((501, 20))
        );
        assert_eq!(sudo_ids([("SUDO_UID", "501")]), None);
        assert_eq!(sudo_ids([("SUDO_UID", "0"), ("SUDO_GID", "0")]), None);
        assert_eq!(sudo_ids([("SUDO_UID", "x"), ("SUDO_GID", "1")]), None);
    }
}
