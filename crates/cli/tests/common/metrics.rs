//! Reading a `/metrics` page, with the one scraper (`baton_bench::scrape`).

use std::net::SocketAddr;

use baton_bench::scrape;

/// The metrics page at `addr` (it must answer 200).
pub fn metrics_page(addr: SocketAddr) -> String {
    scrape::page_blocking(addr).unwrap_or_else(|e| panic!("{e:#}"))
}

/// The value of one series of `page`, `name{labels}` exactly as rendered.
pub fn series_value(page: &str, series: &str) -> f64 {
    scrape::samples(page)
        .iter()
        .find(|s| s.key == series)
        .map(|s| s.value)
        .unwrap_or_else(|| panic!("no metric {series} in\n{page}"))
}

/// The sum of the series of `page` whose `name{labels}` starts with `prefix` and contains
/// `filter`.
pub fn series_sum(page: &str, prefix: &str, filter: &str) -> f64 {
    scrape::samples(page)
        .iter()
        .filter(|s| s.key.starts_with(prefix) && s.key.contains(filter))
        .map(|s| s.value)
        .sum()
}
