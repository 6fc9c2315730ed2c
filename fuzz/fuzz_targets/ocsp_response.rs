#![no_main]
// An OCSP responder's answer is untrusted input: the stapling check must refuse, not panic.
libfuzzer_sys::fuzz_target!(|data: &[u8]| baton_agent::ocsp::fuzz(data));
