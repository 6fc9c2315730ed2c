//! The runtime a server process (agent, dispatcher) runs on, by its `--workers`.

/// One worker: a current-thread runtime, whose tasks run on the thread that blocks on the
/// server. A one-worker multi-thread runtime would run them on a second thread, with work
/// queues and cross-thread wake-ups for nothing: measured 2-4 % more CPU per agent handshake
/// (docs/measurements.md), and for the dispatcher a link's frames from several clients no longer
/// leave in one write. More workers: one multi-thread runtime (per-core
/// current-thread runtimes with `SO_REUSEPORT` listeners measured no better for the agent).
pub fn for_workers(workers: usize, name: &str) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = if workers <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(workers);
        b
    };
    builder.thread_name(name).enable_all().build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_worker_is_the_calling_thread_more_are_a_pool() {
        let one = for_workers(1, "t").unwrap();
        let caller = std::thread::current().id();
        assert_eq!(one.block_on(async { std::thread::current().id() }), caller);
        assert_eq!(one.metrics().num_workers(), 1);
        let two = for_workers(2, "t").unwrap();
        assert_eq!(two.metrics().num_workers(), 2);
    }
}
