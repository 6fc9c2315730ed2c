#!/usr/bin/env python3
"""Helper for scripts/bench-handoff: snapshots of a `baton up` cluster and the tables.

  handoff_bench.py snap STATE.json DISPATCHER_PID OUT.json
      CPU seconds of every agent and of the dispatcher (each thread's time on the CPU from
      /proc/PID/task/TID/schedstat, in nanoseconds, and utime + stime from /proc/PID/stat, in
      clock ticks, for when a thread ended between two snapshots), and every Prometheus series
      of their /metrics, into one JSON file.
  handoff_bench.py scenario-a DIR
      the Scenario A table from DIR/a-*.{before,after,bench,case}.json
  handoff_bench.py cost DIR
      migration CPU and latency from DIR/b-*-{handoff,least-conn}.* (alternating rounds)
  handoff_bench.py homes N IP...
      the dispatcher's home agent of each IP (FNV-1a of the address bytes mod N, as in
      crates/dispatch/src/route.rs)

Nothing here is assumed from the client: handshakes, migrations and failures are the agents'
and the dispatcher's own counters, differences of a snapshot after and before each run.
"""
import ipaddress
import json
import math
import os
import re
import statistics
import sys
import time
import urllib.request

HZ = os.sysconf("SC_CLK_TCK")
SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?)\s+(\S+)")


def proc_cpu(pid):
    with open(f"/proc/{pid}/stat") as f:
        # the command name may hold spaces: fields start after the last ')'
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ  # utime, stime (fields 14, 15)


def task_cpu(pid):
    """{tid: nanoseconds on the CPU} of every thread of `pid`. The tick-based utime + stime
    quantise to 10 ms per process and are sampled: over a run of about a second, tens of
    microseconds per migration of noise that schedstat does not have."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                out[tid] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # the thread ended meanwhile
    return out


def cpu_delta(b, a):
    """CPU seconds between two snapshots of one process: schedstat's when every thread of the
    first is still there in the second (a thread born meanwhile counts from zero), else the
    ticks of /proc/PID/stat (a thread's time leaves schedstat with it)."""
    bt, at = b.get("tasks"), a.get("tasks")
    if bt is not None and at is not None and set(bt) <= set(at):
        return sum(ns - bt.get(tid, 0) for tid, ns in at.items()) / 1e9
    return a["cpu"] - b["cpu"]


# Series names of builds before the renames (CHANGELOG.md), read under today's names, so a
# BATON_BEFORE binary from before them is measured like this one.
OLD_NAMES = (("baton_handoff_", "baton_migration_"),
             ("baton_dispatch_handoffs_total", "baton_dispatch_migrations_total"))


def metrics(addr):
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = SERIES.match(line)
        if m and not line.startswith("#"):
            name = m.group(1)
            for old, new in OLD_NAMES:
                if name.startswith(old):
                    name = new + name[len(old):]
            try:
                out[name] = float(m.group(2))
            except ValueError:
                pass
    return out


def snap(state_file, dispatcher_pid, out_file):
    state = json.load(open(state_file))
    snapshot = {
        "t": time.monotonic(),
        "agents": [
            {
                "pid": a["pid"],
                "cpu": proc_cpu(a["pid"]),
                "tasks": task_cpu(a["pid"]),
                "m": metrics(a["metrics"]),
            }
            for a in state["agents"]
        ],
        "dispatcher": {
            "pid": int(dispatcher_pid),
            "cpu": proc_cpu(dispatcher_pid),
            "tasks": task_cpu(dispatcher_pid),
            "m": metrics(state["dispatcher_metrics"]),
        },
    }
    json.dump(snapshot, open(out_file, "w"))


# --- differences of snapshots ------------------------------------------------------------


def delta(before, after):
    """Per process: CPU seconds and every series' increase."""
    def one(b, a):
        return {
            "cpu": cpu_delta(b, a),
            "m": {k: v - b["m"].get(k, 0.0) for k, v in a["m"].items()},
        }
    return {
        "wall": after["t"] - before["t"],
        "agents": [one(b, a) for b, a in zip(before["agents"], after["agents"])],
        "dispatcher": one(before["dispatcher"], after["dispatcher"]),
    }


def total(m, name, **labels):
    """Sum of the series of family `name` whose labels include `labels`."""
    s = 0.0
    for k, v in m.items():
        fam, _, rest = k.partition("{")
        if fam != name:
            continue
        if all(f'{lk}="{lv}"' in rest for lk, lv in labels.items()):
            s += v
    return s


def labelled(m, name, label):
    """{label value: count} of family `name`."""
    out = {}
    for k, v in m.items():
        fam, _, rest = k.partition("{")
        if fam == name:
            mm = re.search(label + r'="([^"]*)"', rest)
            if mm:
                out[mm.group(1)] = out.get(mm.group(1), 0.0) + v
    return out


def fulls(agent):
    return total(agent["m"], "baton_handshakes_total", kind="full")


def migrated(agent, direction):
    return total(agent["m"], "baton_sessions_migrated_total", direction=direction)


def failures(agent):
    return {k: v for k, v in labelled(agent["m"], "baton_migration_failures_total", "reason").items() if v}


def buckets(d):
    """baton_migration_seconds buckets summed over the agents: [(le, cumulative count)]."""
    acc = {}
    for a in d["agents"]:
        for le, v in labelled(a["m"], "baton_migration_seconds_bucket", "le").items():
            acc[le] = acc.get(le, 0.0) + v
    return sorted(((math.inf if le == "+Inf" else float(le), c) for le, c in acc.items()))


def histogram_quantile(q, bs):
    """Prometheus' histogram_quantile: linear interpolation inside the bucket holding rank q*n
    (the lowest bucket from 0; a rank in +Inf answers the highest finite bound)."""
    if not bs or bs[-1][1] <= 0:
        return float("nan")
    n = bs[-1][1]
    rank = q * n
    prev_le, prev_c = 0.0, 0.0
    for le, c in bs:
        if c >= rank:
            if math.isinf(le):
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le


def load(path):
    return json.load(open(path))


def fmt_us(s):
    return f"{s * 1e6:8.1f} us" if s == s else "     n/a"


# --- scenario A ---------------------------------------------------------------------------


def scenario_a(d):
    rows = []
    for name in ("handoff", "client-ip", "one-agent"):
        p = os.path.join(d, f"a-{name}")
        if not os.path.exists(p + ".bench.json"):
            continue
        case, bench = load(p + ".case.json"), load(p + ".bench.json")
        dl = delta(load(p + ".before.json"), load(p + ".after.json"))
        rows.append((name, case, bench, dl))
    single = next((b["tps"] for n, _, b, _ in rows if n == "one-agent"), None)
    print(f"{'config':<11} {'TPS':>7} {'failed':>6}  {'full handshakes per agent':<26} {'spread':>6} "
          f"{'migrated':>8} {'ratio':>6}")
    for name, case, bench, dl in rows:
        f = [fulls(a) for a in dl["agents"]]
        spread = (max(f) - min(f)) / (sum(f) / len(f)) * 100 if len(f) > 1 and sum(f) else 0.0
        moved = sum(migrated(a, "out") for a in dl["agents"])
        failed = bench_failed(bench)
        ratio = f"{bench['tps'] / single:.2f}x" if single else "n/a"
        print(f"{name:<11} {bench['tps']:7.1f} {failed:6d}  {' / '.join(f'{x:.0f}' for x in f):<26} "
              f"{spread:5.1f}% {moved:8.0f} {ratio:>6}")
    tps = {n: b["tps"] for n, _, b, _ in rows}
    if "handoff" in tps and "client-ip" in tps:
        print(f"handoff / client-ip throughput: {tps['handoff'] / tps['client-ip']:.2f}x  "
              f"(paper Scenario A: 223.4 / 179.5 = 1.24x; one server 100.5)")
    print()
    print("CPU during each timed run (seconds of CPU / seconds of wall, from /proc; cap per agent "
          "as configured):")
    for name, case, bench, dl in rows:
        wall = bench.get("duration_s") or dl["wall"]
        agents = "  ".join(f"agent{i} {a['cpu']:.2f}s ({a['cpu'] / wall * 100:.0f}%)"
                           for i, a in enumerate(dl["agents"]))
        d_cpu = dl["dispatcher"]["cpu"]
        c_cpu = bench.get("client_cpu_s", float("nan"))
        thr = case.get("throttled")
        thr_s = f"  throttled periods {'/'.join(str(t) for t in thr)}" if thr else ""
        print(f"  {name:<10} wall {wall:5.2f}s  {agents}  dispatcher {d_cpu:.2f}s "
              f"({d_cpu / wall * 100:.0f}%)  client {c_cpu:.2f}s ({c_cpu / wall * 100:.0f}%){thr_s}")
    print()
    for name, case, bench, dl in rows:
        homes = labelled(dl["dispatcher"]["m"], "baton_dispatch_connections_total", "agent")
        reasons = labelled(dl["dispatcher"]["m"], "baton_dispatch_connections_total", "reason")
        outcomes = {k: int(v) for k, v in
                    labelled(dl["dispatcher"]["m"], "baton_dispatch_migrations_total", "outcome").items() if v}
        fails = {}
        for a in dl["agents"]:
            for k, v in failures(a).items():
                fails[k] = fails.get(k, 0) + int(v)
        routed = " ".join(f"agent{k}={v:.0f}" for k, v in sorted(homes.items()) if v)
        why = " ".join(f"{k}={v:.0f}" for k, v in sorted(reasons.items()) if v)
        errs = bench_errors(bench)
        print(f"  {name:<10} dispatcher routed {routed} ({why}); handoffs {outcomes or '-'}; "
              f"agent handoff failures {fails or 0}; bench errors {errs or 0}")
    for name, case, bench, dl in rows:
        moved = sum(migrated(a, "out") for a in dl["agents"])
        if moved and bench_failed(bench):
            print(f"  WARNING {name}: {bench_failed(bench)} of {bench['connections']} connections failed "
                  f"({moved:.0f} migrated; bench errors {bench_errors(bench)}, e.g. "
                  f"{bench.get('error_examples')}); its TPS is not a throughput figure")


def bench_failed(bench):
    """Connections without a good response (one request per connection)."""
    return int(bench.get("connections", 0)) - int(bench.get("requests", {}).get("ok", 0))


def bench_errors(bench):
    e = bench.get("errors", {})
    if isinstance(e, dict):
        return {k: v for k, v in e.items() if isinstance(v, (int, float)) and v}
    return e


# --- migration cost and latency -----------------------------------------------------------


def pooled_cost(rounds):
    """The extra CPU of the agents and the dispatcher per migration over all `rounds`, as a
    fraction of the agents' CPU per full handshake under least-conn; with the two figures it is
    made of (seconds). (None, 0, 0) when nothing migrated."""
    moved = sum(r["handoff"]["moved"] for r in rounds)
    full_l = sum(r["least-conn"]["full"] for r in rounds)
    per_full = sum(r["least-conn"]["acpu"] for r in rounds) / full_l if full_l else 0
    extra = 0.0
    for r in rounds:
        h, l = r["handoff"], r["least-conn"]
        extra += (h["acpu"] / h["full"] - l["acpu"] / l["full"]) * h["full"]
        extra += (h["dcpu"] / h["conns"] - l["dcpu"] / l["conns"]) * h["conns"]
    if not moved or not per_full:
        return None, 0, 0
    return extra / moved / per_full, extra / moved, per_full


def cost(d):
    runs = {"handoff": [], "least-conn": []}
    for f in sorted(os.listdir(d)):
        m = re.match(r"b-(\d+)-(handoff|least-conn)\.bench\.json$", f)
        if not m:
            continue
        p = os.path.join(d, f"b-{m.group(1)}-{m.group(2)}")
        runs[m.group(2)].append((load(p + ".bench.json"), delta(load(p + ".before.json"), load(p + ".after.json"))))
    if not runs["handoff"] or not runs["least-conn"]:
        print("missing runs")
        return
    print(f"{'round':<6} {'policy':<11} {'conns':>6} {'full':>6} {'migrated':>8} {'agent CPU':>10} "
          f"{'agent/conn':>11} {'disp/conn':>11} {'client/conn':>11} {'TPS':>7} {'failed':>6}")
    per_round = []
    for i, (h, l) in enumerate(zip(runs["handoff"], runs["least-conn"])):
        row = {}
        for name, (bench, dl) in (("least-conn", l), ("handoff", h)):
            full = sum(fulls(a) for a in dl["agents"])
            moved = sum(migrated(a, "out") for a in dl["agents"])
            moved_in = sum(migrated(a, "in") for a in dl["agents"])
            acpu = sum(a["cpu"] for a in dl["agents"])
            conns = bench["handshakes"].get("full", 0) + bench["handshakes"].get("resumed", 0)
            dcpu = dl["dispatcher"]["cpu"]
            ccpu = bench.get("client_cpu_s", float("nan"))
            exp = sum(total(a["m"], "baton_migration_cpu_seconds_total", side="export") for a in dl["agents"])
            imp = sum(total(a["m"], "baton_migration_cpu_seconds_total", side="import") for a in dl["agents"])
            has_cpu_metric = any("baton_migration_cpu_seconds_total" in k for a in dl["agents"] for k in a["m"])
            row[name] = dict(full=full, moved=moved, moved_in=moved_in, acpu=acpu, conns=conns,
                             dcpu=dcpu, ccpu=ccpu, exp=exp, imp=imp, has=has_cpu_metric,
                             failed=bench_failed(bench), tps=bench["tps"], bench=bench, dl=dl)
            print(f"{i + 1:<6} {name:<11} {conns:6d} {full:6.0f} {moved:8.0f} {acpu:9.2f}s "
                  f"{fmt_us(acpu / full)} {fmt_us(dcpu / conns)} {fmt_us(ccpu / conns)} "
                  f"{bench['tps']:7.1f} {row[name]['failed']:6d}")
        per_round.append(row)
    print()
    mig, frac, exps, imps, per_full_l = [], [], [], [], []
    for row in per_round:
        h, l = row["handoff"], row["least-conn"]
        per_full = l["acpu"] / l["full"]
        extra = (h["acpu"] / h["full"] - per_full) * h["full"]  # extra agent CPU for the same count
        per_mig = extra / h["moved"] if h["moved"] else float("nan")
        mig.append(per_mig)
        frac.append(per_mig / per_full)
        per_full_l.append(per_full)
        if h["has"] and h["moved"]:
            exps.append(h["exp"] / h["moved"])
            imps.append(h["imp"] / h["moved"])
    med = statistics.median
    print("Migration cost (2 agents, uncapped; TLS 1.3 default suite, ECDSA P-256; one 1 KiB GET "
          "per connection, --resume none):")
    print(f"  agent CPU per full handshake (least-conn)   {fmt_us(med(per_full_l))}   "
          f"rounds: {', '.join(f'{x * 1e6:.0f}' for x in per_full_l)} us")
    print(f"  migration CPU per migration (difference)    {fmt_us(med(mig))}   "
          f"rounds: {', '.join(f'{x * 1e6:.1f}' for x in mig)} us")
    print(f"    = fraction of a full handshake            {med(frac) * 100:8.1f} %    "
          f"rounds: {', '.join(f'{x * 100:.1f}' for x in frac)} %")
    print("    (sum of both agents' CPU-seconds from /proc, handoff minus least-conn scaled to the same "
          "number of full handshakes, over the migrations the agents counted)")
    if exps:
        e, i_ = med(exps), med(imps)
        print(f"  baton_migration_cpu_seconds_total per migration: export {fmt_us(e)}  import {fmt_us(i_)}  "
              f"sum {fmt_us(e + i_)} = {(e + i_) / med(per_full_l) * 100:.2f} % of a full handshake")
        sums = [x + y for x, y in zip(exps, imps)]
        print(f"    export + import, rounds: {', '.join(f'{x * 1e6:.1f}' for x in sums)} us "
              f"(median {med(sums) * 1e6:.1f}, {min(sums) * 1e6:.1f}..{max(sums) * 1e6:.1f})")
    else:
        print("  baton_migration_cpu_seconds_total: not exposed by these agents")
    for name in ("least-conn", "handoff"):
        vals = [r[name]["dcpu"] / r[name]["conns"] for r in per_round]
        print(f"  dispatcher CPU per connection, {name:<11}  {fmt_us(med(vals))}   "
              f"rounds: {', '.join(f'{x * 1e6:.1f}' for x in vals)} us")
    dh = med([r["handoff"]["dcpu"] / r["handoff"]["conns"] for r in per_round])
    dl_ = med([r["least-conn"]["dcpu"] / r["least-conn"]["conns"] for r in per_round])
    mfrac = med([r["handoff"]["moved"] / r["handoff"]["conns"] for r in per_round])
    if mfrac:
        print(f"  dispatcher extra CPU per migration          {fmt_us((dh - dl_) / mfrac)}")
    # The figure: agents and dispatcher together, per migration, per round.
    both = []
    for row in per_round:
        h, l = row["handoff"], row["least-conn"]
        if not h["moved"]:
            continue
        per_full = l["acpu"] / l["full"]
        agents = (h["acpu"] / h["full"] - per_full) * h["full"]
        disp = (h["dcpu"] / h["conns"] - l["dcpu"] / l["conns"]) * h["conns"]
        both.append((agents + disp) / h["moved"] / per_full)
    if both:
        print(f"  agents + dispatcher extra CPU per migration  {med(both) * 100:7.1f} % of a full handshake   "
              f"rounds: {', '.join(f'{x * 100:.1f}' for x in both)} %  (range {min(both) * 100:.1f}-"
              f"{max(both) * 100:.1f}; a single round is the difference of two large totals and spreads widely)")
        # All rounds pooled: the extra CPU summed over the rounds, over all their migrations,
        # against the handshake cost of all least-conn rounds. A round's figure is the small
        # difference of two large totals; pooled, what the machine's drift adds to one round
        # and takes from the next cancels.
        pooled, extra_us, per_full = pooled_cost(per_round)
        if pooled is not None:
            print(f"    pooled over the {len(per_round)} rounds              {pooled * 100:7.1f} % "
                  f"({fmt_us(extra_us).strip()} per migration, {fmt_us(per_full).strip()} per full handshake)")
            # How far the pooled figure itself can be trusted: its jackknife standard error
            # (the pooled figure again without each round in turn). A run's pooled figure
            # falls within about two of these of the cost it measures.
            n = len(per_round)
            if n >= 3:
                leave_one = [pooled_cost(per_round[:i] + per_round[i + 1:])[0] for i in range(n)]
                leave_one = [x for x in leave_one if x is not None]
                if len(leave_one) == n:
                    mean = sum(leave_one) / n
                    se = ((n - 1) / n * sum((x - mean) ** 2 for x in leave_one)) ** 0.5
                    print(f"      standard error (jackknife over the rounds) {se * 100:5.1f} points; "
                          f"goal: the pooled figure <= 25 %")
    print(f"  connections migrated                        {mfrac * 100:8.1f} %  "
          f"(the others' handshake ran on their home agent already)")
    fails = {}
    for r in per_round:
        for a in r["handoff"]["dl"]["agents"]:
            for k, v in failures(a).items():
                fails[k] = fails.get(k, 0) + int(v)
    print(f"  handoff failures (agents' counters, all rounds): {fails or 0}")
    bad = sum(r["handoff"]["failed"] for r in per_round)
    if bad:
        print(f"  WARNING: {bad} handoff-run connections failed on the client (see the table); their "
              f"handshake and migration still ran, their response did not, and the bench latency "
              f"below counts only the successful ones")
    print()
    print("Migration latency:")
    # the histogram of all handoff rounds together
    acc = {}
    for r in per_round:
        for le, c in buckets(r["handoff"]["dl"]):
            acc[le] = acc.get(le, 0.0) + c
    bs = sorted(acc.items())
    n = bs[-1][1] if bs else 0
    s = sum(total(a["m"], "baton_migration_seconds_sum") for r in per_round for a in r["handoff"]["dl"]["agents"])
    bounds = ", ".join(f"{le * 1e3:g}" for le, _ in bs if not math.isinf(le))
    print(f"  baton_migration_seconds (freeze request -> verdict), {n:.0f} migrations, bucket-interpolated "
          f"like histogram_quantile (bounds ms: {bounds}):")
    print(f"    p50 {histogram_quantile(0.5, bs) * 1e3:.3f} ms   p99 {histogram_quantile(0.99, bs) * 1e3:.3f} ms"
          f"   mean {s / n * 1e3 if n else float('nan'):.3f} ms (exact, from _sum/_count)")
    print("  baton bench, per connection (connect + handshake + request + response), all rounds' median:")
    for name in ("least-conn", "handoff"):
        lat = [r[name]["bench"]["latency_ms"] for r in per_round]
        def m(phase, q):
            return med([x[phase][q] for x in lat])
        print(f"    {name:<11} total p50 {m('total', 'p50'):6.2f} ms  p99 {m('total', 'p99'):6.2f} ms   "
              f"handshake p50 {m('handshake', 'p50'):6.2f} ms  p99 {m('handshake', 'p99'):6.2f} ms   "
              f"ttfb p50 {m('ttfb', 'p50'):6.2f} ms  p99 {m('ttfb', 'p99'):6.2f} ms")


def fnv1a(bs):
    h = 0xCBF29CE484222325
    for b in bs:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def homes(n, ips):
    return " ".join(f"{ip}->agent{fnv1a(ipaddress.ip_address(ip).packed) % int(n)}" for ip in ips)


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "snap":
        snap(*args)
    elif cmd == "scenario-a":
        scenario_a(args[0])
    elif cmd == "cost":
        cost(args[0])
    elif cmd == "homes":
        print(homes(args[0], args[1:]))
    elif cmd == "quantile":  # quantile Q le=count... (self-check)
        bs = sorted((math.inf if k == "+Inf" else float(k), float(v)) for k, v in (a.split("=") for a in args[1:]))
        print(histogram_quantile(float(args[0]), bs))
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
