//! `baton check dispatch FILE` and `baton check agents FILE`: what the dispatcher would refuse
//! at start, found without starting it: the file's keys and values, the rules between
//! settings, the agents file it names, and the modes of the files holding secrets. The admin
//! token file is looked at, never created.

use std::path::Path;

use baton_ops::check::Report;

use crate::config::DispatchArgs;
use crate::members;

/// Checks what `baton dispatch ARGS` would run with (`--config` and flags, flags winning).
pub fn check(args: DispatchArgs) -> Report {
    let mut report = Report::new(
        args.config
            .as_ref()
            .map_or("dispatch flags".into(), |p| p.display().to_string()),
    );
    let Some(args) = report.take(args.merged()) else {
        return report;
    };
    if let Some(config) = report.take(args.clone().resolve_with(|_| Ok(None))) {
        if config.agents_file.is_some() {
            report.take(config.initial_agents());
        }
    }
    if let Some(file) = &args.cluster_key_file {
        report.secret_file("cluster-key-file", file);
    }
    if let (Some(_), Some(file)) = (args.admin, &args.admin_token_file) {
        if file.exists() {
            report.secret_file("admin-token-file", file);
        } else {
            report.warning(format!(
                "admin-token-file {}: does not exist; the dispatcher will write a random token \
                 there (mode 0600) at start",
                file.display()
            ));
        }
    }
    report
}

/// The dispatcher's agents file (`--agents-file`): syntax, unique ids and addresses, links all
/// or none.
pub fn check_agents_file(path: &Path) -> Report {
    let mut report = Report::new(path.display().to_string());
    if let Some(text) = read(path, &mut report) {
        if let Err(e) = members::parse_file(&text) {
            report.problem(e);
        }
    }
    report
}

fn read(path: &Path, report: &mut Report) -> Option<String> {
    std::fs::read_to_string(path)
        .map_err(|e| report.problem(format!("reading it: {e}")))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dispatcher_file_with_several_problems_lists_each() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("cluster.key");
        std::fs::write(&key, "k").unwrap();
        let file = dir.path().join("dispatch.toml");
        std::fs::write(
            &file,
            format!("agent = [\"127.0.0.1:9001\"]\nadmin = \"10.0.0.1:9000\"\ncluster-key-file = {key:?}\n"),
        )
        .unwrap();
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        let r = check(DispatchArgs {
            config: Some(file),
            ..Default::default()
        });
        // the admin address off loopback, the cluster key readable by others
        assert_eq!(r.problems().len(), 2, "{:?}", r.problems());
        assert!(!dir.path().join("admin-token").exists());
    }

    #[test]
    fn an_agents_file_with_a_duplicate_id_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agents.toml");
        std::fs::write(
            &file,
            "[[agent]]\nid = 0\naddr = \"127.0.0.1:9001\"\n[[agent]]\nid = 0\naddr = \"127.0.0.1:9002\"\n",
        )
        .unwrap();
        let r = check_agents_file(&file);
        assert_eq!(r.problems().len(), 1, "{:?}", r.problems());
        std::fs::write(&file, "[[agent]]\nid = 0\naddr = \"127.0.0.1:9001\"\n").unwrap();
        assert!(check_agents_file(&file).problems().is_empty());
    }
}
