//! `baton lab soak --quick` end to end: both systems under load while agents, Redis and the
//! dispatcher are killed, stopped and restarted and every listener is flooded. The run must
//! pass on its own terms (zero unexplained failures, no growth, no panic), every fault kind
//! must really have happened, and every listener must have been flooded beyond its slots while
//! its legitimate peer kept being served.

mod common;

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn lab_binary() -> std::path::PathBuf {
    std::env::var_os("BATON_LAB_BIN")
        .map(Into::into)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_baton").into())
}

fn servers_installed() -> bool {
    let haproxy = std::env::var_os("BATON_HAPROXY")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/usr/sbin/haproxy".into());
    let redis = Command::new("redis-server")
        .arg("--version")
        .output()
        .is_ok();
    if haproxy.exists() && redis {
        return true;
    }
    common::require_or_skip(
        "redis-server and haproxy",
        "the soak's cluster and balancer",
    );
    false
}

#[test]
#[ignore = "slow tier: scripts/test runs it (cargo test -- --include-ignored)"]
fn quick_soak_accounts_for_every_failure() {
    if !servers_installed() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("baton-soak-test-{}", std::process::id()));
    let json = dir.join("soak.json");
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(lab_binary())
        .args(["lab", "soak", "--quick", "--json"])
        .arg(&json)
        .arg("--dir")
        .arg(dir.join("work"))
        .output()
        .expect("running baton lab soak");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "baton lab soak --quick failed (logs in {}):\n{stdout}\n{stderr}",
        dir.display()
    );
    assert!(stdout.contains("unexplained failures: 0"), "{stdout}");
    assert!(stdout.contains("panics in logs: 0"), "{stdout}");
    assert!(stdout.contains("soak: passed"), "{stdout}");

    let v: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let tables = v["experiments"].as_array().unwrap();
    let table = |name: &str| -> &Vec<Value> {
        tables
            .iter()
            .find(|t| t["experiment"] == name)
            .unwrap_or_else(|| panic!("no table {name}"))["rows"]
            .as_array()
            .unwrap()
    };
    // every fault kind happened, and was carried out (a `done at` time)
    let faults = table("soak-faults");
    for kind in [
        "SIGKILL agent A",
        "SIGKILL agent B",
        "SIGSTOP agent",
        "SIGKILL redis",
        "restart dispatcher A",
        "attack idle-hello",
        "attack slowloris",
        "attack garbage",
        "attack half-open",
    ] {
        let row = faults
            .iter()
            .find(|r| r["fault"].as_str().unwrap().starts_with(kind))
            .unwrap_or_else(|| panic!("no {kind} in {faults:#?}"));
        assert!(row["done"].is_number(), "{kind} not carried out: {row}");
    }
    // both sides served, nothing unexplained
    let requests = table("soak");
    assert_eq!(requests.len(), 2, "{requests:#?}");
    for r in requests {
        assert_eq!(r["unexplained"], 0, "{r}");
        assert!(r["ok"].as_u64().unwrap() > 1000, "{r}");
        assert_eq!(
            r["sent"].as_u64().unwrap(),
            r["ok"].as_u64().unwrap() + r["failed"].as_u64().unwrap(),
            "{r}"
        );
    }
    // every listener flooded, and its legitimate peer served meanwhile
    let listeners = table("soak-listeners");
    let names: Vec<&str> = listeners
        .iter()
        .map(|l| l["listener"].as_str().unwrap())
        .collect();
    let mut want = vec![
        "dispatcher".to_string(),
        "metrics dispatcher".into(),
        "admin".into(),
        "haproxy".into(),
    ];
    for side in ["A", "B"] {
        for i in 0..3 {
            for kind in ["tls", "link", "metrics"] {
                want.push(format!("{kind} {side}{i}"));
            }
        }
    }
    want.extend((0..3).map(|i| format!("peer B{i}")));
    for w in &want {
        assert!(names.contains(&w.as_str()), "no listener {w} in {names:?}");
    }
    for l in listeners {
        let name = l["listener"].as_str().unwrap();
        assert_eq!(l["verdict"], "ok", "{l}");
        assert_eq!(l["unexplained"], 0, "{l}");
        // a flood: more connections in all than the slots a listener keeps for strangers (16
        // for admin, 256 for metrics, 64 for a link); how many were open at once is the
        // server's doing (a listener that closes garbage at once never holds many)
        assert!(l["opened"].as_u64().unwrap() > 256, "{l}");
        if l["peer"] != "-" {
            assert!(
                l["ok"].as_u64().unwrap() > 30,
                "{name}: its peer barely served: {l}"
            );
        }
    }
    // every process was sampled and ended within its tolerances
    let procs = table("soak-processes");
    assert_eq!(procs.len(), 9, "{procs:#?}");
    assert!(procs.iter().all(|p| p["verdict"] == "ok"), "{procs:#?}");
    if Path::new(&dir).exists() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}
