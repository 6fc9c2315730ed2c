//! Live membership: which agents the dispatcher sends clients to, named by their stable ids
//! (an agent's `--agent-id`, which is also what its tickets, its link and the handoff name it
//! by), never by list positions. Sans-IO: the agents file's parser and the plan that turns one
//! roster into another; `roster.rs` applies plans, `admin.rs` takes them from operators.
//!
//! The agents file (`--agents-file`, TOML; reloaded when it changes and on SIGHUP):
//!
//! ```toml
//! [[agent]]
//! id = 0
//! addr = "10.0.0.11:8443"
//! link = "10.0.0.11:9443"  # its --link-listen; needed for `handoff`
//!
//! [[agent]]
//! id = 1
//! addr = "10.0.0.12:8443"
//! link = "10.0.0.12:9443"
//! state = "draining"       # active (default), draining or disabled
//! ```

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// Agents one dispatcher can know at once (slots, including removed agents whose streams are
/// still open).
pub const MAX_AGENTS: usize = 256;

/// What an operator asked of an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Admin {
    /// Takes new clients and is home to its share of them.
    #[default]
    Active,
    /// No new clients and no new homes; its established streams finish (on the way out).
    Draining,
    /// Out of rotation like a draining agent, but parked rather than leaving: not health
    /// checked, and enabled again by an operator.
    Disabled,
}

impl Admin {
    pub fn label(self) -> &'static str {
        match self {
            Admin::Active => "active",
            Admin::Draining => "draining",
            Admin::Disabled => "disabled",
        }
    }
}

/// One agent as the roster names it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    pub id: u16,
    /// Its TLS address (clients' TCP connections without links; health checks always).
    pub addr: SocketAddr,
    /// Its link address (`--link-listen`), when the dispatcher carries clients on links.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<SocketAddr>,
    #[serde(default, rename = "state")]
    pub admin: Admin,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RosterError {
    #[error("agents file: {0}")]
    Syntax(String),
    #[error("agent id {0} appears twice")]
    DuplicateId(u16),
    #[error("address {0} is given to two agents")]
    DuplicateAddr(SocketAddr),
    #[error("more than {MAX_AGENTS} agents")]
    TooMany,
    #[error("agent {0} has no link address, and the others have one (links are all or none)")]
    MixedLinks(u16),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    agent: Vec<Spec>,
}

/// Parses and checks an agents file.
pub fn parse_file(text: &str) -> Result<Vec<Spec>, RosterError> {
    let file: File = toml::from_str(text).map_err(|e| RosterError::Syntax(e.message().into()))?;
    check(&file.agent)?;
    Ok(file.agent)
}

/// A roster is usable: ids and addresses unique, not too many, links all or none.
pub fn check(specs: &[Spec]) -> Result<(), RosterError> {
    if specs.len() > MAX_AGENTS {
        return Err(RosterError::TooMany);
    }
    let mut ids = HashSet::new();
    let mut addrs = HashSet::new();
    for s in specs {
        if !ids.insert(s.id) {
            return Err(RosterError::DuplicateId(s.id));
        }
        for a in std::iter::once(s.addr).chain(s.link) {
            if !addrs.insert(a) {
                return Err(RosterError::DuplicateAddr(a));
            }
        }
    }
    let with_links = specs.iter().filter(|s| s.link.is_some()).count();
    if with_links != 0 && with_links != specs.len() {
        let lacking = specs.iter().find(|s| s.link.is_none());
        return Err(RosterError::MixedLinks(lacking.map_or(0, |s| s.id)));
    }
    Ok(())
}

/// One step from a roster to another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Add(Spec),
    /// Leaves the roster: no new clients; its streams finish.
    Remove(u16),
    SetAdmin(u16, Admin),
}

/// The changes that turn `current` into `desired`, removals first (so that an agent moved to a
/// new address, which is a removal and an addition, never has both at once). An agent whose
/// address or link changed is removed and added again: its streams finish on the old address.
pub fn plan(current: &[Spec], desired: &[Spec]) -> Vec<Change> {
    let now: BTreeMap<u16, &Spec> = current.iter().map(|s| (s.id, s)).collect();
    let want: BTreeMap<u16, &Spec> = desired.iter().map(|s| (s.id, s)).collect();
    let mut removals = Vec::new();
    let mut rest = Vec::new();
    for (id, s) in &now {
        match want.get(id) {
            None => removals.push(Change::Remove(*id)),
            Some(w) if w.addr != s.addr || w.link != s.link => {
                removals.push(Change::Remove(*id));
                rest.push(Change::Add((*w).clone()));
            }
            Some(w) if w.admin != s.admin => rest.push(Change::SetAdmin(*id, w.admin)),
            Some(_) => {}
        }
    }
    for (id, w) in &want {
        if !now.contains_key(id) {
            rest.push(Change::Add((*w).clone()));
        }
    }
    removals.extend(rest);
    removals
}

/// `current` with `changes` applied (what `plan` promises to reach).
pub fn apply(current: &[Spec], changes: &[Change]) -> Vec<Spec> {
    let mut out: Vec<Spec> = current.to_vec();
    for c in changes {
        match c {
            Change::Add(s) => {
                out.retain(|o| o.id != s.id);
                out.push(s.clone());
            }
            Change::Remove(id) => out.retain(|o| o.id != *id),
            Change::SetAdmin(id, admin) => {
                if let Some(o) = out.iter_mut().find(|o| o.id == *id) {
                    o.admin = *admin;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(id: u16, port: u16, admin: Admin) -> Spec {
        Spec {
            id,
            addr: SocketAddr::from(([10, 0, 0, 1], port)),
            link: Some(SocketAddr::from(([10, 0, 0, 1], port + 1000))),
            admin,
        }
    }

    #[test]
    fn parses_the_documented_file() {
        let text = "[[agent]]\nid = 0\naddr = \"10.0.0.11:8443\"\nlink = \"10.0.0.11:9443\"\n\n\
                    [[agent]]\nid = 1\naddr = \"10.0.0.12:8443\"\nlink = \"10.0.0.12:9443\"\n\
                    state = \"draining\"\n";
        let r = parse_file(text).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[1].admin, Admin::Draining);
        assert_eq!(r[0].admin, Admin::Active);
        assert_eq!(parse_file("").unwrap(), vec![]);
    }

    #[test]
    fn refuses_rosters_that_cannot_be_served() {
        let twice =
            "[[agent]]\nid = 3\naddr = \"10.0.0.1:1\"\n[[agent]]\nid = 3\naddr = \"10.0.0.1:2\"\n";
        assert_eq!(parse_file(twice), Err(RosterError::DuplicateId(3)));
        let shared =
            "[[agent]]\nid = 1\naddr = \"10.0.0.1:1\"\n[[agent]]\nid = 2\naddr = \"10.0.0.1:1\"\n";
        assert!(matches!(
            parse_file(shared),
            Err(RosterError::DuplicateAddr(_))
        ));
        let mixed = "[[agent]]\nid = 1\naddr = \"10.0.0.1:1\"\nlink = \"10.0.0.1:9\"\n\
                     [[agent]]\nid = 2\naddr = \"10.0.0.1:2\"\n";
        assert_eq!(parse_file(mixed), Err(RosterError::MixedLinks(2)));
        assert!(matches!(
            parse_file("[[agent]]\nid = 1\naddr = \"x\"\n"),
            Err(RosterError::Syntax(_))
        ));
        assert!(matches!(
            parse_file("[[agent]]\nid = 1\naddr = \"10.0.0.1:1\"\nweight = 2\n"),
            Err(RosterError::Syntax(_))
        ));
    }

    #[test]
    fn a_moved_agent_is_removed_before_it_is_added() {
        let a = vec![spec(1, 1, Admin::Active), spec(2, 2, Admin::Active)];
        let b = vec![spec(1, 1, Admin::Draining), spec(2, 7, Admin::Active)];
        assert_eq!(
            plan(&a, &b),
            vec![
                Change::Remove(2),
                Change::SetAdmin(1, Admin::Draining),
                Change::Add(spec(2, 7, Admin::Active)),
            ]
        );
        assert_eq!(plan(&b, &b), vec![]);
    }

    fn roster() -> impl Strategy<Value = Vec<Spec>> {
        let admin = prop_oneof![
            Just(Admin::Active),
            Just(Admin::Draining),
            Just(Admin::Disabled)
        ];
        proptest::collection::btree_map(0u16..12, (0u16..3, admin), 0..8).prop_map(|m| {
            m.into_iter()
                .map(|(id, (port, admin))| spec(id, 100 * id + port, admin))
                .collect()
        })
    }

    proptest! {
        /// The plan reaches the desired roster, touches only agents that differ, and is
        /// empty when nothing does.
        #[test]
        fn the_plan_reaches_the_desired_roster(a in roster(), b in roster()) {
            let changes = plan(&a, &b);
            let mut got = apply(&a, &changes);
            got.sort_by_key(|s| s.id);
            let mut want = b.clone();
            want.sort_by_key(|s| s.id);
            prop_assert_eq!(got, want);
            for c in &changes {
                let id = match c { Change::Add(s) => s.id, Change::Remove(id) | Change::SetAdmin(id, _) => *id };
                prop_assert!(a.iter().find(|s| s.id == id) != b.iter().find(|s| s.id == id));
            }
            prop_assert!(plan(&b, &b).is_empty());
        }
    }
}
